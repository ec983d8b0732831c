-- Spec §3 (dedup), §5 (ack signals), §7 (dead-letter queue), as the seed tells them.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN EXECUTE q; RETURN 'no error';
EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE || ': ' || SQLERRM; END $$;
-- Only the SQLSTATE, for errors whose message names a generated id.
CREATE FUNCTION pg_temp.code(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN EXECUTE q; RETURN 'no error';
EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE; END $$;
-- The lane of queue q (default group), as the operator would look at it.
CREATE FUNCTION pg_temp.lane(q text) RETURNS TABLE (committed bigint, leased bool, batch_end bigint, retries int, attempts int)
LANGUAGE sql AS $$
  SELECT s.committed, s.lease_id IS NOT NULL, s.batch_end, s.retry_count, s.attempt_count
    FROM queen.status(q) s WHERE s.consumer_group = '__QUEUE_MODE__' $$;
-- Pop the whole span of q under a lease into temp table cur; show offsets and attempt.
CREATE FUNCTION pg_temp.take(q text) RETURNS TABLE (msg_offset bigint, attempt int) LANGUAGE plpgsql
SET client_min_messages = warning AS $$
BEGIN
  DROP TABLE IF EXISTS cur;
  CREATE TEMP TABLE cur AS SELECT * FROM queen.pop(q, batch => 100);
  RETURN QUERY SELECT c.msg_offset, c.attempt FROM cur c ORDER BY 1;
END $$;
-- Ack items (each {"offset", "status"?}) of the current span in one JSON-form call; show
-- each item's success and error, and the lane's report.
CREATE FUNCTION pg_temp.ack_items(items jsonb) RETURNS TABLE (success jsonb, errors jsonb, lane jsonb)
LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY
    SELECT jsonb_path_query_array(r, '$.items[*].success'), jsonb_path_query_array(r, '$.items[*].error'),
           (r -> 'lanes' -> 0) - 'partitionId'
      FROM (SELECT queen.ack(c.lease_id,
                             (SELECT jsonb_agg(i.item || jsonb_build_object('partitionId', c.partition_id) ORDER BY i.n)
                                FROM jsonb_array_elements(items) WITH ORDINALITY AS i(item, n))) AS r
              FROM cur c LIMIT 1) s;
END $$;
-- Ack one offset of the current span with a status and an error.
CREATE FUNCTION pg_temp.nack(off int, st text, e text DEFAULT NULL) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  RETURN (SELECT queen.ack(lease_id, partition_id, off, st, e) FROM cur LIMIT 1);
END $$;

-- "Three retries": retry_limit 3; three failed acks redeliver the same span, the fourth
-- dead-letters the head message with retry_count 3 and the fourth nack's error.
SELECT queen.configure('three', retry_limit => 3) ->> 'retryLimit' AS retry_limit;
SELECT count(*) FROM queen.push_batch('[{"queue": "three", "payload": {"n": 1}, "transactionId": "t1"},
                                        {"queue": "three", "payload": {"n": 2}, "transactionId": "t2"}]');
SELECT * FROM pg_temp.take('three');
SELECT (pg_temp.nack(1, 'failed', 'boom 1') -> 'lanes' -> 0) - 'partitionId' AS lane;
SELECT * FROM pg_temp.take('three');
SELECT (pg_temp.nack(1, 'failed', 'boom 2') -> 'lanes' -> 0) - 'partitionId' AS lane;
SELECT * FROM pg_temp.take('three');
SELECT (pg_temp.nack(1, 'failed', 'boom 3') -> 'lanes' -> 0) - 'partitionId' AS lane;
SELECT * FROM pg_temp.lane('three');
SELECT * FROM pg_temp.take('three');
SELECT (r -> 'items' -> 0) - 'partitionId' AS item, (r -> 'lanes' -> 0) - 'partitionId' AS lane
  FROM (SELECT pg_temp.nack(1, 'failed', 'boom 4') AS r) s;
SELECT * FROM pg_temp.lane('three');
SELECT transaction_id, queue, partition, consumer_group, error_message, retry_count, data,
       created_at = failed_at AS same_times, producer_sub
  FROM queen.dlq('three');
-- The lane's next pop starts after the dead-lettered message.
SELECT * FROM pg_temp.take('three');

-- The budget is the lane's: failures on different messages share it; a clean batch resets it.
SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'shared', 'payload', i)) FROM generate_series(1, 4) i));
SELECT * FROM pg_temp.take('shared');
SELECT pg_temp.nack(2, 'failed') -> 'lanes' -> 0 -> 'retryCount' AS retries;
SELECT * FROM pg_temp.take('shared');
SELECT pg_temp.nack(3, 'failed') -> 'lanes' -> 0 -> 'retryCount' AS retries;
SELECT * FROM pg_temp.lane('shared');
SELECT * FROM pg_temp.take('shared');
SELECT queen.ack(lease_id) -> 'lanes' -> 0 -> 'retryCount' AS after_clean_batch FROM cur LIMIT 1;

