-- Maximum depth and overflow policies (docs/functions.md#configure, #configure_group): a
-- push past max_depth, or past a hold group's max_lag in its partition, is refused and
-- stores nothing; a skip group past its max_lag passes over its oldest messages, filed as
-- one 'skipped' dead letter per partition.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN EXECUTE q; RETURN 'no error';
EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE || ': ' || SQLERRM; END $$;
CREATE FUNCTION pg_temp.stored(q text) RETURNS bigint LANGUAGE sql AS $$
  SELECT messages FROM queen.totals(q) LIMIT 1 $$;

-- Bad input changes nothing.
SELECT pg_temp.err($$SELECT queen.configure('depth', max_depth => 0)$$);
SELECT pg_temp.err($$SELECT queen.configure_group('depth', 'a', max_lag => 0)$$);
SELECT pg_temp.err($$SELECT queen.configure_group('depth', 'a', max_lag => 5, on_overflow => 'drop')$$);
SELECT pg_temp.err($$SELECT queen.configure_group('depth', 'a', on_overflow => 'skip')$$);
SELECT pg_temp.err($$SELECT queen.configure_group('depth', 'a', max_lag => 5, on_overflow => NULL)$$);
SELECT count(*) AS queues FROM queen.queues;

-- Before any group exists, every stored message counts.
SELECT queen.configure('depth', max_depth => 5) -> 'maxDepth' AS max_depth;
SELECT count(*) FROM generate_series(1, 5) i, queen.push('depth', i::text::jsonb);
SELECT pg_temp.err($$SELECT queen.push('depth', '6')$$);
SELECT pg_temp.stored('depth') AS stored;
-- A batch that would pass it is refused whole, across partitions too.
SELECT queen.configure('depth', max_depth => 7) -> 'maxDepth' AS max_depth;
SELECT pg_temp.err($$SELECT queen.push_batch('depth', '[{"payload": 6, "partition": "x"}, {"payload": 7, "partition": "y"}, {"payload": 8, "partition": "z"}]')$$);
SELECT pg_temp.stored('depth') AS stored;
SELECT count(*) FROM queen.push_batch('depth', '[{"payload": 6, "partition": "x"}, {"payload": 7, "partition": "y"}]');
SELECT pg_temp.err($$SELECT queen.push('depth', '8')$$);

-- Once a group exists, the depth is its lag: consuming makes room.
SELECT count(*) AS a_took FROM queen.pop('depth', 'a', batch => 3, auto_ack => true);
SELECT count(*) FROM generate_series(1, 3) i, queen.push('depth', i::text::jsonb);
SELECT pg_temp.err($$SELECT queen.push('depth', '9')$$);
-- A skip group does not count; the slowest hold group does.
SELECT queen.configure_group('depth', 'b', max_lag => 2, on_overflow => 'skip') - 'queue' - 'consumerGroup' AS b;
SELECT pg_temp.err($$SELECT queen.push('depth', '9')$$);
SELECT count(*) AS a_took FROM queen.pop('depth', 'a', batch => 1, auto_ack => true);
SELECT count(*) FROM queen.push('depth', '9');
SELECT queen.configure_group('depth', 'c') ->> 'onOverflow' AS c;
SELECT pg_temp.err($$SELECT queen.push('depth', '10')$$);
-- No max_depth: no limit.
SELECT queen.configure('depth') -> 'maxDepth' AS max_depth;
SELECT count(*) FROM queen.push('depth', '10');

-- A hold group's max_lag, in each partition.
SELECT queen.configure_group('lagq', 'h', max_lag => 3) - 'queue' - 'consumerGroup' AS h;
SELECT count(*) FROM generate_series(1, 3) i, queen.push('lagq', i::text::jsonb, partition => 'p0');
SELECT pg_temp.err($$SELECT queen.push('lagq', '4', partition => 'p0')$$);
SELECT count(*) FROM queen.push('lagq', '4', partition => 'p1');
SELECT msg_offset FROM queen.pop('lagq', 'h', partition => 'p0', batch => 2, auto_ack => true);
SELECT count(*) FROM queen.push('lagq', '5', partition => 'p0');
SELECT partition, consumer_group, lag FROM queen.status('lagq') ORDER BY 1, 2;

-- A skip group passes over its oldest messages (the maintenance pass, or queen.retain).
SELECT queen.configure_group('skipq', 's', max_lag => 3, on_overflow => 'skip') ->> 'onOverflow' AS s;
SELECT count(*) FROM queen.push_batch('skipq', (SELECT jsonb_agg(jsonb_build_object('payload', i, 'partition', 'p' || (i % 2))) FROM generate_series(1, 20) i));
SELECT queen.retain('skipq') ->> 'skipped' AS skipped;
SELECT partition, consumer_group, committed, lag FROM queen.status('skipq') ORDER BY 1, 2;
SELECT l.partition, l.consumer_group, l.reason, l.transaction_id, l.error_message, l.data IS NULL AS no_payload
  FROM queen.dlq('skipq') l ORDER BY 1;
SELECT partition, payload FROM queen.pop('skipq', 's', batch => 10, max_partitions => 2, auto_ack => true) ORDER BY 1, msg_offset;
-- Within its max_lag: nothing moves. A leased lane is left for a later pass.
SELECT queen.retain('skipq') ->> 'skipped' AS nothing;
SELECT count(*) FROM queen.push_batch('skipq', (SELECT jsonb_agg(jsonb_build_object('payload', i, 'partition', 'p0')) FROM generate_series(21, 30) i));
CREATE TEMP TABLE l AS SELECT * FROM queen.pop('skipq', 's', partition => 'p0', batch => 1, lease_seconds => 60);
SELECT queen.retain('skipq') ->> 'skipped' AS leased;
SELECT (queen.ack(lease_id, partition_id, msg_offset) -> 'items' -> 0 ->> 'success')::bool AS acked FROM l;
SELECT queen.retain('skipq') ->> 'skipped' AS skipped;
SELECT payload FROM queen.pop('skipq', 's', partition => 'p0', batch => 10, auto_ack => true) ORDER BY msg_offset;
-- Producers are never refused for a skip group.
SELECT count(*) FROM generate_series(1, 10) i, queen.push('skipq', i::text::jsonb, partition => 'p1');
SELECT reason, count(*) AS spans, sum(d.last_offset - d.msg_offset + 1) AS messages FROM queen.log_dlq d GROUP BY 1;

-- An abandoned skip group holds nothing back: past its max_lag it moves on, and retention
-- deletes what every group has passed.
SELECT queen.configure('ret', retention => 1) ->> 'retention' AS retention;
SELECT queen.configure_group('ret', 'slow', max_lag => 5, on_overflow => 'skip') ->> 'onOverflow' AS slow;
SELECT count(*) FROM generate_series(0, 9) b,
  queen.push_batch('ret', (SELECT jsonb_agg(jsonb_build_object('payload', b * 10 + i)) FROM generate_series(1, 10) i));
SELECT count(*) AS fast_took FROM queen.pop('ret', 'fast', batch => 100, auto_ack => true);
SELECT pg_sleep(1.1);
SELECT r ->> 'skipped' AS skipped, r ->> 'segmentsDeleted' AS deleted FROM queen.retain('ret') r;
SELECT r ->> 'skipped' AS skipped, r ->> 'segmentsDeleted' AS deleted FROM queen.retain('ret') r;
SELECT payload FROM queen.pop('ret', 'slow', batch => 100, auto_ack => true) ORDER BY msg_offset;

-- An abandoned skip group passes over its oldest messages at every round: each lane keeps
-- one 'skipped' row, extended round by round, rather than a row per round. A span that does
-- not follow the row (the group consumed in between) is a row of its own, and so is the
-- span after a dlq_delete of the row.
SELECT queen.configure_group('merge', 'm', max_lag => 2, on_overflow => 'skip') ->> 'onOverflow' AS m;
SELECT count(*) FROM generate_series(1, 5) i, queen.push('merge', i::text::jsonb, partition => 'p' || (i % 2));
SELECT queen.retain('merge') ->> 'skipped' AS round_1;
SELECT count(*) FROM generate_series(6, 9) i, queen.push('merge', i::text::jsonb, partition => 'p' || (i % 2));
SELECT queen.retain('merge') ->> 'skipped' AS round_2;
SELECT count(*) FROM generate_series(10, 13) i, queen.push('merge', i::text::jsonb, partition => 'p' || (i % 2));
SELECT queen.retain('merge') ->> 'skipped' AS round_3;
SELECT partition, transaction_id, error_message FROM queen.dlq('merge') ORDER BY 1, 2;
SELECT payload FROM queen.pop('merge', 'm', partition => 'p0', batch => 1, auto_ack => true);
SELECT count(*) FROM generate_series(14, 21) i, queen.push('merge', i::text::jsonb, partition => 'p0');
SELECT queen.retain('merge') ->> 'skipped' AS after_a_pop;
SELECT queen.dlq_delete(partition_id, transaction_id) ->> 'deleted' AS deleted
  FROM queen.dlq('merge') WHERE partition = 'p1';
SELECT count(*) FROM generate_series(22, 29) i, queen.push('merge', i::text::jsonb, partition => 'p1');
SELECT queen.retain('merge') ->> 'skipped' AS after_a_delete;
SELECT partition, transaction_id FROM queen.dlq('merge') ORDER BY 1, 2;
-- What the rows name is what the group passed over: its next pops deliver the rest.
SELECT partition, payload FROM queen.pop('merge', 'm', batch => 10, max_partitions => 2, auto_ack => true) ORDER BY 1, msg_offset;
-- Each group's spans are its own, and a purge's row is not a skip's: two skip groups on
-- the same lane, one of them purged right before its first skip, keep rows of their own.
SELECT queen.configure_group('merge2', 'x', max_lag => 1, on_overflow => 'skip') ->> 'onOverflow' AS x;
SELECT queen.configure_group('merge2', 'y', max_lag => 1, on_overflow => 'skip') ->> 'onOverflow' AS y;
SELECT count(*) FROM generate_series(1, 3) i, queen.push('merge2', i::text::jsonb);
SELECT queen.purge('merge2', 'y') ->> 'purged' AS purged;
SELECT count(*) FROM generate_series(4, 6) i, queen.push('merge2', i::text::jsonb);
SELECT queen.retain('merge2') ->> 'skipped' AS round_1;
SELECT count(*) FROM generate_series(7, 8) i, queen.push('merge2', i::text::jsonb);
SELECT queen.retain('merge2') ->> 'skipped' AS round_2;
SELECT consumer_group, reason, transaction_id FROM queen.dlq('merge2') ORDER BY 1, 3;
