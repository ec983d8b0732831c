-- Limits (README, "Limits"): a pop's byte budget, and the caps on wait_ms and on ack items.
-- Past a cap, a call fails with 54000 (program_limit_exceeded) and changes nothing.
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
SELECT count(*) FROM queen.push_batch(
  (SELECT jsonb_agg(jsonb_build_object('queue', 'lim', 'payload', repeat('x', 100))) FROM generate_series(1, 10)));

-- max_bytes: the pop returns fewer messages when the next one would pass the budget.
-- Each payload is 102 bytes of JSON text ("xxx...").
SELECT count(*), sum(octet_length(payload::text)) FROM queen.pop('lim', 'g', batch => 10, max_bytes => 350, auto_ack => true);
-- The next pop goes on where that one stopped.
SELECT min(msg_offset), max(msg_offset) FROM queen.pop('lim', 'g', batch => 10, max_bytes => 350, auto_ack => true);
-- A message larger than the budget still comes, alone: a pop never returns nothing when
-- something is ready.
SELECT count(*), min(msg_offset) FROM queen.pop('lim', 'g', batch => 10, max_bytes => 1, auto_ack => true);
-- The budget spans partitions: a lane it leaves untouched is not claimed.
SELECT count(*) FROM (VALUES ('a'), ('b')) v(p), LATERAL queen.push('lim2', to_jsonb(repeat('y', 100)), v.p);
SELECT count(*) FROM queen.pop('lim2', 'g', max_partitions => 2, batch => 10, max_bytes => 150);
SELECT count(*) FROM queen.pop('lim2', 'g', max_partitions => 2, batch => 10, max_bytes => 150);

-- Bad budgets.
SELECT pg_temp.err($$SELECT * FROM queen.pop('lim', max_bytes => 0)$$);
SELECT pg_temp.err($$SELECT * FROM queen.pop('lim', max_bytes => NULL)$$);
SELECT pg_temp.err($$SELECT * FROM queen.pop('lim', max_bytes => 1073741825)$$);
-- wait_ms is capped at five minutes.
SELECT pg_temp.err($$SELECT * FROM queen.pop('lim', wait_ms => 300001)$$);
-- An ack takes at most 100,000 items.
SELECT pg_temp.err($$SELECT queen.ack('00000000-0000-7000-8000-000000000000'::uuid,
                 (SELECT jsonb_agg(jsonb_build_object('partitionId', '00000000-0000-7000-8000-000000000000',
                                                      'offset', g)) FROM generate_series(1, 100001) g))$$);
-- Nothing was claimed by the refused calls: the group's next message is still 8.
SELECT min(msg_offset) FROM queen.pop('lim', 'g', batch => 10, auto_ack => true);
-- 100,000 is allowed (an unknown lease: every item is reported as not applied).
SELECT jsonb_array_length(queen.ack('00000000-0000-7000-8000-000000000000'::uuid,
                 (SELECT jsonb_agg(jsonb_build_object('partitionId', '00000000-0000-7000-8000-000000000000',
                                                      'offset', g)) FROM generate_series(1, 100000) g)) -> 'items') AS items;