-- retry never charges; expiry never charges and never dead-letters.
SELECT count(*) FROM queen.push('free', '"x"');
SELECT * FROM pg_temp.take('free');
SELECT (pg_temp.nack(1, 'retry') -> 'lanes' -> 0) - 'partitionId' AS lane;
SELECT * FROM pg_temp.take('free');
-- (Every live lease expires: this queue's and the ones the tests above left.)
SELECT sum(queen._expire_lease(lease_id)) AS expired_lanes
  FROM (SELECT DISTINCT lease_id FROM queen.status() WHERE lease_id IS NOT NULL) l;
SELECT * FROM pg_temp.take('free');
SELECT * FROM pg_temp.lane('free');
SELECT count(*) AS dead_letters FROM queen.dlq('free');

-- [completed 11, completed 12, failed 14, completed 15] on span 11..16: commits 13,
-- charges once, leaves 15 unapplied.
SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'span', 'payload', i)) FROM generate_series(1, 16) i));
SELECT count(*) FROM queen.pop('span', batch => 10, auto_ack => true);
SELECT min(msg_offset), max(msg_offset) FROM pg_temp.take('span');
SELECT * FROM pg_temp.ack_items('[{"offset": 11, "status": "completed"}, {"offset": 12},
                                   {"offset": 14, "status": "failed"}, {"offset": 15, "status": "completed"}]');
SELECT * FROM pg_temp.lane('span');
-- [completed 14, failed 14]: the signal decides; the completion of the same message is
-- reported as not applied, and 14 comes again.
SELECT min(msg_offset), max(msg_offset) FROM pg_temp.take('span');
SELECT * FROM pg_temp.ack_items('[{"offset": 14, "status": "completed"}, {"offset": 14, "status": "failed"}]');
SELECT min(msg_offset), max(msg_offset) FROM pg_temp.take('span');
SELECT queen.ack(lease_id) -> 'lanes' -> 0 ->> 'committed' AS committed FROM cur LIMIT 1;

-- dlq with budget left dead-letters at once; the error chain: E's error, another item's, 'Retries exhausted'.
SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'chain', 'payload', i)) FROM generate_series(1, 3) i));
SELECT * FROM pg_temp.take('chain');
SELECT (pg_temp.nack(1, 'dlq', 'poison') -> 'items' -> 0) - 'partitionId' AS item;
SELECT * FROM pg_temp.take('chain');
SELECT queen.ack(lease_id, jsonb_build_array(
         jsonb_build_object('partitionId', partition_id, 'offset', 2, 'status', 'dlq'),
         jsonb_build_object('partitionId', partition_id, 'offset', 3, 'status', 'failed', 'error', 'from another item'))) -> 'items' -> 0 ->> 'error' AS recorded
  FROM cur LIMIT 1;
SELECT * FROM pg_temp.take('chain');
SELECT pg_temp.nack(3, 'dlq') -> 'items' -> 0 ->> 'error' AS recorded;
SELECT data, error_message, retry_count FROM queen.dlq('chain') ORDER BY data;

-- Both switches off: an exhausted failed drops the message; the next pop starts after it.
SELECT queen.configure('drop', retry_limit => 0, dead_letter_queue => false, dlq_after_max_retries => false) ->> 'retryLimit';
SELECT count(*) FROM queen.push_batch('[{"queue": "drop", "payload": 1}, {"queue": "drop", "payload": 2}]');
SELECT * FROM pg_temp.take('drop');
SELECT (r -> 'items' -> 0) - 'partitionId' AS item, (r -> 'lanes' -> 0) - 'partitionId' AS lane
  FROM (SELECT pg_temp.nack(1, 'failed', 'gone') AS r) s;
