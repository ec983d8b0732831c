-- queen.send (docs/functions.md, "send"): push's scalar form. The same arguments and rules;
-- it returns the message's offset (a duplicate: the original's), and what it stores pops
-- exactly as a push's would.
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

-- Offsets follow each other in a partition, whichever form pushed.
SELECT queen.send('sent', '{"n": 1}') AS first;
SELECT msg_offset AS second FROM queen.push('sent', '{"n": 2}');
SELECT queen.send('sent', '{"n": 3}') AS third;
SELECT queen.send('sent', '{"n": 1}', partition => 'eu') AS eu_first;
-- A transaction id seen before: nothing stored, the original's offset returned.
SELECT queen.send('sent', '{"n": 4}', transaction_id => 'order-4') AS queued;
SELECT queen.send('sent', '{"n": 4, "again": true}', transaction_id => 'order-4') AS duplicate;
-- Headers and a delivery time, as push takes them.
SELECT queen.send('sent', '{"n": 5}', headers => '{"tenant": "acme"}') AS with_headers;
SELECT queen.send('sent', '{"n": 6}', partition => 'later', deliver_at => now() + interval '1 hour') AS later;

-- The consumer sees what was sent: in order, headers kept, the duplicate absent, the
-- delayed one not yet.
SELECT partition, msg_offset, payload, headers
  FROM queen.pop('sent', batch => 10, max_partitions => 3, auto_ack => true)
 ORDER BY partition, msg_offset;

-- Rolled back: nothing delivered.
BEGIN;
SELECT queen.send('sent', '{"n": 7}') > 0 AS sent_in_tx;
ROLLBACK;
SELECT count(*) AS after_rollback FROM queen.pop('sent', batch => 10, max_partitions => 3, auto_ack => true);

-- Bad input gets push's errors, and stores nothing.
SELECT pg_temp.err($$SELECT queen.send(NULL, '1')$$);
SELECT pg_temp.err($$SELECT queen.send('sent', NULL)$$);
SELECT pg_temp.err($$SELECT queen.send('bad name!', '1')$$);
SELECT pg_temp.err($$SELECT queen.send('sent', '1', transaction_id => '')$$);
SELECT pg_temp.err($$SELECT queen.send('sent', '1', headers => '[1]')$$);
SELECT pg_temp.err($$SELECT queen.send('sent', '1', deliver_at => now() + interval '400 days')$$);
SELECT count(*) AS nothing_stored FROM queen.pop('sent', batch => 10, max_partitions => 3, auto_ack => true);
-- (The same pop sees a message sent now: the two checks above could have seen one.)
-- (Its offset is 6 or 7: the rolled-back send leaves a gap with the library preloaded.)
SELECT queen.send('sent', '{"n": 8}') IN (6, 7) AS after_the_errors;
SELECT partition, payload FROM queen.pop('sent', batch => 10, max_partitions => 3, auto_ack => true);

-- Granted with push: to queen_producer, not to PUBLIC nor to consumers.
SELECT has_function_privilege('queen_producer', 'queen.send(text, jsonb, text, text, jsonb, timestamptz)', 'EXECUTE') AS producer,
       has_function_privilege('queen_consumer', 'queen.send(text, jsonb, text, text, jsonb, timestamptz)', 'EXECUTE') AS consumer,
       has_function_privilege('public', 'queen.send(text, jsonb, text, text, jsonb, timestamptz)', 'EXECUTE') AS public;
