-- A pop's memory (docs/concepts.md, "Limits", "Memory"): max_bytes bounds what a pop reads
-- from its segments, not only what it returns. It reads the blocks of the offsets it wants a
-- few at a time and stops once the budget is spent: batch => 63, max_bytes => 1 reads one
-- message, not 63. Payloads of about 1 MB of hex text: each is a block of its own, which
-- compression does not make small.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;
-- One push_batch of 64 messages to one partition: one durable segment (a push of fewer than
-- 64 writes to the fresh tier).
SELECT count(*) FROM queen.push_batch((
  WITH pad AS (SELECT string_agg(md5(g::text), '' ORDER BY g) AS s FROM generate_series(1, 31250) g)
  SELECT jsonb_agg(jsonb_build_object('queue', 'popmem', 'payload', i || s) ORDER BY i) FROM pad, generate_series(1, 64) i));
SELECT count(*) AS segments, sum(s.last_offset - s.first_offset + 1) AS offsets,
       sum(octet_length(s.data)) > 16000000 AS large
  FROM queen.segments s JOIN queen.partitions p USING (partition_id) JOIN queen.queues q USING (queue_id)
 WHERE q.name = 'popmem';
-- 63 single pushes: a fresh segment each.
WITH pad AS (SELECT string_agg(md5(g::text), '' ORDER BY g) AS s FROM generate_series(1, 31250) g)
SELECT count(*) FROM pad, generate_series(1, 63) i, LATERAL queen.push('popmem_fresh', to_jsonb(i || s));
-- The first message always comes, alone; the next pop goes on with the next one.
SELECT count(*), min(msg_offset) FROM queen.pop('popmem', batch => 63, max_bytes => 1, auto_ack => true);
SELECT count(*), min(msg_offset) FROM queen.pop('popmem', batch => 63, max_bytes => 1, auto_ack => true);
SELECT count(*), min(msg_offset) FROM queen.pop('popmem_fresh', batch => 63, max_bytes => 1, auto_ack => true);
SELECT count(*), min(msg_offset) FROM queen.pop('popmem_fresh', batch => 63, max_bytes => 1, auto_ack => true);
-- A budget of two and a half messages: two.
SELECT count(*), min(msg_offset) FROM queen.pop('popmem', batch => 63, max_bytes => 2500000, auto_ack => true);
SELECT count(*), min(msg_offset) FROM queen.pop('popmem_fresh', batch => 63, max_bytes => 2500000, auto_ack => true);
-- Nothing was skipped: the rest comes whole, in order (each payload begins with its offset,
-- then md5('1')).
SELECT count(*), min(msg_offset), max(msg_offset), bool_and(payload #>> '{}' LIKE msg_offset || 'c4ca4238%') AS payloads
  FROM queen.pop('popmem', batch => 100, max_bytes => 1073741824, auto_ack => true);
SELECT count(*), min(msg_offset), max(msg_offset), bool_and(payload #>> '{}' LIKE msg_offset || 'c4ca4238%') AS payloads
  FROM queen.pop('popmem_fresh', batch => 100, max_bytes => 1073741824, auto_ack => true);
