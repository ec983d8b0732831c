-- Encryption at rest (spec §7): an encrypted queue stores AES-256-GCM envelopes; pop,
-- queen.dlq and replay give plaintext; the key is superuser-only and hidden; a missing
-- or unknown key is an ERROR; old keys open old envelopes after a rotation.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
DROP ROLE IF EXISTS queen_enc_app;
RESET client_min_messages;
\set VERBOSITY terse

-- No key yet: an encrypted queue is refused.
SELECT queen.configure('vault', encryption => true);
SET queen.encryption_key = '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
SELECT queen.configure('vault', encryption => true) ->> 'encryption' AS encryption;
SELECT msg_offset FROM queen.push('vault', '{"card": "4111-1111-1111-1111"}');
SELECT msg_offset FROM queen.push_batch('[{"queue": "vault", "payload": {"card": "5500-0000-0000-0004"}},
                                          {"queue": "plain", "payload": {"card": "visible"}}]');
-- The stored segments (both tiers) hold no plaintext of the encrypted queue; the plain queue's do.
SELECT q.name, bool_or(position(convert_to('1111', 'UTF8') in s.data) > 0
                       OR position(convert_to('0004', 'UTF8') in s.data) > 0
                       OR position(convert_to('visible', 'UTF8') in s.data) > 0) AS plaintext_stored
  FROM (SELECT partition_id, first_offset, last_offset, data FROM queen.segments UNION ALL SELECT partition_id, first_offset, last_offset, data FROM queen.fresh_segments) s
  JOIN queen.partitions p USING (partition_id) JOIN queen.queues q USING (queue_id)
 GROUP BY q.name ORDER BY q.name;

-- Pop returns plaintext.
SELECT msg_offset, payload FROM queen.pop('vault', 'reader', batch => 10, auto_ack => true);

-- A dead letter keeps the envelope; queen.dlq and replay give plaintext.
SELECT queen.ack(lease_id, partition_id, msg_offset, 'dlq', 'declined') -> 'items' -> 0 -> 'dlq' AS dlq
  FROM queen.pop('vault');
SELECT data IS NULL AS no_plain_data, position(convert_to('1111', 'UTF8') in envelope) = 0 AS sealed
  FROM queen.log_dlq;
SELECT data, error_message FROM queen.dlq('vault');

-- Wrong key: an ERROR, and nothing moves.
SET queen.encryption_key = 'ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100';
SELECT payload FROM queen.pop('vault', 'second', auto_ack => true);
SELECT data FROM queen.dlq('vault');
-- Rotation: the old key, listed among the old keys, opens the old envelopes; new pushes
-- are sealed with the new key.
SET queen.encryption_old_keys = '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
SELECT msg_offset, payload FROM queen.pop('vault', 'second', batch => 10, auto_ack => true);
SELECT msg_offset FROM queen.push('vault', '{"card": "new-key"}');
RESET queen.encryption_old_keys;
SELECT msg_offset, payload FROM queen.pop('vault', 'second', batch => 10, auto_ack => true);
SELECT queen.dlq_replay(partition_id, transaction_id) ->> 'replayed' AS replayed FROM queen.dlq('vault');
SET queen.encryption_old_keys = '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
SELECT queen.dlq_replay(partition_id, transaction_id) ->> 'replayed' AS replayed FROM queen.dlq('vault');
SELECT msg_offset, payload FROM queen.pop('vault', 'second', batch => 10, auto_ack => true);

-- No key at all: a clear ERROR on push and on pop.
RESET queen.encryption_key;
RESET queen.encryption_old_keys;
SELECT msg_offset FROM queen.push('vault', '1');
SELECT payload FROM queen.pop('vault', 'third');
-- A malformed key is refused.
SET queen.encryption_key = 'not-a-key';
SELECT msg_offset FROM queen.push('vault', '1');
RESET queen.encryption_key;

-- The key is hidden from everybody but superusers, and only they can set it.
CREATE ROLE queen_enc_app;
SET ROLE queen_enc_app;
SHOW queen.encryption_key;
SELECT count(*) FROM pg_settings WHERE name LIKE 'queen.encryption%';
SET queen.encryption_key = '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
RESET ROLE;
DROP ROLE queen_enc_app;
