-- Spec §1, §3, §4, §5 happy path: push, pop under a lease, ack, groups, auto_ack.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;

-- Three messages to an implicit queue.
SELECT idx, status, msg_offset, message_id IS NOT NULL AS has_id, length(transaction_id) = 36 AS minted_tx
  FROM queen.push('q1', '{"n": 1}');
SELECT idx, status, msg_offset FROM queen.push('q1', '{"n": 2}', transaction_id => 'tx-2');
SELECT idx, status, msg_offset FROM queen.push('q1', '{"n": 3}', 'Default', 'tx-3');
SELECT name, lease_time, retry_limit, dead_letter_queue, dlq_after_max_retries, dedup_window, encryption, retention
  FROM queen.queues WHERE name = 'q1';

-- pop batch 2: offsets 1 and 2, one lease id, lease ~ now() + 60 s, cursor unmoved.
CREATE TEMP TABLE b1 AS SELECT * FROM queen.pop('q1', batch => 2);
SELECT msg_offset, payload, partition, consumer_group, attempt, transaction_id = 'tx-2' AS tx2 FROM b1 ORDER BY msg_offset;
SELECT count(DISTINCT lease_id) AS leases, bool_and(lease_id IS NOT NULL) AS leased,
       bool_and(lease_expires_at BETWEEN clock_timestamp() + interval '58 s' AND clock_timestamp() + interval '61 s') AS sixty_s,
       bool_and(created_at <= now()) AS created_in_past
  FROM b1;
SELECT committed, batch_end, lease_id = (SELECT lease_id FROM b1 LIMIT 1) AS same_lease
  FROM queen.status('q1') WHERE consumer_group = '__QUEUE_MODE__';

-- Same group while leased: nothing. Another group: its own rows from offset 1.
SELECT count(*) AS same_group FROM queen.pop('q1', batch => 10);
SELECT msg_offset, payload, consumer_group FROM queen.pop('q1', 'g2', batch => 10, auto_ack => true);

-- Ack the whole lease: cursor 2, lease released, the next pop delivers 3.
SELECT (r -> 'lanes' -> 0 ->> 'committed')::int AS committed, r -> 'lanes' -> 0 -> 'leaseReleased' AS released,
       jsonb_array_length(r -> 'items') AS items
  FROM (SELECT queen.ack(lease_id) AS r FROM b1 LIMIT 1) s;
SELECT committed, lease_id IS NULL AS no_lease, batch_end FROM queen.status('q1')
 WHERE consumer_group = '__QUEUE_MODE__';
CREATE TEMP TABLE b2 AS SELECT * FROM queen.pop('q1', batch => 5);
SELECT msg_offset, payload, attempt FROM b2;

-- Single-item ack below batch_end keeps the lease; reaching it releases.
SELECT queen.push('q1', '{"n": 4}') IS NOT NULL AS pushed;
SELECT (SELECT queen.ack(lease_id) FROM b2 LIMIT 1) -> 'lanes' -> 0 ->> 'committed' AS committed;
CREATE TEMP TABLE b3 AS SELECT * FROM queen.pop('q1', batch => 5);
SELECT msg_offset FROM b3;
SELECT queen.push('q1', '{"n": 5}') IS NOT NULL AS pushed;

-- An ack with a superseded or unknown lease changes nothing.
SELECT r -> 'items' -> 0 -> 'success' AS success, r -> 'lanes' AS lanes
  FROM (SELECT queen.ack(b1.lease_id, b1.partition_id, 4) AS r FROM b1 LIMIT 1) s;
SELECT committed FROM queen.status('q1') WHERE consumer_group = '__QUEUE_MODE__';
SELECT (queen.ack(lease_id, partition_id, msg_offset) -> 'lanes' -> 0) - 'partitionId' AS lane FROM b3;

