-- Message headers (docs/functions.md, "push"): a JSON object pushed with a message, stored
-- in its frame, returned by pop as the last column, kept by dead letters and by replay,
-- kept by compaction, and sealed with the payload when the queue is encrypted.
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

-- push: headers is the last argument, NULL (no headers) by default.
SELECT status, msg_offset FROM queen.push('traced', '{"n": 1}',
  headers => '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}');
SELECT status, msg_offset FROM queen.push('traced', '{"n": 2}', transaction_id => 'tx-2');
SELECT status, msg_offset FROM queen.push('traced', '{"n": 3}', 'Default', 'tx-3', '{}');
-- push_batch: a "headers" key per item; null is no headers.
SELECT idx, status, msg_offset FROM queen.push_batch('[
  {"queue": "traced", "payload": {"n": 4}, "headers": {"tenant": "acme", "attempt": 1}},
  {"queue": "traced", "payload": {"n": 5}, "headers": null},
  {"queue": "traced", "payload": {"n": 6}}]');

-- pop returns them; a message pushed without headers has NULL.
SELECT msg_offset, payload, headers FROM queen.pop('traced', 'a', batch => 10, auto_ack => true);

-- A segment with headers is written in format version 3; the others keep version 2 (the
-- push of n 2, which has a transaction id of its own: see below for one without).
SELECT get_byte(data, 2) AS version, count(*)
  FROM (SELECT data FROM queen.fresh_segments UNION ALL SELECT data FROM queen.segments) s
 GROUP BY 1 ORDER BY 1;

-- A message pushed without a transaction id gets its message id's text as one. Its segment
-- does not store that text (version 3, whose flags byte says to derive it): 35 bytes fewer
-- than the same push with a transaction id of that length (36 not stored, a flags byte). Pop gives it back, before and
-- after compaction, and a given transaction id stays as given.
SELECT message_id::text = transaction_id AS derived FROM queen.push('minted', '{"n": 0}');
SELECT message_id::text = transaction_id AS derived
  FROM queen.push('minted', '{"n": 0}', transaction_id => 'x' || repeat('-', 35));
SELECT get_byte(f.data, 2) AS version, octet_length(f.data) AS bytes
  FROM queen.fresh_segments f JOIN queen.partitions p USING (partition_id) JOIN queen.queues q USING (queue_id)
 WHERE q.name = 'minted' ORDER BY f.first_offset;
SELECT count(*) FROM generate_series(1, 300) i,
  queen.push('minted', to_jsonb(i), transaction_id => CASE WHEN i % 2 = 0 THEN 'p-' || i END);
SELECT count(*) AS messages, count(*) FILTER (WHERE transaction_id = message_id::text) AS derived
  FROM queen.peek('minted', 'Default', max_messages => 1000);
SELECT (queen.compact('minted') ->> 'messages')::int AS compacted;
SELECT count(*) AS messages,
       count(*) FILTER (WHERE transaction_id = message_id::text) AS derived,
       count(*) FILTER (WHERE transaction_id = 'p-' || payload::text) AS given
  FROM queen.pop('minted', 'c', batch => 1000, auto_ack => true);

-- Compaction merges 300 single pushes (every third with headers) into one segment and
-- keeps every message's headers, and no headers where there were none.
SELECT count(*) FROM generate_series(1, 300) i,
  queen.push('many', to_jsonb(i), headers => CASE WHEN i % 3 = 0 THEN jsonb_build_object('i', i) END);
SELECT (queen.compact('many') ->> 'messages')::int AS compacted;
SELECT s.first_offset, s.last_offset, get_byte(s.data, 2) AS version
  FROM queen.segments s JOIN queen.partitions p USING (partition_id) JOIN queen.queues q USING (queue_id)
 WHERE q.name = 'many';
SELECT count(*) AS messages,
       count(*) FILTER (WHERE headers IS NOT DISTINCT FROM
                              CASE WHEN payload::int % 3 = 0 THEN jsonb_build_object('i', payload::int) END) AS headers_kept
  FROM queen.pop('many', 'b', batch => 1000, auto_ack => true);

