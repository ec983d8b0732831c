-- Spec §2, §4, §6: configure, lease precedence, extend_lease, expiry without a sweeper,
-- attempts, fairness.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN EXECUTE q; RETURN 'no error';
EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE || ': ' || SQLERRM; END $$;
-- Seconds from now until the lease of the last pop of group g on queue q expires.
CREATE FUNCTION pg_temp.lease_secs(q text, g text) RETURNS int LANGUAGE sql AS $$
  SELECT round(extract(epoch FROM s.lease_expires_at - clock_timestamp()))::int
    FROM queen.status(q) s WHERE s.consumer_group = g AND s.lease_id IS NOT NULL $$;

-- Precedence: implicit queue 60 s; configure() 300 s; lease_time 5; lease_seconds wins.
SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'lq', 'payload', i)) FROM generate_series(1, 10) i));
SELECT count(*) FROM queen.pop('lq', 'g1');
SELECT pg_temp.lease_secs('lq', 'g1') AS implicit_60;
SELECT queen.configure('lq');
SELECT count(*) FROM queen.pop('lq', 'g2');
SELECT pg_temp.lease_secs('lq', 'g2') AS configured_300;
SELECT queen.configure('lq', lease_time => 5) ->> 'leaseTime' AS lease_time;
SELECT count(*) FROM queen.pop('lq', 'g3');
SELECT pg_temp.lease_secs('lq', 'g3') AS stored_5;
SELECT count(*) FROM queen.pop('lq', 'g4', lease_seconds => 2);
SELECT pg_temp.lease_secs('lq', 'g4') AS explicit_2;
SELECT queen.configure('lq', retry_limit => 7, dead_letter_queue => false, dedup_window => 60, retention => 3600);
SELECT name, lease_time, retry_limit, dead_letter_queue, dlq_after_max_retries, dedup_window, retention
  FROM queen.queues WHERE name = 'lq';
SELECT pg_temp.err($$SELECT queen.configure('lq', lease_time => 0)$$);
SELECT pg_temp.err($$SELECT queen.configure('lq', retry_limit => -1)$$);
SELECT pg_temp.err($$SELECT queen.configure('bad name')$$);
SELECT pg_temp.err($$SELECT queen.configure('lq', lease_time => NULL)$$);

-- extend_lease: two lanes under one lease, both renewed, never shortened.
SELECT count(*) FROM queen.push_batch('[{"queue": "ext", "partition": "a", "payload": 1},
                                        {"queue": "ext", "partition": "b", "payload": 2}]');
CREATE TEMP TABLE two AS SELECT * FROM queen.pop('ext', max_partitions => 2, batch => 2, lease_seconds => 30);
SELECT count(DISTINCT lease_id) AS leases, count(*) AS lanes FROM two;
CREATE TEMP TABLE e1 AS SELECT queen.extend_lease(lease_id, 120) AS r FROM two LIMIT 1;
SELECT r -> 'success' AS success, r -> 'renewed' AS renewed,
       r -> 'newExpiresAt' = r -> 'expiresAt' AND r -> 'expiresAt' = r -> 'lease_expires_at' AS same_three,
       round(extract(epoch FROM (r ->> 'expiresAt')::timestamptz - clock_timestamp())) AS earliest_in_s,
       r ->> 'expiresAt' ~ '^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$' AS iso_utc
  FROM e1;
SELECT partition, round(extract(epoch FROM s.lease_expires_at - clock_timestamp())) AS secs
  FROM queen.status('ext') s ORDER BY 1;
-- Fewer seconds than remain: unchanged.
SELECT (queen.extend_lease(lease_id, 10) ->> 'renewed')::int AS renewed FROM two LIMIT 1;
SELECT partition, round(extract(epoch FROM s.lease_expires_at - clock_timestamp())) AS secs
  FROM queen.status('ext') s ORDER BY 1;
