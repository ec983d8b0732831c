-- Spec §9: bad input gets a clear ERROR with the right SQLSTATE and changes nothing.
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

SELECT queen.push('good', '{"ok": true}') IS NOT NULL AS pushed;
CREATE TEMP TABLE before AS
  SELECT (SELECT count(*) FROM queen.queues) AS queues, (SELECT count(*) FROM queen.partitions) AS partitions,
         (SELECT count(*) FROM queen.segments) + (SELECT count(*) FROM queen.fresh_segments) AS segments, (SELECT count(*) FROM queen.lanes) AS lanes;

-- push
SELECT pg_temp.err($$SELECT queen.push('bad name', '{}')$$);
SELECT pg_temp.err($$SELECT queen.push('', '{}')$$);
SELECT pg_temp.err($$SELECT queen.push(repeat('a', 201), '{}')$$);
SELECT pg_temp.err($$SELECT queen.push('x;drop', '{}')$$);
SELECT pg_temp.err($$SELECT queen.push(NULL, '{}')$$);
SELECT pg_temp.err($$SELECT queen.push('good', NULL)$$);
SELECT pg_temp.err($$SELECT queen.push('good', '{bad json')$$);
SELECT pg_temp.err($$SELECT queen.push('good', '{}', partition => 'a b')$$);
SELECT pg_temp.err($$SELECT queen.push('good', '{}', partition => '')$$);
SELECT pg_temp.err($$SELECT queen.push('good', '{}', transaction_id => '')$$);
SELECT pg_temp.err($$SELECT queen.push('good', '{}', transaction_id => repeat('t', 513))$$);
-- The addresses of dead-letter spans and damaged segments are queen's: a message given one
-- would share its dead letter's address with a span's (dlq_delete takes the oldest row).
SELECT pg_temp.err($$SELECT queen.push('good', '{}', transaction_id => 'purged 1..1')$$);
SELECT pg_temp.err($$SELECT queen.send('good', '{}', transaction_id => 'skipped 3..40')$$);
SELECT pg_temp.err($$SELECT queen.push_batch('[{"queue": "good", "payload": 1, "transactionId": "corrupt segment 1..9"}]')$$);

-- push_batch: malformed items; one bad item stores nothing.
SELECT pg_temp.err($$SELECT queen.push_batch('{"queue": "good"}')$$);
SELECT pg_temp.err($$SELECT queen.push_batch('[]')$$);
SELECT pg_temp.err($$SELECT queen.push_batch('[1]')$$);
SELECT pg_temp.err($$SELECT queen.push_batch('[{"payload": 1}]')$$);
SELECT pg_temp.err($$SELECT queen.push_batch('[{"queue": "good"}]')$$);
SELECT pg_temp.err($$SELECT queen.push_batch('[{"queue": 7, "payload": 1}]')$$);
SELECT pg_temp.err($$SELECT queen.push_batch('[{"queue": "good", "payload": 1, "partiton": "x"}]')$$);
SELECT pg_temp.err($$SELECT queen.push_batch('[{"queue": "good", "payload": 1}, {"queue": "bad name", "payload": 2}]')$$);
SELECT pg_temp.err($$SELECT queen.push_batch('[{"queue": "good", "payload": 1, "transactionId": 5}]')$$);
SELECT pg_temp.err($$SELECT queen.push_batch(NULL)$$);
SELECT pg_temp.err($$SELECT queen.push_batch('[{"queue"')$$);
SELECT messages FROM queen.totals('good');

-- pop
SELECT pg_temp.err($$SELECT queen.pop('bad name')$$);
SELECT pg_temp.err($$SELECT queen.pop(NULL)$$);
SELECT pg_temp.err($$SELECT queen.pop('good', NULL)$$);
SELECT pg_temp.err($$SELECT queen.pop('good', 'bad group!')$$);
SELECT pg_temp.err($$SELECT queen.pop('good', batch => 0)$$);
SELECT pg_temp.err($$SELECT queen.pop('good', batch => -5)$$);
SELECT pg_temp.err($$SELECT queen.pop('good', batch => 100001)$$);
SELECT pg_temp.err($$SELECT queen.pop('good', batch => NULL)$$);
SELECT pg_temp.err($$SELECT queen.pop('good', partition => 'a b')$$);
SELECT pg_temp.err($$SELECT queen.pop('good', lease_seconds => -1)$$);
SELECT pg_temp.err($$SELECT queen.pop('good', wait_ms => -1)$$);
SELECT pg_temp.err($$SELECT queen.pop('good', max_partitions => 0)$$);
SELECT pg_temp.err($$SELECT queen.pop('good', subscription => 'latest')$$);
SELECT pg_temp.err($$SELECT queen.pop('good', batch => 'many')$$);

