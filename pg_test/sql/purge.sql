-- purge (docs/functions.md#purge): cursors to the readable end, each span filed as a
-- purged dead-letter row.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN EXECUTE q; RETURN 'no error';
EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE || ': ' || SQLERRM; END $$;

SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'jobs', 'partition', 'p' || (i % 2), 'payload', i)) FROM generate_series(1, 10) i));
SELECT count(*) AS a_took FROM queen.pop('jobs', 'a', batch => 2, auto_ack => true);
SELECT count(*) AS b_took FROM queen.pop('jobs', 'b', batch => 1, auto_ack => true);

-- One group: its cursors go to the ends; the other group is untouched.
SELECT queen.purge('jobs', 'a') - 'lanes' AS result;
SELECT partition, consumer_group, committed, lag FROM queen.status('jobs') ORDER BY 1, 2;
SELECT consumer_group, transaction_id, error_message, data IS NULL AS no_payload FROM queen.dlq('jobs') ORDER BY transaction_id;
SELECT d.msg_offset, d.last_offset FROM queen.log_dlq d ORDER BY 1;
SELECT count(*) AS a_after FROM queen.pop('jobs', 'a', batch => 10, max_partitions => 2, auto_ack => true);
-- New pushes are delivered as usual.
SELECT count(*) FROM queen.push('jobs', '11', partition => 'p0');
SELECT msg_offset FROM queen.pop('jobs', 'a', batch => 10, max_partitions => 2, auto_ack => true);
-- A second purge has nothing left to pass.
SELECT queen.purge('jobs', 'a') - 'lanes' AS nothing;

-- A span row cannot be replayed; it can be deleted.
SELECT pg_temp.err(format($$SELECT queen.dlq_replay(%L, %L)$$, partition_id, transaction_id))
  FROM queen.dlq('jobs', 'a') ORDER BY transaction_id LIMIT 1;
SELECT (queen.dlq_delete(partition_id, transaction_id) ->> 'deleted')::bool FROM queen.dlq('jobs', 'a') ORDER BY transaction_id LIMIT 1;

-- Every group, refused while a lane is leased (nothing purged), then forced.
CREATE TEMP TABLE l AS SELECT * FROM queen.pop('jobs', 'b', batch => 1, lease_seconds => 60);
SELECT pg_temp.err($$SELECT queen.purge('jobs')$$);
SELECT consumer_group, count(*) AS rows FROM queen.dlq('jobs') GROUP BY 1 ORDER BY 1;
SELECT queen.purge('jobs', force => true) - 'lanes' AS forced;
SELECT partition, consumer_group, lag, lease_id IS NULL AS lease_ended FROM queen.status('jobs') ORDER BY 1, 2;
-- The ended lease's ack changes nothing.
SELECT (queen.ack(lease_id, partition_id, msg_offset) -> 'items' -> 0 ->> 'success')::bool AS late_ack FROM l;

-- Bad input changes nothing.
SELECT pg_temp.err($$SELECT queen.purge(NULL)$$);
SELECT pg_temp.err($$SELECT queen.purge('jobs', 'nobody')$$);
SELECT pg_temp.err($$SELECT queen.purge('jobs', '')$$);
SELECT pg_temp.err($$SELECT queen.purge('jobs', force => NULL)$$);
SELECT queen.purge('no_such_queue') AS unknown_queue;