-- max_bytes counts headers with the payload: past the first message (which always comes),
-- a message whose headers would pass the budget waits for the next pop.
SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'budget', 'payload', i,
                                        'headers', jsonb_build_object('pad', repeat('x', 200))))
                                         FROM generate_series(1, 2) i));
SELECT msg_offset FROM queen.pop('budget', batch => 10, max_bytes => 150, auto_ack => true);
SELECT msg_offset FROM queen.pop('budget', batch => 10, max_bytes => 150, auto_ack => true);

-- A dead letter keeps the headers; queen.dlq lists them; replay pushes them again.
SELECT msg_offset, queen.ack(lease_id, partition_id, msg_offset, 'dlq', 'bad') -> 'items' -> 0 -> 'dlq' AS dlq
  FROM queen.pop('traced', 'c', batch => 1);
SELECT data, error_message, headers FROM queen.dlq('traced');
SELECT (queen.dlq_replay(partition_id, transaction_id) ->> 'replayed')::bool AS replayed FROM queen.dlq('traced');
SELECT msg_offset, payload, headers FROM queen.pop('traced', 'c', batch => 100, auto_ack => true)
 WHERE payload = '{"n": 1}';

-- Bad input: headers must be a JSON object of at most 64 KiB; nothing is stored.
SELECT pg_temp.err($$SELECT queen.push('traced', '{}', headers => '[1, 2]')$$);
SELECT pg_temp.err($$SELECT queen.push('traced', '{}', headers => '"traceparent"')$$);
-- (a long bad value is quoted in part)
SELECT pg_temp.err($$SELECT queen.push('traced', '{}', headers => (SELECT jsonb_agg(i) FROM generate_series(1, 1000) i))$$);
SELECT pg_temp.err($$SELECT queen.push('traced', '{}', headers => jsonb_build_object('big', repeat('x', 70000)))$$);
SELECT pg_temp.err($$SELECT queen.push_batch('[{"queue": "traced", "payload": {}, "headers": "x"}]')$$);
SELECT pg_temp.err($$SELECT queen.push_batch('[{"queue": "traced", "payload": {}, "header": {}}]')$$);
-- (group a has read offsets 1 to 6: only the replayed message is new to it)
SELECT msg_offset FROM queen.pop('traced', 'a', batch => 100);

-- An encrypted queue seals the headers as it seals the payload.
SET queen.encryption_key = '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
SELECT queen.configure('sealed', encryption => true) ->> 'encryption' AS encryption;
SELECT status FROM queen.push('sealed', '{"card": "4111"}', headers => '{"secret-header": "hunter2"}');
SELECT status FROM queen.push_batch('[{"queue": "sealed", "payload": {}, "headers": {"secret-header": "hunter3"}}]');
SELECT bool_or(position(convert_to('hunter', 'UTF8') in s.data) > 0) AS plaintext_stored
  FROM (SELECT partition_id, data FROM queen.segments UNION ALL SELECT partition_id, data FROM queen.fresh_segments) s
  JOIN queen.partitions p USING (partition_id) JOIN queen.queues q USING (queue_id)
 WHERE q.name = 'sealed';
SELECT queen.ack(lease_id, partition_id, msg_offset, 'dlq', 'declined') -> 'items' -> 0 -> 'dlq' AS dlq
  FROM queen.pop('sealed', batch => 1);
SELECT position(convert_to('hunter', 'UTF8') in headers) = 0 AS sealed_in_dlq FROM queen.log_dlq WHERE envelope IS NOT NULL;
SELECT data, headers FROM queen.dlq('sealed');
SELECT payload, headers FROM queen.pop('sealed', 'other', batch => 10, auto_ack => true);
-- Without the key, neither the payload nor the headers can be read: an ERROR.
RESET queen.encryption_key;
SELECT pg_temp.err($$SELECT headers FROM queen.pop('sealed', 'third', batch => 10)$$);
