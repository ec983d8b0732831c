-- Delayed delivery (docs/functions.md, "configure" and "push"): a queue's delay holds every
-- message back until its push time plus the delay; a push's deliver_at holds one message
-- back until that time. A lane delivers its offsets in order, so a message not due yet
-- holds back the messages after it in its partition (not other partitions). A long-poll
-- wakes when the first message it waits for becomes due.
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

-- A queue's delay.
SELECT queen.configure('slow', delay => '700 ms') -> 'delay' AS delay;
SELECT count(*) FROM queen.push('slow', '1');
SELECT count(*) AS before_the_delay FROM queen.pop('slow', auto_ack => true);
SELECT pg_sleep(0.8);
SELECT payload FROM queen.pop('slow', auto_ack => true);
-- A long-poll returns when the message becomes due, not at its deadline.
SELECT count(*) FROM queen.push('slow', '2');
SELECT clock_timestamp() AS t0 \gset
SELECT payload FROM queen.pop('slow', wait_ms => 20000, auto_ack => true);
SELECT clock_timestamp() - :'t0'::timestamptz BETWEEN interval '0.4 s' AND interval '10 s' AS woke_when_due;

-- deliver_at: this message waits, and so do the ones after it in its partition; another
-- partition does not.
SELECT count(*) FROM queen.push('timed', '"later"', deliver_at => clock_timestamp() + interval '800 ms');
SELECT count(*) FROM queen.push('timed', '"after it"');
SELECT count(*) FROM queen.push_batch('[{"queue": "timed", "partition": "p2", "payload": "p2 a"},
                                        {"queue": "timed", "partition": "p2", "payload": "p2 b"},
                                        {"queue": "timed", "partition": "p2", "payload": "p2 c"}]');
-- One lane per pop: a pop that meets the waiting lane first goes on to the next one.
SELECT partition, payload FROM queen.pop('timed', auto_ack => true);
SELECT partition, payload FROM queen.pop('timed', auto_ack => true);
-- A batch of one over both lanes: the lane that holds back passes its share to the next.
CREATE TEMP TABLE shared AS SELECT * FROM queen.pop('timed', batch => 1, max_partitions => 10);
SELECT partition, payload FROM shared;
SELECT queen.ack(lease_id) -> 'lanes' -> 0 -> 'committed' AS committed FROM shared;
SELECT count(*) AS still_waiting FROM queen.pop('timed', batch => 10, max_partitions => 10, auto_ack => true);
-- A leasing pop that finds only held-back lanes claims nothing and leaves no lease behind.
SELECT count(*) AS still_waiting FROM queen.pop('timed', batch => 10, max_partitions => 10);
SELECT count(*) AS empty_leases FROM queen.leases WHERE cardinality(partition_ids) = 0;
SELECT pg_sleep(0.9);
SELECT partition, payload FROM queen.pop('timed', batch => 10, max_partitions => 10, auto_ack => true);
-- A time in the past is no wait; "deliverAt" in a batch is an RFC 3339 timestamp.
SELECT count(*) FROM queen.push_batch(jsonb_build_array(
  jsonb_build_object('queue', 'timed', 'payload', 'past', 'deliverAt', '2000-01-01T00:00:00Z'),
  jsonb_build_object('queue', 'timed', 'payload', 'soon', 'deliverAt', clock_timestamp() + interval '500 ms')));
SELECT payload FROM queen.pop('timed', batch => 10, auto_ack => true);
SELECT payload FROM queen.pop('timed', batch => 10, wait_ms => 20000, auto_ack => true);

-- Twelve lanes whose first message waits, then one with a due message (created last, so
-- scanned last): a pop of one with max_partitions 4 goes on past the waiting lanes, four
-- lanes a round, and returns the due message in the same call.
SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'many_wait', 'partition', 'w' || lpad(i::text, 2, '0'), 'payload', i, 'deliverAt', clock_timestamp() + interval '1 hour')) FROM generate_series(1, 12) i));
SELECT count(*) FROM queen.push('many_wait', '"due"', partition => 'z');
SELECT partition, payload FROM queen.pop('many_wait', batch => 1, max_partitions => 4, auto_ack => true);

-- A leasing pop: a delayed message is leased like any other once due.
SELECT count(*) FROM queen.push('timed', '"leased"', deliver_at => clock_timestamp() + interval '300 ms');
SELECT payload, attempt FROM queen.pop('timed', wait_ms => 20000);

-- Compaction keeps each message's delivery time.
SELECT count(*) FROM generate_series(1, 300) i,
  queen.push('bulk', to_jsonb(i), deliver_at => CASE WHEN i = 150 THEN clock_timestamp() + interval '1 s' END);
SELECT (queen.compact('bulk') ->> 'messages')::int AS compacted;
SELECT count(*), max(payload::int) FROM queen.pop('bulk', batch => 1000, auto_ack => true);
SELECT pg_sleep(1.1);
SELECT count(*), min(payload::int), max(payload::int) FROM queen.pop('bulk', batch => 1000, auto_ack => true);

-- Bad input: 22023, nothing stored.
SELECT pg_temp.err($$SELECT queen.push('timed', '1', deliver_at => now() + interval '366 days')$$);
SELECT pg_temp.err($$SELECT queen.push_batch('[{"queue": "timed", "payload": 1, "deliverAt": "soon"}]')$$);
SELECT pg_temp.err($$SELECT queen.push_batch('[{"queue": "timed", "payload": 1, "deliverAt": "tomorrow"}]')$$);
SELECT pg_temp.err($$SELECT queen.push_batch('[{"queue": "timed", "payload": 1, "deliverAt": "2026-12-01T10:00:00"}]')$$);
SELECT pg_temp.err($$SELECT queen.push_batch('[{"queue": "timed", "payload": 1, "deliverAt": 5}]')$$);
SELECT pg_temp.err($$SELECT queen.configure('timed', delay => '-1 s')$$);
SELECT pg_temp.err($$SELECT queen.configure('timed', delay => '400 days')$$);
SELECT pg_temp.err($$SELECT queen.configure('timed', delay => '1 mon')$$);
SELECT count(*) AS nothing_new FROM queen.pop('timed', 'fresh-eyes', batch => 100, max_partitions => 10)
 WHERE payload = '1';