SELECT * FROM pg_temp.take('drop');
SELECT count(*) AS dead_letters FROM queen.dlq('drop');
-- One switch on is enough for dead-lettering.
SELECT queen.configure('one', retry_limit => 0, dead_letter_queue => false) ->> 'dlqAfterMaxRetries';
SELECT count(*) FROM queen.push('one', '1');
SELECT * FROM pg_temp.take('one');
SELECT pg_temp.nack(1, 'failed') -> 'items' -> 0 -> 'dlq' AS dead_lettered;

-- dlq listing: columns, filters, paging, newest first.
SELECT queue, data FROM queen.dlq();
SELECT queue, data FROM queen.dlq(page_size => 2);
SELECT queue, data FROM queen.dlq(page_size => 2, page_offset => 2);
SELECT count(*) FROM queen.dlq(consumer_group => '__QUEUE_MODE__');
SELECT count(*) FROM queen.dlq(consumer_group => 'nobody');
SELECT pg_temp.err($$SELECT * FROM queen.dlq(page_size => 0)$$);
SELECT pg_temp.err($$SELECT * FROM queen.dlq(page_offset => -1)$$);

-- dlq_replay: a new message at the partition's head with a new transaction id, not a
-- duplicate; the row is gone; a second replay raises P0002.
CREATE TEMP TABLE d AS SELECT * FROM queen.dlq('three');
SELECT r ->> 'replayed' AS replayed, r ->> 'dlqRowRemoved' AS removed, r ->> 'offset' AS msg_offset,
       r ->> 'transactionId' <> 't1' AS new_tx
  FROM (SELECT queen.dlq_replay(partition_id, transaction_id) AS r FROM d) s;
SELECT count(*) AS left_in_dlq FROM queen.dlq('three');
SELECT msg_offset, payload, transaction_id <> 't1' AS new_tx FROM queen.pop('three', batch => 10, auto_ack => true);
SELECT pg_temp.code(format('SELECT queen.dlq_replay(%L, %L)', partition_id, transaction_id)) AS second_replay FROM d;
-- dlq_delete removes a row and nothing else; a live message's address is P0002.
CREATE TEMP TABLE d2 AS SELECT * FROM queen.dlq('chain', page_size => 1);
SELECT queen.dlq_delete(partition_id, transaction_id) ->> 'deleted' AS deleted FROM d2;
SELECT count(*) AS chain_left FROM queen.dlq('chain');
SELECT pg_temp.code(format('SELECT queen.dlq_delete(%L, %L)', partition_id, transaction_id)) AS second_delete FROM d2;
SELECT pg_temp.code(format('SELECT queen.dlq_delete(%L, %L)', p.partition_id, 't2')) AS live_message
  FROM queen.partitions p JOIN queen.queues q USING (queue_id) WHERE q.name = 'three';
SELECT pg_temp.err($$SELECT queen.dlq_delete(NULL, 'x')$$);

-- Dedup window: the same transaction id to the same partition is a duplicate (also
-- within one batch), names the original, stores nothing; other partitions are separate.
SELECT idx, status, msg_offset FROM queen.push('dd', '{"v": 1}', transaction_id => 'order-1');
SELECT idx, status, msg_offset FROM queen.push('dd', '{"v": 2}', transaction_id => 'order-1');
SELECT (SELECT message_id FROM queen.push('dd', '{"v": 3}', transaction_id => 'order-1'))
     = (SELECT message_id FROM queen.push('dd', '{"v": 4}', transaction_id => 'order-1')) AS same_original;
SELECT idx, status, msg_offset FROM queen.push_batch('[
  {"queue": "dd", "payload": 5, "transactionId": "order-2"},
  {"queue": "dd", "payload": 6, "transactionId": "order-2"},
  {"queue": "dd", "payload": 7, "transactionId": "order-1"},
  {"queue": "dd", "payload": 8},
  {"queue": "dd", "partition": "other", "payload": 9, "transactionId": "order-1"}]');
SELECT msg_offset, payload FROM queen.pop('dd', batch => 10, auto_ack => true);
-- After the window it is accepted again (window 1 s here).
SELECT queen.configure('dd', dedup_window => 1) ->> 'dedupWindow';
SELECT pg_sleep(1.1);
SELECT idx, status, msg_offset FROM queen.push('dd', '{"v": 10}', transaction_id => 'order-1');
-- dedup_window 0 turns it off.
SELECT queen.configure('dd', dedup_window => 0) ->> 'dedupWindow';
SELECT idx, status, msg_offset FROM queen.push('dd', '{"v": 11}', transaction_id => 'order-1');
