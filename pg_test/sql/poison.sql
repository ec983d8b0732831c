-- Poison (README, "Poison messages"): a segment that cannot be decoded, or an envelope
-- that does not authenticate, does not block its partition. Each group files it once
-- as a dead letter (with the reason; a corrupt segment's bytes are kept) and goes on.
-- A message sealed with a key that is not configured is not poison: the pop fails with
-- 55000 until the key is set (or the group seeks past it).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE q;
  RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, '[0-9a-f-]{36}', '<uuid>', 'g');
END $$;
-- Flips the last byte of a partition's segment that holds `off` (either tier).
CREATE FUNCTION pg_temp.corrupt(q text, off bigint) RETURNS void LANGUAGE sql AS $$
  UPDATE queen.fresh_segments s SET data = set_byte(data, length(data) - 1, get_byte(data, length(data) - 1) # 255)
    FROM queen.partitions p JOIN queen.queues qq USING (queue_id)
   WHERE qq.name = q AND s.partition_id = p.partition_id AND off BETWEEN s.first_offset AND s.last_offset;
  UPDATE queen.segments s SET data = set_byte(data, length(data) - 1, get_byte(data, length(data) - 1) # 255)
    FROM queen.partitions p JOIN queen.queues qq USING (queue_id)
   WHERE qq.name = q AND s.partition_id = p.partition_id AND off BETWEEN s.first_offset AND s.last_offset;
$$;

-- Three single pushes (three segments); the middle one is damaged.
SELECT count(*) FROM (SELECT queen.push('pz', to_jsonb(g)) FROM generate_series(1, 3) g) x;
SELECT pg_temp.corrupt('pz', 2);
-- An auto-ack pop gets 1 and 3; the damaged segment becomes one dead letter.
SELECT msg_offset, payload FROM queen.pop('pz', 'reader', batch => 10, auto_ack => true);
SELECT consumer_group, msg_offset, transaction_id, data, envelope IS NOT NULL AS bytes_kept, error_message
  FROM queen.log_dlq ORDER BY failed_at;
-- A leasing group: the same, and its ack passes the damaged offset.
SELECT msg_offset FROM queen.pop('pz', 'leaser', batch => 10);
SELECT queen.ack(lease_id) -> 'lanes' -> 0 -> 'committed' AS committed
  FROM (SELECT DISTINCT lease_id FROM queen.pop('pz', 'leaser2', batch => 10)) l;
SELECT count(*) AS filed_once_per_group FROM queen.log_dlq GROUP BY consumer_group ORDER BY 1;
-- queen.dlq lists the row: no payload, and why.
SELECT consumer_group, data, regexp_replace(error_message, '[0-9a-f-]{36}', '<uuid>', 'g') AS error
  FROM queen.dlq('pz') ORDER BY consumer_group;
-- It cannot be replayed (there is no message in it), and it can be deleted.
SELECT pg_temp.err($$SELECT queen.dlq_replay(partition_id, transaction_id) FROM queen.log_dlq WHERE consumer_group = 'reader'$$);
SELECT queen.dlq_delete(partition_id, transaction_id) ->> 'deleted' AS deleted FROM queen.log_dlq WHERE consumer_group = 'reader';

-- A partition whose only pending message is damaged: the pop returns nothing, files it,
-- and moves on; a message pushed after it comes next.
SELECT count(*) FROM queen.push('pz2', '"bad"');
SELECT pg_temp.corrupt('pz2', 1);
SELECT count(*) FROM queen.pop('pz2', 'g', batch => 10);
SELECT count(*) FROM queen.push('pz2', '"good"');
SELECT msg_offset, payload FROM queen.pop('pz2', 'g', batch => 10, auto_ack => true);

-- Encrypted queue: an envelope that does not authenticate is poison too.
SET queen.encryption_key = '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
SELECT queen.configure('pv', encryption => true) ->> 'encryption' AS encryption;
SELECT count(*) FROM (SELECT queen.push('pv', to_jsonb(g)) FROM generate_series(1, 2) g) x;
-- A dead letter, filed under this key.
SELECT queen.ack(lease_id, partition_id, msg_offset, 'dlq', 'declined') -> 'items' -> 0 -> 'dlq' AS dlq
  FROM queen.pop('pv', 'g');
-- Another key only: the envelope names a key that is not configured. The pop fails
-- (55000) and nothing moves; queen.dlq still lists the page, without that payload;
-- dlq_delete needs no key.
SET queen.encryption_key = 'ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100';
SELECT pg_temp.err($$SELECT * FROM queen.pop('pv', 'g')$$);
SELECT consumer_group, data IS NULL AS no_payload, error_message FROM queen.dlq('pv');
SELECT queen.dlq_delete(partition_id, transaction_id) ->> 'deleted' AS deleted FROM queen.log_dlq
 WHERE consumer_group = 'g' AND envelope IS NOT NULL AND transaction_id NOT LIKE 'corrupt%';
-- An operator who knows the key is gone for good (or wants the partition served while
-- it is restored) sets queen.dead_letter_missing_key: such messages are filed, their
-- envelopes kept, and replay works once the key is back.
SET queen.dead_letter_missing_key = on;
SELECT msg_offset, payload FROM queen.pop('pv', 'g', batch => 10, auto_ack => true);
SELECT consumer_group, msg_offset, data IS NULL AS sealed FROM queen.log_dlq WHERE transaction_id NOT LIKE 'corrupt%';
RESET queen.dead_letter_missing_key;
SELECT count(*) FROM queen.push('pv', '3');
SET queen.encryption_key = '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
SELECT queen.dlq_replay(partition_id, transaction_id) ->> 'replayed' AS replayed FROM queen.log_dlq
 WHERE transaction_id NOT LIKE 'corrupt%';
SET queen.encryption_old_keys = 'ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100';
SELECT msg_offset, payload FROM queen.pop('pv', 'g', batch => 10, auto_ack => true);
RESET queen.encryption_old_keys;
