-- Pause and resume (docs/functions.md#pause, #resume).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN EXECUTE q; RETURN 'no error';
EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE || ': ' || SQLERRM; END $$;

SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'orders', 'partition', 'p' || (i % 2), 'payload', i)) FROM generate_series(1, 6) i));
SELECT count(*) AS billing_took FROM queen.pop('orders', 'billing', batch => 1, lease_seconds => 60);
SELECT count(*) AS audit_took FROM queen.pop('orders', 'audit', batch => 1, auto_ack => true);

-- A queue pause: no group gets anything; pushes go on.
SELECT queen.pause('orders');
SELECT queen.pause('orders') ->> 'changed' AS again_changed;
SELECT count(*) AS billing_paused FROM queen.pop('orders', 'billing', batch => 10);
SELECT count(*) AS audit_paused FROM queen.pop('orders', 'audit', batch => 10, auto_ack => true);
SELECT count(*) AS new_group_paused FROM queen.pop('orders', 'newcomer', batch => 10);
SELECT count(*) AS pushed_while_paused FROM queen.push('orders', '{"late": true}', partition => 'p0');
-- A long-poll on a paused queue waits out its wait and returns nothing.
SELECT count(*) AS waited FROM queen.pop('orders', 'billing', wait_ms => 50);
SELECT consumer_group, paused FROM queen.totals('orders');
SELECT DISTINCT consumer_group, paused FROM queen.status('orders') ORDER BY 1;
SELECT metric, consumer_group, value FROM queen.metrics() WHERE queue = 'orders' AND metric = 'paused' ORDER BY 2 NULLS FIRST;

-- Acks and extend_lease still work on the lease taken before the pause.
CREATE TEMP TABLE held AS
  SELECT lease_id FROM queen.status('orders') WHERE consumer_group = 'billing' AND lease_id IS NOT NULL;
SELECT count(*) AS leases_held FROM held;
SELECT (queen.extend_lease(lease_id) ->> 'success')::bool AS extended FROM held;
SELECT (queen.ack(lease_id) -> 'items' -> 0 ->> 'success')::bool AS acked FROM held;

-- Resume the queue: delivery starts again where each group stood.
SELECT queen.resume('orders');
SELECT queen.resume('orders') ->> 'changed' AS again_changed;
SELECT count(*) AS billing_after FROM queen.pop('orders', 'billing', batch => 10, max_partitions => 2, auto_ack => true);

-- A group pause leaves the other groups alone, and is a flag of its own.
SELECT queen.pause('orders', 'audit');
SELECT count(*) AS audit_paused FROM queen.pop('orders', 'audit', batch => 10, auto_ack => true);
SELECT count(*) AS newcomer_not_paused FROM queen.pop('orders', 'newcomer', batch => 1, auto_ack => true);
SELECT queen.pause('orders');
SELECT queen.resume('orders');
SELECT count(*) AS audit_still_paused FROM queen.pop('orders', 'audit', batch => 10, auto_ack => true);
SELECT consumer_group, paused FROM queen.totals('orders');
SELECT queen.resume('orders', 'audit');
SELECT count(*) AS audit_after FROM queen.pop('orders', 'audit', batch => 10, max_partitions => 2, auto_ack => true);

-- Pausing a group that does not exist creates it (as configure_group does), paused.
SELECT queen.pause('orders', 'later') ->> 'changed' AS created_paused;
SELECT count(*) AS later_paused FROM queen.pop('orders', 'later', batch => 10);
SELECT consumer_group, paused FROM queen.totals('orders') WHERE consumer_group = 'later';
-- A pause in a transaction that rolls back leaves nothing.
BEGIN;
SELECT queen.pause('orders', 'newcomer') ->> 'paused' AS paused_in_tx;
ROLLBACK;
SELECT count(*) AS newcomer_after_rollback FROM queen.pop('orders', 'newcomer', batch => 1, auto_ack => true);

-- Bad input changes nothing.
SELECT pg_temp.err($$SELECT queen.pause(NULL)$$);
SELECT pg_temp.err($$SELECT queen.pause('')$$);
SELECT pg_temp.err($$SELECT queen.resume('orders', '')$$);
SELECT pg_temp.err($$SELECT queen.pause('bad name!')$$);
SELECT count(*) AS queues FROM queen.queues;

-- Privileges: an admin function. A consumer may not pause.
SET client_min_messages = warning;
DROP ROLE IF EXISTS pause_consumer;
RESET client_min_messages;
CREATE ROLE pause_consumer IN ROLE queen_consumer;
SET ROLE pause_consumer;
SELECT pg_temp.err($$SELECT queen.pause('orders')$$);
RESET ROLE;
DROP ROLE pause_consumer;
