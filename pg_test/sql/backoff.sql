-- Retry backoff (docs/functions.md, "ack" and "configure"): a failed or retried batch can
-- wait before it is delivered again, by the ack's retry_after or by the queue's
-- retry_backoff (exponential in the batch's failed acks, capped by retry_backoff_max).
-- While the pause runs, the lane (one partition, one consumer group) is not claimable; a
-- long-poll wakes when it ends. Without either, a failed batch comes back at once.
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

-- The default: no pause, redelivered at once.
SELECT count(*) FROM queen.push_batch('[{"queue": "now", "payload": 1}, {"queue": "now", "payload": 2}]');
SELECT queen.ack(lease_id, partition_id, msg_offset, 'failed') -> 'lanes' -> 0 -> 'retryAfter' AS pause
  FROM queen.pop('now');
SELECT msg_offset, attempt FROM queen.pop('now');

-- retry_after on an ack: that lane waits; other partitions and other groups do not.
SELECT count(*) FROM queen.push_batch('[{"queue": "later", "partition": "a", "payload": "a1"},
                                        {"queue": "later", "partition": "a", "payload": "a2"},
                                        {"queue": "later", "partition": "b", "payload": "b1"}]');
SELECT queen.ack(lease_id, partition_id, msg_offset, 'failed', 'busy', retry_after => '600 ms')
         -> 'lanes' -> 0 -> 'retryAfter' AS pause
  FROM queen.pop('later', partition => 'a');
SELECT count(*) AS during_the_pause FROM queen.pop('later', partition => 'a');
SELECT partition, lease_id IS NULL AS no_lease, lease_expires_at IS NULL AS no_expiry,
       retry_at BETWEEN clock_timestamp() AND clock_timestamp() + interval '600 ms' AS backing_off
  FROM queen.status('later') WHERE consumer_group = '__QUEUE_MODE__' ORDER BY partition;
SELECT partition, payload FROM queen.pop('later', partition => 'b', auto_ack => true);
SELECT payload FROM queen.pop('later', 'audit', partition => 'a', auto_ack => true);
-- After the pause: the same message again, its attempt counted.
SELECT pg_sleep(0.7);
CREATE TEMP TABLE again AS SELECT * FROM queen.pop('later', partition => 'a');
SELECT msg_offset, payload, attempt FROM again;

-- A long-poll that meets a pause returns when it ends, not at its deadline.
SELECT queen.ack(lease_id, partition_id, msg_offset, 'retry', retry_after => '1 s') -> 'lanes' -> 0 -> 'retryAfter'
         AS pause
  FROM again;
SELECT clock_timestamp() AS t0 \gset
SELECT msg_offset, attempt FROM queen.pop('later', partition => 'a', wait_ms => 20000, auto_ack => true);
SELECT clock_timestamp() - :'t0'::timestamptz BETWEEN interval '0.9 s' AND interval '10 s' AS woke_when_it_ended;

-- The queue's backoff: 200 ms, doubled per failed ack of the batch, at most 500 ms; the
-- failure that exhausts the budget (3) dead-letters, with nothing to wait for.
SELECT queen.configure('exp', retry_limit => 3, retry_backoff => '200 ms', retry_backoff_max => '500 ms')
         - 'leaseTime' - 'dedupWindow' - 'retention' - 'encryption' - 'delay' AS options;
SELECT count(*) FROM queen.push('exp', '"x"');
SELECT queen.ack(lease_id, partition_id, msg_offset, 'failed') -> 'lanes' -> 0 -> 'retryAfter' AS pause
  FROM queen.pop('exp', wait_ms => 5000);
SELECT queen.ack(lease_id, partition_id, msg_offset, 'failed') -> 'lanes' -> 0 -> 'retryAfter' AS pause
  FROM queen.pop('exp', wait_ms => 5000);
SELECT queen.ack(lease_id, partition_id, msg_offset, 'failed') -> 'lanes' -> 0 -> 'retryAfter' AS pause
  FROM queen.pop('exp', wait_ms => 5000);
SELECT r -> 'lanes' -> 0 -> 'retryAfter' AS pause, r -> 'items' -> 0 -> 'dlq' AS dlq
  FROM (SELECT queen.ack(lease_id, partition_id, msg_offset, 'failed') AS r
          FROM queen.pop('exp', wait_ms => 5000)) x;
-- An ack's retry_after wins over the queue's backoff; retryAfter in the JSON form is seconds.
SELECT count(*) FROM queen.push('exp', '"y"');
SELECT queen.ack(lease_id, jsonb_build_array(jsonb_build_object(
         'partitionId', partition_id, 'offset', msg_offset, 'status', 'failed', 'retryAfter', 0.05)))
         -> 'lanes' -> 0 -> 'retryAfter' AS pause
  FROM queen.pop('exp', wait_ms => 5000);
SELECT payload, attempt FROM queen.pop('exp', wait_ms => 5000, auto_ack => true);

-- Bad input: 22023, and nothing changes.
SELECT count(*) FROM queen.push('bad', '1');
CREATE TEMP TABLE held AS SELECT * FROM queen.pop('bad', lease_seconds => 60);
SELECT pg_temp.err($$SELECT queen.ack(lease_id, partition_id, msg_offset, 'completed', retry_after => '1 s') FROM held$$);
SELECT pg_temp.err($$SELECT queen.ack(lease_id, partition_id, msg_offset, 'dlq', retry_after => '1 s') FROM held$$);
SELECT pg_temp.err($$SELECT queen.ack(lease_id, partition_id, msg_offset, 'failed', retry_after => '-1 s') FROM held$$);
SELECT pg_temp.err($$SELECT queen.ack(lease_id, partition_id, msg_offset, 'failed', retry_after => '8 days') FROM held$$);
SELECT pg_temp.err($$SELECT queen.ack(lease_id, partition_id, msg_offset, 'failed', retry_after => '1 mon') FROM held$$);
SELECT pg_temp.err($$SELECT queen.ack(lease_id, jsonb_build_array(jsonb_build_object('partitionId', partition_id,
         'offset', msg_offset, 'status', 'failed', 'retryAfter', '5 s'))) FROM held$$);
SELECT pg_temp.err($$SELECT queen.ack(lease_id, jsonb_build_array(jsonb_build_object('partitionId', partition_id,
         'offset', msg_offset, 'status', 'retry', 'retryAfter', -2))) FROM held$$);
SELECT pg_temp.err($$SELECT queen.configure('bad', retry_backoff => '10 s', retry_backoff_max => '5 s')$$);
SELECT pg_temp.err($$SELECT queen.configure('bad', retry_backoff => '-1 s')$$);
SELECT pg_temp.err($$SELECT queen.configure('bad', retry_backoff_max => '0 s')$$);
SELECT pg_temp.err($$SELECT queen.configure('bad', retry_backoff => NULL)$$);
SELECT retry_backoff, retry_backoff_max FROM queen.queues WHERE name = 'bad';
SELECT queen.ack(lease_id) -> 'lanes' -> 0 -> 'committed' AS committed FROM held;