-- JSON-array ack: items outside (committed, batch_end] are reported, not applied.
CREATE TEMP TABLE b4 AS SELECT * FROM queen.pop('q1', batch => 5);
SELECT msg_offset FROM b4;
SELECT jsonb_path_query_array(r, '$.items[*].success') AS success,
       jsonb_path_query_array(r, '$.items[*].offset') AS offsets,
       r -> 'lanes' -> 0 -> 'committed' AS committed, r -> 'lanes' -> 0 -> 'leaseReleased' AS released
  FROM (SELECT queen.ack(lease_id, jsonb_build_array(
          jsonb_build_object('partitionId', partition_id, 'offset', 4),
          jsonb_build_object('partitionId', partition_id, 'offset', 9),
          jsonb_build_object('partitionId', partition_id, 'offset', 5, 'status', 'completed'))) AS r
          FROM b4) s;

-- auto_ack: no lease, the cursor moves in the same call; the next pop continues after it.
SELECT count(*) AS pushed FROM queen.push_batch('[{"queue": "q2", "payload": 1}, {"queue": "q2", "payload": 2}, {"queue": "q2", "payload": 3}]');
SELECT msg_offset, payload, lease_id IS NULL AS no_lease_id, lease_expires_at IS NULL AS no_expiry
  FROM queen.pop('q2', batch => 2, auto_ack => true);
SELECT msg_offset, payload FROM queen.pop('q2', batch => 2, auto_ack => true);
SELECT count(*) AS nothing_left FROM queen.pop('q2', auto_ack => true);

-- subscription => 'new': a group's first pop starts at the head.
SELECT count(*) AS new_group_sees FROM queen.pop('q2', 'late', subscription => 'new', auto_ack => true);
SELECT queen.push('q2', '{"after": true}') IS NOT NULL AS pushed;
SELECT msg_offset, payload FROM queen.pop('q2', 'late', subscription => 'new', auto_ack => true);
SELECT count(*) AS all_group_sees FROM queen.pop('q2', 'early', batch => 10, auto_ack => true);

-- Unknown queue: zero rows, nothing created.
SELECT count(*) FROM queen.pop('nope');
SELECT count(*) FROM queen.queues WHERE name = 'nope';

-- Partitions: pinned pops, max_partitions and one lease id over several lanes.
SELECT count(*) AS pushed FROM queen.push_batch(
  (SELECT jsonb_agg(jsonb_build_object('queue', 'q3', 'partition', 'p' || (i % 3), 'payload', i)) FROM generate_series(1, 9) i));
SELECT partition, msg_offset, payload FROM queen.pop('q3', partition => 'p2', batch => 2, auto_ack => true);
-- A batch fills from the lanes in turn: p0 and p1 hold three each, so p2 is not claimed
-- and stays free for another consumer.
CREATE TEMP TABLE m AS SELECT * FROM queen.pop('q3', batch => 6, max_partitions => 3);
SELECT count(DISTINCT lease_id) AS leases, count(DISTINCT partition) AS partitions, count(*) AS messages FROM m;
SELECT partition, msg_offset, payload FROM m;
CREATE TEMP TABLE m2 AS SELECT * FROM queen.pop('q3', batch => 10, max_partitions => 3);
SELECT partition, msg_offset, payload, lease_id <> (SELECT lease_id FROM m LIMIT 1) AS own_lease FROM m2;
SELECT count(*) AS all_leased FROM queen.pop('q3', max_partitions => 3);
SELECT jsonb_array_length(queen.ack(lease_id) -> 'lanes') AS lanes_completed FROM m LIMIT 1;
SELECT jsonb_array_length(queen.ack(lease_id) -> 'lanes') AS lanes_completed FROM m2;
SELECT count(*) AS nothing_left FROM queen.pop('q3', batch => 10, max_partitions => 3, auto_ack => true);
-- Queue names take letters, digits and . _ : - (an underscore is a common name part).
SELECT status FROM queen.push('order_events.v1', '{"n": 1}');
SELECT payload FROM queen.pop('order_events.v1', auto_ack => true);
