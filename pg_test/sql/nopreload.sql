-- Without shared_preload_libraries = 'queen' (run by `make regress` on a second cluster,
-- scripts/nopreload.conf): no shared memory, so no offset registry. A push reserves its
-- offsets by updating its partition row and holds it until it commits, so pushes to one
-- partition commit in offset order: still nothing skipped, nothing lost, only slower.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;
SELECT current_setting('shared_preload_libraries') = '' AS not_preloaded;

-- A rolled-back push gives its offset back: no gap.
SELECT msg_offset FROM queen.push('np', '"one"');
BEGIN;
SELECT msg_offset FROM queen.push('np', '"rolled back"');
ROLLBACK;
SELECT msg_offset FROM queen.push('np', '"two"');
SELECT msg_offset, payload FROM queen.pop('np', batch => 10, auto_ack => true);

-- A prepared transaction that pushed keeps its partition row until it is committed:
-- readers see nothing past it meanwhile, and then everything, in order.
BEGIN;
SELECT msg_offset FROM queen.push('np', '"prepared"');
PREPARE TRANSACTION 'queen-nopreload';
SELECT msg_offset, payload FROM queen.pop('np', batch => 10, auto_ack => true);
COMMIT PREPARED 'queen-nopreload';
SELECT msg_offset FROM queen.push('np', '"after"');
SELECT msg_offset, payload FROM queen.pop('np', batch => 10, auto_ack => true);

-- Compaction is a function call here (no background worker).
SELECT count(*) FROM generate_series(1, 300) i, queen.push('npc', to_jsonb(i));
SELECT r - 'messages' AS pass FROM queen.compact('npc') r;
SELECT count(*) AS messages, min(msg_offset), max(msg_offset), sum(payload::int) = 300 * 301 / 2 AS payloads
  FROM queen.pop('npc', batch => 1000, auto_ack => true);
-- Long-polling polls (no wake-up slots): a pop that waits returns when its time is up.
SELECT count(*) FROM queen.pop('npc', wait_ms => 50);
-- Rate limits work without shared memory: their buckets are rows of queen.limit_buckets
-- (pg_test/sql/rate_limits.sql runs here too).
SELECT queen.configure_limit('nl', 'g', '*', rate => 1) ->> 'key' AS key;

-- The last offset (2^62 - 1) holds here too: the partition row's head gives the offsets.
SELECT queen.configure('nptop') IS NOT NULL AS configured;
INSERT INTO queen.partitions (partition_id, queue_id, name, head)
  SELECT gen_random_uuid(), queue_id, 'top', 4611686018427387902 FROM queen.queues WHERE name = 'nptop';
SELECT msg_offset FROM queen.push('nptop', '"the top"', partition => 'top');
SELECT msg_offset FROM queen.push('nptop', '"past the top"', partition => 'top');
SELECT msg_offset, payload FROM queen.pop('nptop', batch => 10, partition => 'top', auto_ack => true);
