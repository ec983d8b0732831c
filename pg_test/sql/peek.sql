-- peek and get (docs/functions.md#peek, #get): reads that claim nothing.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN EXECUTE q; RETURN 'no error';
EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE || ': ' || SQLERRM; END $$;

SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object(
  'queue', 'shop', 'partition', CASE WHEN i <= 5 THEN 'a' ELSE 'b' END, 'payload', jsonb_build_object('n', i),
  'transactionId', 'tx-' || i, 'headers', jsonb_build_object('h', i))) FROM generate_series(1, 8) i));
-- A push that rolls back: with the offset registry it leaves a gap at offset 6 of partition
-- a, which a peek passes over (without preloading there is no gap: the outputs below do
-- not show partition a's offsets past 5).
BEGIN;
SELECT count(*) FROM queen.push('shop', '{"n": "gone"}', partition => 'a');
ROLLBACK;
SELECT count(*) FROM queen.push('shop', '{"n": 9}', partition => 'a', transaction_id => 'tx-9');

-- Everything, oldest first, by partition name then offset; lease columns and attempt NULL.
SELECT partition, least(msg_offset, 6) AS msg_offset, payload, headers, transaction_id, lease_id IS NULL AS no_lease,
       attempt IS NULL AS no_attempt, consumer_group
  FROM queen.peek('shop');
-- A peek claims nothing: no lane, no lease, no group was made.
SELECT count(*) AS lanes FROM queen.status('shop');
-- One partition, from an offset, a few.
SELECT msg_offset, payload FROM queen.peek('shop', 'a', from_offset => 3, max_messages => 2);
-- max_messages across partitions.
SELECT partition, payload FROM queen.peek('shop', max_messages => 6);
-- A byte budget: the first message always comes, then only what fits.
SELECT count(*) AS within_budget FROM queen.peek('shop', max_bytes => 1);

-- From a group's cursor: billing took 2 of partition a under a lease (not committed yet:
-- peek starts at the committed cursor), then acks 1.
CREATE TEMP TABLE l AS SELECT * FROM queen.pop('shop', 'billing', batch => 2, partition => 'a', lease_seconds => 60);
SELECT msg_offset FROM queen.peek('shop', 'a', consumer_group => 'billing', max_messages => 3);
SELECT (queen.ack(lease_id, partition_id, 1) -> 'items' -> 0 ->> 'success')::bool FROM l LIMIT 1;
SELECT msg_offset FROM queen.peek('shop', 'a', consumer_group => 'billing', max_messages => 3);
-- The pop's attempt count is unchanged by peeks: the lease is still live and its lane held.
SELECT consumer_group, committed, lease_id IS NOT NULL AS leased, attempt_count FROM queen.status('shop') WHERE partition = 'a';

-- get: by offset, by producer transaction id (any partition, or a named one), or nothing.
SELECT partition, msg_offset, payload, attempt IS NULL AS no_attempt FROM queen.get('shop', 'b', msg_offset => 2);
SELECT partition, msg_offset, payload FROM queen.get('shop', transaction_id => 'tx-7');
SELECT partition, payload FROM queen.get('shop', 'a', transaction_id => 'tx-9');
SELECT count(*) AS wrong_partition FROM queen.get('shop', 'b', transaction_id => 'tx-9');
SELECT count(*) AS rolled_back_never_seen FROM queen.peek('shop', 'a') WHERE payload->>'n' = 'gone';
SELECT count(*) AS past_end FROM queen.get('shop', 'a', msg_offset => 100);
SELECT count(*) AS unknown_tx FROM queen.get('shop', transaction_id => 'nope');
-- An id pushed to two partitions, whose copy in the first by name retention deleted: the
-- other copy is found.
SELECT queen.configure('twice', retention => 1) ->> 'retention' AS retention;
SELECT count(*) FROM queen.push_batch('[{"queue": "twice", "partition": "a", "payload": 1, "transactionId": "t"}]');
SELECT count(*) AS taken FROM queen.pop('twice', 'g', batch => 10, auto_ack => true);
SELECT pg_sleep(1.1);
SELECT (queen.retain('twice') ->> 'segmentsDeleted')::int > 0 AS deleted;
SELECT count(*) FROM queen.push('twice', '2', partition => 'b', transaction_id => 't');
SELECT partition, payload FROM queen.get('twice', transaction_id => 't');
SELECT count(*) AS unknown_queue FROM queen.peek('no_such_queue');

-- Bad input.
SELECT pg_temp.err($$SELECT * FROM queen.peek(NULL)$$);
SELECT pg_temp.err($$SELECT * FROM queen.peek('shop', max_messages => 0)$$);
SELECT pg_temp.err($$SELECT * FROM queen.peek('shop', max_messages => 10001)$$);
SELECT pg_temp.err($$SELECT * FROM queen.peek('shop', from_offset => 0)$$);
SELECT pg_temp.err($$SELECT * FROM queen.peek('shop', max_bytes => 0)$$);
SELECT pg_temp.err($$SELECT * FROM queen.peek('shop', max_bytes => 2147483648)$$);
SELECT pg_temp.err($$SELECT * FROM queen.peek('shop', consumer_group => 'nobody')$$);
SELECT pg_temp.err($$SELECT * FROM queen.peek('shop', partition => '')$$);
SELECT pg_temp.err($$SELECT * FROM queen.get('shop')$$);
SELECT pg_temp.err($$SELECT * FROM queen.get('shop', msg_offset => 1)$$);
SELECT pg_temp.err($$SELECT * FROM queen.get('shop', 'a', msg_offset => 1, transaction_id => 'tx-1')$$);
SELECT pg_temp.err($$SELECT * FROM queen.get('shop', 'a', msg_offset => 0)$$);

-- Privileges: a consumer's function; a producer may not peek.
SET client_min_messages = warning;
DROP ROLE IF EXISTS peek_producer;
DROP ROLE IF EXISTS peek_consumer;
RESET client_min_messages;
CREATE ROLE peek_producer IN ROLE queen_producer;
CREATE ROLE peek_consumer IN ROLE queen_consumer;
SET ROLE peek_producer;
SELECT pg_temp.err($$SELECT * FROM queen.peek('shop')$$);
RESET ROLE;
SET ROLE peek_consumer;
SELECT count(*) AS consumer_peeks FROM queen.peek('shop');
RESET ROLE;
DROP ROLE peek_producer;
DROP ROLE peek_consumer;
