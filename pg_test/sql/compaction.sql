-- Compaction: the small segments of small pushes (the fresh tier) are merged into one
-- segment of the durable tier by queen.compact() (and by the background worker). Every
-- offset holds what it held: the same message, id, transaction id and time, and a gap
-- stays a gap. Pops and dead letters read compacted messages as before.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;

-- 300 single pushes, one rolled back (offset 150 is a gap), then a batch of 100 (a
-- segment of the durable tier of its own), then 5 more single pushes.
SELECT count(*) FROM generate_series(1, 149) i, queen.push('c', to_jsonb(i));
BEGIN;
SELECT msg_offset FROM queen.push('c', '"gone"');
ROLLBACK;
SELECT count(*) FROM generate_series(151, 300) i, queen.push('c', to_jsonb(i));
SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'c', 'payload', i)) FROM generate_series(301, 400) i));
SELECT count(*) FROM generate_series(401, 405) i, queen.push('c', to_jsonb(i));

CREATE TEMP VIEW tiers AS
  SELECT 'durable' AS tier, count(*) AS segments, coalesce(sum(last_offset - first_offset + 1), 0) AS offsets FROM queen.segments
  UNION ALL
  SELECT 'fresh', count(*), coalesce(sum(last_offset - first_offset + 1), 0) FROM queen.fresh_segments;
SELECT * FROM tiers;

-- What a reader sees before: every message with its id, transaction id and time.
CREATE TEMP TABLE before AS
  SELECT msg_offset, message_id, transaction_id, payload, created_at FROM queen.pop('c', 'peek', batch => 1000, auto_ack => true);
SELECT count(*) AS messages, min(msg_offset), max(msg_offset), count(*) FILTER (WHERE msg_offset = 150) AS at_the_gap FROM before;

-- The run of 299 single pushes (with the gap) becomes one segment; the batch's segment
-- stays; the 5 pushes after it are a run too short and too young to merge yet.
SELECT r - 'messages' AS pass, (r ->> 'messages')::int AS messages FROM queen.compact('c') r;
SELECT * FROM tiers;
SELECT first_offset, last_offset FROM queen.segments ORDER BY 1;

-- A second pass has nothing to do (idempotent).
SELECT queen.compact() AS again;

-- Another group reads exactly what was there, at the same offsets.
CREATE TEMP TABLE after AS
  SELECT msg_offset, message_id, transaction_id, payload, created_at FROM queen.pop('c', 'after', batch => 1000, auto_ack => true);
SELECT count(*) AS messages,
       count(*) FILTER (WHERE (b.message_id, b.transaction_id, b.payload, b.created_at) IS NOT DISTINCT FROM
                              (a.message_id, a.transaction_id, a.payload, a.created_at)) AS identical
  FROM before b FULL JOIN after a USING (msg_offset);

-- Pops read the merged segment one message at a time; a dead letter is filed from it.
SELECT msg_offset, payload FROM queen.pop('c', 'mid', batch => 1, partition => 'Default', auto_ack => true);
SELECT queen.ack(lease_id, partition_id, msg_offset, 'dlq', 'bad') -> 'items' -> 0 -> 'dlq' AS dlq
  FROM queen.pop('c', 'mid');
SELECT consumer_group, data, error_message FROM queen.dlq('c');
