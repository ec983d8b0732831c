-- push_batch: one segment per partition per call, input order, exact round trip.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;

CREATE TEMP TABLE sent AS
SELECT i, 'p' || (i % 4) AS partition,
       jsonb_build_object('i', i, 'text', 'zażółć gęślą jaźń 日本語 🚀 ' || i,
                          'nested', jsonb_build_object('a', jsonb_build_array(i, i * 1.5, null, true)),
                          'pad', repeat('x', i % 97)) AS payload
  FROM generate_series(0, 999) i;

CREATE TEMP TABLE res AS
SELECT * FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'bulk', 'partition', partition,
                                                                    'payload', payload) ORDER BY i) FROM sent));
-- One row per item in input order; offsets per partition 1..250 in input order.
SELECT count(*) AS rows, bool_and(status = 'queued') AS queued,
       bool_and(idx = (SELECT count(*) FROM res r2 WHERE r2.idx < res.idx)) AS idx_in_order
  FROM res;
SELECT s.partition, min(r.msg_offset), max(r.msg_offset), count(DISTINCT r.partition_id) AS ids,
       bool_and(r.msg_offset = s.i / 4 + 1) AS offsets_follow_input
  FROM res r JOIN sent s ON s.i = r.idx GROUP BY s.partition ORDER BY 1;
-- Exactly four segments: one per partition.
SELECT count(*) AS segments, sum(last_offset - first_offset + 1) AS messages
  FROM queen.segments s JOIN queen.partitions p USING (partition_id)
  JOIN queen.queues q USING (queue_id) WHERE q.name = 'bulk';

-- Every payload comes back exactly (jsonb equality), with its message id.
CREATE TEMP TABLE got AS SELECT * FROM queen.pop('bulk', batch => 1000, max_partitions => 4, auto_ack => true);
SELECT count(*) AS popped FROM got;
SELECT count(*) AS mismatches
  FROM sent s JOIN res r ON r.idx = s.i
  FULL JOIN got g ON g.message_id = r.message_id
 WHERE g.payload IS DISTINCT FROM s.payload OR g.msg_offset IS DISTINCT FROM r.msg_offset
    OR g.partition IS DISTINCT FROM s.partition;
-- Rows come ordered by partition, then offset.
SELECT bool_and(ok) AS ordered FROM (
  SELECT (partition, msg_offset) > lag((partition, msg_offset)) OVER (ORDER BY ord) OR lag(partition) OVER (ORDER BY ord) IS NULL AS ok
    FROM (SELECT *, row_number() OVER () AS ord FROM got) x) y;

-- A 1 MB payload and odd JSON round-trip too.
SELECT msg_offset FROM queen.push('bulk', jsonb_build_object('big', repeat('é', 500000)), 'big');
SELECT count(*) AS pushed FROM queen.push_batch('[{"queue": "bulk", "partition": "odd", "payload": null},
                          {"queue": "bulk", "partition": "odd", "payload": "just a string"},
                          {"queue": "bulk", "partition": "odd", "payload": 1e40},
                          {"queue": "bulk", "partition": "odd", "payload": 0.1000000000000000000000001},
                          {"queue": "bulk", "partition": "odd", "payload": {"\u00e9x": "\ud83d\ude80", "k": []}}]');
SELECT length(payload ->> 'big') AS big_len, payload = jsonb_build_object('big', repeat('é', 500000)) AS same
  FROM queen.pop('bulk', partition => 'big', auto_ack => true);
SELECT msg_offset, payload FROM queen.pop('bulk', partition => 'odd', batch => 10, auto_ack => true);