SELECT pg_temp.err($$SELECT queen.extend_lease(gen_random_uuid(), 0)$$);
SELECT pg_temp.err($$SELECT queen.extend_lease(NULL)$$);
SELECT r - 'leaseId' AS unknown_lease FROM (SELECT queen.extend_lease(gen_random_uuid()) AS r) s;
-- Default seconds is 60 (and never shortens the 120 s above).
SELECT (queen.extend_lease(lease_id) ->> 'renewed')::int AS renewed FROM two LIMIT 1;

-- Expiry without a sweeper: an un-acked 1 s lease redelivers the whole span with a rising
-- attempt; no retry budget is charged; the expired lease can be neither extended nor acked.
SELECT count(*) FROM queen.push_batch('[{"queue": "exp", "payload": 1}, {"queue": "exp", "payload": 2}]');
CREATE TEMP TABLE x0 AS SELECT * FROM queen.pop('exp', batch => 2, lease_seconds => 1);
SELECT msg_offset, attempt FROM x0;
SELECT pg_sleep(1.1);
SELECT r -> 'success' AS success, r -> 'renewed' AS renewed, r -> 'expiresAt' AS expires
  FROM (SELECT queen.extend_lease(lease_id) AS r FROM x0 LIMIT 1) s;
CREATE TEMP TABLE x1 AS SELECT * FROM queen.pop('exp', batch => 2, lease_seconds => 1);
SELECT msg_offset, attempt, lease_id <> (SELECT lease_id FROM x0 LIMIT 1) AS new_lease FROM x1;
SELECT r -> 'items' -> 0 -> 'success' AS old_lease_ack, r -> 'lanes' AS lanes
  FROM (SELECT queen.ack(lease_id, partition_id, 2) AS r FROM x0 LIMIT 1) s;
SELECT pg_sleep(1.1);
SELECT msg_offset, attempt FROM queen.pop('exp', batch => 2, lease_seconds => 1);
SELECT committed, retry_count, attempt_count FROM queen.status('exp');
-- The attempt resets once the start moves: ack 1 of the live lease, let it expire, pop.
SELECT (queen.ack(s.lease_id, s.partition_id, 1) -> 'lanes' -> 0 ->> 'committed')::int AS committed
  FROM queen.status('exp') s;
SELECT pg_sleep(1.1);
SELECT msg_offset, attempt FROM queen.pop('exp', batch => 2);

-- Fairness: one partition with 10,000 messages and nine with 10 each. Ten pops with
-- max_partitions 1 and batch 10 are served from many partitions, not the deep one only.
SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'fair', 'partition', 'deep', 'payload', i)) FROM generate_series(1, 10000) i));
SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'fair', 'partition', 'p' || (i % 9), 'payload', i)) FROM generate_series(1, 90) i));
CREATE TEMP TABLE served (partition text);
DO $$ BEGIN
  FOR i IN 1..10 LOOP
    INSERT INTO served SELECT partition FROM queen.pop('fair', batch => 10, auto_ack => true);
  END LOOP;
END $$;
SELECT count(DISTINCT partition) >= 5 AS fair, count(*) AS messages FROM served;

-- max_partitions 4 and batch 10 over four lanes of 20: a pop fills its batch from one
-- lane, and the next pop goes on with the next lane, wrapping around.
SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'rr', 'partition', 'r' || (i % 4), 'payload', i)) FROM generate_series(1, 80) i));
CREATE TEMP TABLE rr (pop int, partition text, msg_offset bigint);
DO $$ BEGIN
  FOR i IN 1..6 LOOP
    INSERT INTO rr SELECT i, partition, msg_offset FROM queen.pop('rr', batch => 10, max_partitions => 4, auto_ack => true);
  END LOOP;
END $$;
SELECT pop, string_agg(DISTINCT partition, ',') AS lanes, min(msg_offset), max(msg_offset) FROM rr GROUP BY pop ORDER BY pop;

