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

-- A queue's segments, of both tiers.
CREATE TEMP VIEW queue_segments AS
  SELECT q.name AS queue, s.tier, s.first_offset, s.last_offset, s.data
    FROM (SELECT 'durable' AS tier, partition_id, first_offset, last_offset, data FROM queen.segments
          UNION ALL
          SELECT 'fresh', partition_id, first_offset, last_offset, data FROM queen.fresh_segments) s
    JOIN queen.partitions p USING (partition_id) JOIN queen.queues q USING (queue_id);

-- A run is bounded by bytes too (8 MiB of small segments) and merged as a stream: 40
-- pushes of 300 kB each become two segments, 27 and 13 messages, and nothing stays fresh.
SELECT count(*) FROM generate_series(1, 40) i, queen.push('big', to_jsonb(lpad(i::text, 300000, 'x')));
SELECT r - 'messages' AS pass, (r ->> 'messages')::int AS messages FROM queen.compact('big') r;
SELECT tier, first_offset, last_offset FROM queue_segments WHERE queue = 'big' ORDER BY first_offset;
SELECT count(*) AS delivered, bool_and(msg_offset = ordinality) AS in_order,
       bool_and(payload #>> '{}' = lpad(ordinality::text, 300000, 'x')) AS payloads_intact
  FROM queen.pop('big', 'g', batch => 100, auto_ack => true) WITH ORDINALITY;

-- A fresh segment that cannot be decoded does not stop compaction and is not lost: it is
-- kept as it is, in the durable tier at its own offsets, between the segments merged
-- before and after it (with a WARNING naming its partition: not shown here). A pop then
-- files it as a dead letter, as it would have from the fresh tier.
SELECT count(*) FROM generate_series(1, 300) i, queen.push('cz', to_jsonb(i));
-- Offset 100: not a segment at all; offset 200: a block that fails its checksum.
UPDATE queen.fresh_segments s SET data = '\x00'::bytea
  FROM queen.partitions p JOIN queen.queues q USING (queue_id)
 WHERE q.name = 'cz' AND s.partition_id = p.partition_id AND s.first_offset = 100;
UPDATE queen.fresh_segments s SET data = set_byte(data, length(data) - 1, get_byte(data, length(data) - 1) # 255)
  FROM queen.partitions p JOIN queen.queues q USING (queue_id)
 WHERE q.name = 'cz' AND s.partition_id = p.partition_id AND s.first_offset = 200;
CREATE TEMP TABLE damaged AS SELECT first_offset, data FROM queue_segments WHERE queue = 'cz' AND first_offset IN (100, 200);
SET client_min_messages = error;
SELECT r - 'messages' AS pass, (r ->> 'messages')::int AS messages FROM queen.compact('cz') r;
RESET client_min_messages;
SELECT s.tier, s.first_offset, s.last_offset, d.data = s.data AS kept_unchanged
  FROM queue_segments s LEFT JOIN damaged d USING (first_offset)
 WHERE s.queue = 'cz' ORDER BY s.first_offset;
SELECT count(*) AS delivered, min(msg_offset), max(msg_offset),
       count(*) FILTER (WHERE msg_offset IN (100, 200)) AS damaged_delivered,
       bool_and(payload = to_jsonb(msg_offset)) AS payloads_intact
  FROM queen.pop('cz', 'g', batch => 1000, auto_ack => true);
SELECT consumer_group, transaction_id, data, error_message FROM queen.dlq('cz') ORDER BY transaction_id;