-- ack
SELECT pg_temp.err($$SELECT queen.ack(NULL::uuid)$$);
SELECT pg_temp.err($$SELECT queen.ack(NULL, gen_random_uuid(), 1)$$);
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), NULL, 1)$$);
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), gen_random_uuid(), NULL)$$);
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), gen_random_uuid(), 1, 'done')$$);
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), gen_random_uuid(), 1, NULL)$$);
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), 'not-a-uuid', 1)$$);
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), '{"partitionId": 1}'::jsonb)$$);
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), '[]'::jsonb)$$);
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), '[{"offset": 1}]'::jsonb)$$);
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), '[{"partitionId": "x", "offset": 1}]'::jsonb)$$);
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), '[{"partitionId": "00000000-0000-0000-0000-000000000000"}]'::jsonb)$$);
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), '[{"partitionId": "00000000-0000-0000-0000-000000000000", "offset": 1.5}]'::jsonb)$$);
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), '[{"partitionId": "00000000-0000-0000-0000-000000000000", "offset": 1, "status": "nope"}]'::jsonb)$$);
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), '[{"partitionId": "00000000-0000-0000-0000-000000000000", "offset": 1, "bogus": 1}]'::jsonb)$$);
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), NULL::jsonb)$$);
-- Found by the SQL fuzzer: a number beyond f64 must be a clean error, not an internal one.
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), '1e309'::jsonb)$$);
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), '[{"partitionId": "00000000-0000-0000-0000-000000000000", "offset": 1e30}]'::jsonb)$$);
-- An integral JSON number with a fraction of zeros is an offset (an unknown lease: no
-- error, nothing acknowledged); a string must be digits alone.
SELECT queen.ack(gen_random_uuid(), '[{"partitionId": "00000000-0000-0000-0000-000000000000", "offset": 1.0}]'::jsonb) -> 'items' -> 0 ->> 'offset' AS offset;
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), '[{"partitionId": "00000000-0000-0000-0000-000000000000", "offset": "+5"}]'::jsonb)$$);
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid(), '[{"partitionId": "00000000-0000-0000-0000-000000000000", "offset": "-5"}]'::jsonb)$$);
-- A bad name is quoted in part: the message stays short whatever its size.
SELECT length(pg_temp.err($$SELECT queen.push(repeat('x', 1000000), '{}')$$)) < 200 AS short;

-- In a read-only transaction every call that changes state refuses with 25006, although
-- queen writes its hottest rows past the executor's read-only check; reads still work.
BEGIN READ ONLY;
SELECT pg_temp.err($$SELECT queen.send('good', '{}')$$);
SELECT pg_temp.err($$SELECT queen.push('good', '{}')$$);
SELECT pg_temp.err($$SELECT queen.push_batch('[{"queue": "good", "payload": {}}]')$$);
SELECT pg_temp.err($$SELECT count(*) FROM queen.pop('good')$$);
SELECT pg_temp.err($$SELECT count(*) FROM queen.pop('good', auto_ack => true)$$);
SELECT pg_temp.err($$SELECT queen.ack(gen_random_uuid())$$);
SELECT pg_temp.err($$SELECT queen.extend_lease(gen_random_uuid(), 60)$$);
SELECT pg_temp.err($$SELECT queen.revoke_lease(gen_random_uuid())$$);
SELECT pg_temp.err($$SELECT queen.dlq_replay(gen_random_uuid(), 'tx')$$);
SELECT pg_temp.err($$SELECT queen.dlq_delete(gen_random_uuid(), 'tx')$$);
SELECT pg_temp.err($$SELECT queen.dlq_redrive('good')$$);
SELECT count(*) AS peeked FROM queen.peek('good');
COMMIT;

-- Nothing above changed the stored state.
SELECT (SELECT count(*) FROM queen.queues) = queues AS same_queues,
       (SELECT count(*) FROM queen.partitions) = partitions AS same_partitions,
       (SELECT count(*) FROM queen.segments) + (SELECT count(*) FROM queen.fresh_segments) = segments AS same_segments,
       (SELECT count(*) FROM queen.lanes) = lanes AS same_lanes
  FROM before;
SELECT msg_offset, payload FROM queen.pop('good', auto_ack => true);

-- Intervals whose microseconds do not fit in 64 bits are refused, also when a negative
-- time part would bring a saturated sum back into range (stored as given, the interval
-- then made every pop or ack of the queue fail); a group's allowances stop at 365 days.
SELECT pg_temp.err($$SELECT queen.configure('bi_time', ttl => '2147483647 days -2562047787:00:54.775807')$$);
SELECT pg_temp.err($$SELECT queen.configure('bi_time', retry_backoff => '2147483647 days -2562047787:00:54.775807')$$);
SELECT pg_temp.err($$SELECT queen.configure_group('bi_time', 'g', handler_timeout => '106751992 days')$$);
SELECT pg_temp.err($$SELECT queen.configure_group('bi_time', 'g', queue_margin => '366 days')$$);
SELECT queen.configure_group('bi_time', 'g', handler_timeout => '365 days', queue_margin => '365 days') ->> 'consumerGroup' AS configured;
SELECT count(*) FROM queen.pop('bi_time', 'g');

-- The read functions and delete_queue check a queue's name as every other call does.
SELECT pg_temp.err($$SELECT * FROM queen.status('')$$);
SELECT pg_temp.err($$SELECT * FROM queen.totals(E'\n')$$);
SELECT pg_temp.err($$SELECT * FROM queen.dlq(repeat('a', 1000))$$);
SELECT pg_temp.err($$SELECT * FROM queen.grants('a b')$$);
SELECT pg_temp.err($$SELECT queen.delete_queue('')$$);

-- An id that only looks like a span's address is an ordinary one.
SELECT status FROM queen.push('good', '{}', transaction_id => 'purged 1..1 again');