-- queen.max_lease (default 12 hours) bounds every lease: a pop's lease_seconds, an
-- extension's seconds and a queue's lease_time beyond it are refused; a stored lease time
-- or group budget beyond a lowered maximum is cut to it.
SELECT pg_temp.err($$SELECT queen.pop('lq', lease_seconds => 43201)$$);
SELECT pg_temp.err($$SELECT queen.configure('lq', lease_time => 43201)$$);
SELECT pg_temp.err($$SELECT queen.extend_lease(gen_random_uuid(), 43201)$$);
SELECT count(*) FROM queen.push('maxl', '1');
SELECT queen.configure('maxl', lease_time => 600) ->> 'leaseTime' AS lease_time;
SET queen.max_lease = '100s';
SELECT round(extract(epoch FROM lease_expires_at - clock_timestamp())) <= 100 AS cut_to_max
  FROM queen.pop('maxl');
SELECT pg_temp.err($$SELECT queen.pop('maxl', lease_seconds => 101)$$);
RESET queen.max_lease;

-- revoke_lease ends a lease now: its messages come back at once, counted as a redelivery,
-- and an ack under it changes nothing.
SELECT count(*) FROM queen.push('rv', '1');
CREATE TEMP TABLE rv AS SELECT lease_id FROM queen.pop('rv', lease_seconds => 3600);
SELECT queen.revoke_lease(lease_id) - 'leaseId' AS revoked FROM rv;
SELECT queen.revoke_lease(lease_id) - 'leaseId' AS again FROM rv;
SELECT (queen.ack(lease_id) -> 'lanes') = '[]' AS ack_changes_nothing FROM rv;
SELECT msg_offset, attempt FROM queen.pop('rv', auto_ack => true);
SELECT pg_temp.err($$SELECT queen.revoke_lease(NULL)$$);

-- A delete_queue that rolls back changes nothing: the queue's live leases still hold and ack.
SELECT count(*) FROM queen.push('dq', '1');
CREATE TEMP TABLE dq AS SELECT lease_id FROM queen.pop('dq', lease_seconds => 600);
BEGIN;
SELECT queen.delete_queue('dq') ->> 'deleted' AS deleted;
ROLLBACK;
SELECT lease_id IS NOT NULL AS still_leased FROM queen.status('dq');
SELECT queen.ack(lease_id) -> 'lanes' -> 0 ->> 'committed' AS committed FROM dq;

-- With preloading, a leasing pop writes nothing (its lease lives in shared memory): its
-- transaction gets no transaction id, so its commit writes no WAL. Nor do the reads of
-- peek and status. Without preloading the pop writes its lease row. A push, an ack and an
-- auto-ack pop write, and get one.
SELECT count(*) FROM queen.push('nx', '1');
SELECT count(*) FROM queen.push('nx', '2', 'b');
SELECT count(*) FROM queen.pop('nx', lease_seconds => 600);
-- A new session: its first pop also looks for lanes to repair, which it does without a lock
-- when none is missing.
\c
BEGIN;
SELECT lease_id AS nx_lease FROM queen.pop('nx', lease_seconds => 600) \gset
SELECT :'nx_lease'::uuid IS NOT NULL AS popped;
SELECT count(*) FROM queen.peek('nx');
SELECT count(*) FROM queen.status('nx');
SELECT (pg_current_xact_id_if_assigned() IS NULL) = (current_setting('shared_preload_libraries') ~ 'queen')
    AS xid_only_without_preloading;
COMMIT;
BEGIN;
SELECT queen.ack(:'nx_lease') -> 'lanes' -> 0 ->> 'committed' AS committed;
SELECT pg_current_xact_id_if_assigned() IS NOT NULL AS ack_has_xid;
COMMIT;
BEGIN;
SELECT count(*) FROM queen.push('nx', '3');
SELECT pg_current_xact_id_if_assigned() IS NOT NULL AS push_has_xid;
COMMIT;
SELECT count(*) FROM queen.push('nx', '4', 'b');
BEGIN;
SELECT msg_offset FROM queen.pop('nx', auto_ack => true);
SELECT pg_current_xact_id_if_assigned() IS NOT NULL AS auto_ack_has_xid;
COMMIT;
