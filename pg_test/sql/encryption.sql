-- Encryption at rest (docs/concepts.md, "Encryption"): an encrypted queue stores AES-256-GCM envelopes; pop,
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

-- A key file: readable by the server's OS user alone (written here by COPY TO PROGRAM, as
-- that user).
-- Its first key seals, the next ones open old envelopes; '#' lines and blank lines are skipped.
COPY (SELECT '# queen keys' UNION ALL SELECT 'ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100'
      UNION ALL SELECT '' UNION ALL SELECT '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f')
  TO PROGRAM 'cat > /tmp/queen_regress.keys && chmod 600 /tmp/queen_regress.keys';
SET queen.encryption_key_file = '/tmp/queen_regress.keys';
SELECT count(*) FROM queen.push('vault', '{"card": "from-file"}');
-- (Offsets are left out: aborted pushes leave gaps with the offset registry only.)
SELECT payload FROM queen.pop('vault', 'keyfile', batch => 20, auto_ack => true);
-- The file wins over the key settings.
SET queen.encryption_key = 'not-a-key';
SELECT count(*) FROM queen.push('vault', '{"card": "still-file"}');
RESET queen.encryption_key;
-- A file others may read is refused, and so is a missing one; no error quotes a key.
COPY (SELECT 'ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100')
  TO PROGRAM 'cat > /tmp/queen_regress_open.keys && chmod 644 /tmp/queen_regress_open.keys';
SET queen.encryption_key_file = '/tmp/queen_regress_open.keys';
SELECT msg_offset FROM queen.push('vault', '1');
SET queen.encryption_key_file = '/tmp/queen_regress_missing.keys';
SELECT msg_offset FROM queen.push('vault', '1');
COPY (SELECT 'zzeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100')
  TO PROGRAM 'cat > /tmp/queen_regress_bad.keys && chmod 600 /tmp/queen_regress_bad.keys';
SET queen.encryption_key_file = '/tmp/queen_regress_bad.keys';
SELECT msg_offset FROM queen.push('vault', '1');
RESET queen.encryption_key_file;

-- configure without encryption does not turn an encrypted queue's encryption off: it is
-- refused; encryption => false turns it off explicitly.
SELECT queen.configure('vault', retry_limit => 5);
SELECT queen.configure('vault', retry_limit => 5, encryption => false) ->> 'encryption' AS encryption;
SELECT queen.configure('vault', retry_limit => 5) ->> 'encryption' AS encryption;

-- The key is hidden from everybody but superusers, and only they can set it.
CREATE ROLE queen_enc_app;
SET ROLE queen_enc_app;
SHOW queen.encryption_key;
SELECT count(*) FROM pg_settings WHERE name LIKE 'queen.encryption%';
SET queen.encryption_key = '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
SET queen.encryption_key_file = '/tmp/queen_regress.keys';
RESET ROLE;
-- A monitoring role (pg_read_all_settings, part of pg_monitor) sees the key settings but
-- not the key file's content: only the path.
GRANT pg_monitor TO queen_enc_app;
SET queen.encryption_key_file = '/tmp/queen_regress.keys';
SET ROLE queen_enc_app;
SHOW queen.encryption_key_file;
SELECT pg_read_file('/tmp/queen_regress.keys');
RESET ROLE;
RESET queen.encryption_key_file;
REVOKE pg_monitor FROM queen_enc_app;
DROP ROLE queen_enc_app;
