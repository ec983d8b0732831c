-- Partitions that come and go: queen.drop_partition removes an empty partition (every
-- group consumed it, no live lease, no push in flight, no dead letter, no producer id
-- inside the dedup window) with its segments, lanes and dedup entries; a push to its
-- name afterwards starts a new partition at 1.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE q;
  RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

SELECT queen.drop_partition('cq', 'nowhere') AS unknown_queue;
SELECT count(*) FROM queen.push('cq', '1', 'p1', transaction_id => 'tx-1');
SELECT queen.drop_partition('cq', 'nowhere') AS unknown_partition;
-- No group yet, and a message stored: kept.
SELECT pg_temp.err($$SELECT queen.drop_partition('cq', 'p1')$$);
-- A group that has not consumed it: kept.
SELECT queen.create_group('cq', 'g') ->> 'created' AS created;
SELECT pg_temp.err($$SELECT queen.drop_partition('cq', 'p1')$$);
-- Under a live lease: kept.
CREATE TEMP TABLE l AS SELECT lease_id FROM queen.pop('cq', 'g', partition => 'p1');
SELECT pg_temp.err($$SELECT queen.drop_partition('cq', 'p1')$$);
SELECT (queen.ack(lease_id) -> 'lanes' -> 0 ->> 'committed') AS committed FROM l;
-- Consumed, but its producer id is still inside the queue's dedup window (an hour by
-- default): kept, else a retry of that push would be stored again, in a new partition.
SELECT pg_temp.err($$SELECT queen.drop_partition('cq', 'p1')$$);
SELECT queen.configure('cq', dedup_window => 1) ->> 'dedupWindow' AS dedup_window;
SELECT pg_sleep(1.1);
-- Consumed by every group, the window over: dropped, with its segment, lane and dedup entry.
SELECT queen.drop_partition('cq', 'p1') - 'segments' AS dropped;
SELECT (SELECT count(*) FROM queen.partitions) AS partitions, (SELECT count(*) FROM queen.lanes) AS lanes,
       (SELECT count(*) FROM queen.dedup) AS dedup_entries,
       (SELECT count(*) FROM queen.segments) + (SELECT count(*) FROM queen.fresh_segments) AS segments;
SELECT queen.drop_partition('cq', 'p1') AS again;
-- A push to the name afterwards: a new partition, from offset 1, delivered to g.
SELECT msg_offset FROM queen.push('cq', '2', 'p1', transaction_id => 'tx-1');
SELECT partition, msg_offset, payload FROM queen.pop('cq', 'g', auto_ack => true);
-- A partition with a dead letter is kept (queen.dlq names it), until the letter goes.
SELECT count(*) FROM queen.push('cq', '3', 'p2');
SELECT queen.ack(lease_id, partition_id, msg_offset, 'dlq', 'bad') -> 'items' -> 0 -> 'dlq' AS filed
  FROM queen.pop('cq', 'g', partition => 'p2');
SELECT pg_temp.err($$SELECT queen.drop_partition('cq', 'p2')$$);
SELECT queen.dlq_delete(partition_id, transaction_id) ->> 'deleted' AS deleted
  FROM queen.dlq('cq') WHERE partition = 'p2';
SELECT queen.drop_partition('cq', 'p2') - 'segments' AS dropped;
-- Bad input.
SELECT pg_temp.err($$SELECT queen.drop_partition(NULL, 'p')$$);
SELECT pg_temp.err($$SELECT queen.drop_partition('cq', NULL)$$);
SELECT pg_temp.err($$SELECT queen.drop_partition('cq', 'bad name')$$);
SELECT pg_temp.err($$SELECT queen.configure('cq', partition_idle_ttl => '-1 s')$$);
SELECT pg_temp.err($$SELECT queen.configure('cq', partition_idle_ttl => '1 mon')$$);
SELECT queen.configure('cq', partition_idle_ttl => '1 day') ->> 'partitionIdleTtl' AS ttl;
-- How long dead letters are kept (the worker deletes older ones: tests/tests/churn.rs).
SELECT pg_temp.err($$SELECT queen.configure('cq', dlq_retention => '-1 s')$$);
SELECT pg_temp.err($$SELECT queen.configure('cq', dlq_retention => '366 days')$$);
SELECT pg_temp.err($$SELECT queen.configure('cq', dlq_retention => NULL)$$);
SELECT queen.configure('cq', dlq_retention => '14 days') ->> 'dlqRetention' AS dlq_retention;
