-- Per-queue privileges (docs/functions.md, "Privileges"): queen.grant gives a role one
-- privilege on one queue and makes it a member of queen_grantee, which may call queen's
-- functions; such a role is limited to its queues at every entry point (42501 elsewhere,
-- listings filtered, so encrypted payloads decrypt only for a role granted on that
-- queue); members of the queen roles keep every queue; a role given EXECUTE directly
-- (0.3.0) keeps what it had.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
DO $$
DECLARE r text;
BEGIN
  FOR r IN SELECT rolname FROM pg_roles WHERE rolname IN ('qp_app', 'qp_ops', 'qp_legacy', 'qp_member', 'qp_nobody', 'qp_noinherit', 'qp_exporter') LOOP
    EXECUTE format('DROP OWNED BY %I', r);
    EXECUTE format('DROP ROLE %I', r);
  END LOOP;
END $$;
RESET client_min_messages;
\set VERBOSITY terse
-- A refused call, as its SQLSTATE and message.
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN EXECUTE q; RETURN 'no error';
EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE || ': ' || SQLERRM; END $$;
CREATE ROLE qp_app;
CREATE ROLE qp_ops;
CREATE ROLE qp_legacy;
CREATE ROLE qp_member IN ROLE queen_consumer;
CREATE ROLE qp_nobody;
CREATE ROLE qp_exporter;
CREATE ROLE qp_noinherit NOINHERIT IN ROLE qp_app;

-- Two queues: orders, and payroll, encrypted.
SET queen.encryption_key = '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
SELECT queen.configure('payroll', encryption => true) ->> 'encryption' AS encryption;
SELECT msg_offset FROM queen.push('orders', '{"order": 1}');
SELECT msg_offset FROM queen.push('payroll', '{"salary": 100}');
SELECT msg_offset FROM queen.push('payroll', '{"salary": 200}');
-- A lease on payroll and a dead letter there, for the checks by id below.
CREATE TABLE payroll_lease AS SELECT lease_id, partition_id FROM queen.pop('payroll', 'audit');
SELECT queen.ack(lease_id, partition_id, 1, 'dlq', 'bad') -> 'lanes' -> 0 -> 'committed' AS dead_lettered FROM payroll_lease;
CREATE TABLE payroll_lease2 AS SELECT lease_id FROM queen.pop('payroll', 'audit2');
GRANT SELECT ON payroll_lease2 TO qp_app, qp_ops;
-- A partition of orders, for the dead-letter calls below.
CREATE TABLE orders_partition AS
  SELECT p.partition_id FROM queen.partitions p JOIN queen.queues q USING (queue_id) WHERE q.name = 'orders';
GRANT SELECT ON orders_partition, payroll_lease TO qp_ops;

-- Only queen_admin grants; bad arguments.
SET ROLE qp_app;
SELECT pg_temp.err($$SELECT queen.grant('orders', 'qp_app', 'consume')$$);
RESET ROLE;
SELECT pg_temp.err($$SELECT queen.grant('orders', 'qp_app', 'read')$$);
SELECT pg_temp.err($$SELECT queen.grant('orders', 'no_such_role', 'consume')$$);
SELECT pg_temp.err($$SELECT queen.grant('orders', NULL, 'consume')$$);
SELECT pg_temp.err($$SELECT queen.grant('orders', 'queen_consumer', 'produce')$$);
SELECT pg_temp.err($$SELECT queen.revoke('orders', 'queen_admin', 'admin')$$);
SELECT pg_temp.err($$SELECT queen.grant('orders', 'queen_grantee', 'consume')$$);

-- A role with no queen role, granted consume and produce on orders: grant makes it a
-- member of queen_grantee, which has the schema and every API function; queen's checks
-- refuse it every other queue and privilege.
SELECT queen.grant('orders', 'qp_app', 'consume') - 'role' AS granted;
SELECT queen.grant('orders', 'qp_app', 'produce') ->> 'granted' AS granted;
SELECT queen.grant('orders', 'qp_app', 'produce') ->> 'granted' AS granted_again;
SELECT has_schema_privilege('qp_app', 'queen', 'USAGE') AS schema,
       has_function_privilege('qp_app', 'queen.pop(text, text, int, text, int, bool, int, int, text, bigint)', 'EXECUTE') AS pop,
       has_function_privilege('qp_app', 'queen.push(text, jsonb, text, text, jsonb, timestamptz)', 'EXECUTE') AS push,
       has_function_privilege('qp_app', 'queen.dlq(text, text, int, int)', 'EXECUTE') AS dlq,
       has_function_privilege('qp_app', 'queen.status(text)', 'EXECUTE') AS status,
       has_function_privilege('qp_app', 'queen.delete_queue(text)', 'EXECUTE') AS delete_queue,
       pg_has_role('qp_app', 'queen_grantee', 'MEMBER') AS grantee;

SET ROLE qp_app;
SELECT msg_offset FROM queen.push('orders', '{"order": 2}');
SELECT msg_offset, payload FROM queen.pop('orders', batch => 10, auto_ack => true);
-- Every other queue is refused, by name or by id, a new one included.
SELECT pg_temp.err($$SELECT msg_offset FROM queen.push('payroll', '{"salary": 0}')$$);
SELECT pg_temp.err($$SELECT msg_offset FROM queen.push_batch('[{"queue": "orders", "payload": 3}, {"queue": "payroll", "payload": 4}]')$$);
SELECT pg_temp.err($$SELECT msg_offset FROM queen.push('brand_new', '1')$$);
SELECT pg_temp.err($$SELECT payload FROM queen.pop('payroll', batch => 10)$$);
SELECT pg_temp.err($$SELECT payload FROM queen.pop('payroll', 'thief', batch => 10)$$);
SELECT pg_temp.err($$SELECT queen.ack(lease_id) FROM payroll_lease2$$);
SELECT pg_temp.err($$SELECT queen.extend_lease(lease_id, 60) FROM payroll_lease2$$);
SELECT pg_temp.err($$SELECT queen.may_start(lease_id) FROM payroll_lease2$$);
SELECT pg_temp.err($$SELECT data FROM queen.dlq('payroll')$$);
-- Listings show its queues only: the payroll dead letter is not there.
SELECT queue, data FROM queen.dlq();
-- A privilege it does not hold on its own queue: queen's refusal.
SELECT pg_temp.err($$SELECT * FROM queen.status('orders')$$);
SELECT pg_temp.err($$SELECT queen.delete_queue('orders')$$);
RESET ROLE;
-- The refused calls changed nothing: payroll still holds its messages for a new group,
-- and no queue brand_new was created.
SELECT msg_offset, payload FROM queen.pop('payroll', 'check', batch => 10, auto_ack => true);
SELECT count(*) AS brand_new FROM queen.queues WHERE name = 'brand_new';

-- A per-queue admin of payroll: everything about payroll, nothing about orders.
SELECT queen.grant('payroll', 'qp_ops', 'admin') ->> 'granted' AS granted;
SET ROLE qp_ops;
SELECT queue, consumer_group, messages FROM queen.totals() ORDER BY 1, 2;
SELECT DISTINCT queue FROM queen.status();
SELECT DISTINCT queue FROM queen.metrics() WHERE queue IS NOT NULL;
SELECT NOT EXISTS (SELECT 1 FROM queen.metrics() WHERE metric LIKE 'maintenance%' OR metric LIKE 'retention%') AS maintenance_hidden;
SELECT queen.configure('payroll', retry_limit => 5, encryption => true) ->> 'retryLimit' AS retry_limit;
SELECT pg_temp.err($$SELECT queen.configure('orders', retry_limit => 5)$$);
SELECT pg_temp.err($$SELECT * FROM queen.totals('orders')$$);
SELECT pg_temp.err($$SELECT queen.seek('orders', '__QUEUE_MODE__', to_offset => 1)$$);
SELECT pg_temp.err($$SELECT queen.drop_group('orders', 'x')$$);
SELECT pg_temp.err($$SELECT queen.delete_queue('orders')$$);
SELECT pg_temp.err($$SELECT queen.retain()$$);
SELECT queue, privilege FROM queen.grants('payroll');
SELECT pg_temp.err($$SELECT * FROM queen.grants()$$);
SELECT pg_temp.err($$SELECT queen.grant('payroll', 'qp_app', 'consume')$$);
-- Dead letters of orders are none of its business, there or not (42501, never P0002,
-- which would say whether one is there); of payroll, a missing one is P0002.
SELECT left(pg_temp.err(format($$SELECT queen.dlq_delete(%L, 'nothing here')$$, partition_id)), 5) AS orders_delete,
       left(pg_temp.err(format($$SELECT queen.dlq_replay(%L, 'nothing here', gen_random_uuid())$$, partition_id)), 5) AS orders_replay
  FROM orders_partition;
SELECT left(pg_temp.err(format($$SELECT queen.dlq_delete(%L, 'nothing here')$$, partition_id)), 5) AS payroll_delete
  FROM payroll_lease;
-- It consumes payroll (decrypted: it may), and its dead letter.
SELECT msg_offset, payload FROM queen.pop('payroll', 'ops', batch => 10, auto_ack => true);
SELECT queue, data, error_message FROM queen.dlq();
SELECT queen.revoke_lease(lease_id) -> 'revoked' AS revoked FROM payroll_lease2;
RESET ROLE;

-- An application's SECURITY DEFINER function, owned by that limited role, called by a role
-- with no queen rights at all: it lends the owner's EXECUTE, not a scope. The caller, never
-- granted a queue and holding no EXECUTE of its own, gets 42501 on every queue (before:
-- every queue's rows, as a 0.3.0 role).
CREATE SCHEMA qp_wrap AUTHORIZATION qp_ops;
SET ROLE qp_ops;
CREATE FUNCTION qp_wrap.peek(q text) RETURNS SETOF jsonb LANGUAGE sql SECURITY DEFINER
  SET search_path = pg_catalog AS $f$ SELECT payload FROM queen.peek(q) $f$;
GRANT USAGE ON SCHEMA qp_wrap TO qp_nobody;
GRANT EXECUTE ON FUNCTION qp_wrap.peek(text) TO qp_nobody;
RESET ROLE;
SET ROLE qp_nobody;
SELECT pg_temp.err($$SELECT * FROM qp_wrap.peek('orders')$$);
SELECT pg_temp.err($$SELECT * FROM qp_wrap.peek('payroll')$$);
RESET ROLE;
DROP SCHEMA qp_wrap CASCADE;

-- A wrapper owned by a grantee (which may call every queen function), called by a role
-- given EXECUTE on metrics alone (0.3.0's finer grants, a monitoring role): a 0.3.0 role
-- reaches every queue only through the functions it may call itself, so the wrapper's
-- delete_queue is refused (before: the monitoring role counted as an admin of every
-- queue, and the wrapper deleted payroll).
GRANT USAGE ON SCHEMA queen TO qp_exporter;
GRANT EXECUTE ON FUNCTION queen.metrics(text) TO qp_exporter;
CREATE SCHEMA qp_wrap AUTHORIZATION qp_app;
SET ROLE qp_app;
CREATE FUNCTION qp_wrap.drop(q text) RETURNS jsonb LANGUAGE sql SECURITY DEFINER
  SET search_path = pg_catalog AS $f$ SELECT queen.delete_queue(q) $f$;
GRANT USAGE ON SCHEMA qp_wrap TO qp_exporter;
GRANT EXECUTE ON FUNCTION qp_wrap.drop(text) TO qp_exporter;
RESET ROLE;
SET ROLE qp_exporter;
SELECT pg_temp.err($$SELECT qp_wrap.drop('payroll')$$);
-- Its own function, metrics, it may use on every queue.
SELECT DISTINCT queue FROM queen.metrics() WHERE queue IS NOT NULL ORDER BY 1;
RESET ROLE;
SELECT count(*) AS payroll_kept FROM queen.queues WHERE name = 'payroll';
DROP SCHEMA qp_wrap CASCADE;

-- A limited role's code run by a more privileged role counts as the limited role's: its
-- SECURITY DEFINER function called by a superuser, and its index expression evaluated by
-- a superuser's CREATE INDEX (as ANALYZE or autovacuum would, running it as the table's
-- owner), are refused their grant of admin on payroll (42501; before, queen asked only
-- the session's role, the superuser, and granted it).
CREATE SCHEMA qp_sec AUTHORIZATION qp_app;
SET ROLE qp_app;
CREATE FUNCTION qp_sec.lure() RETURNS jsonb LANGUAGE sql SECURITY DEFINER
  SET search_path = pg_catalog AS $f$ SELECT queen.grant('payroll', 'qp_app', 'admin') $f$;
CREATE FUNCTION qp_sec.k(x int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $f$
BEGIN PERFORM queen.grant('payroll', 'qp_app', 'admin'); RETURN x; END $f$;
CREATE TABLE qp_sec.t (x int);
INSERT INTO qp_sec.t VALUES (1);
RESET ROLE;
SELECT pg_temp.err($$SELECT qp_sec.lure()$$);
SELECT pg_temp.err($$CREATE INDEX ON qp_sec.t (qp_sec.k(x))$$);
SELECT count(*) AS qp_app_payroll_grants FROM queen.grants('payroll') WHERE role = 'qp_app';
DROP SCHEMA qp_sec CASCADE;

-- A member of queen_consumer keeps every queue for consuming, and a queue grant limits
-- it only for the privileges it does not have through a queen role.
SELECT queen.grant('orders', 'qp_member', 'admin') ->> 'granted' AS granted;
SET ROLE qp_member;
SELECT msg_offset, payload FROM queen.pop('payroll', 'member', batch => 10, auto_ack => true);
SELECT queen.configure('orders', retry_limit => 4) ->> 'retryLimit' AS retry_limit;
SELECT pg_temp.err($$SELECT queen.configure('payroll', retry_limit => 4, encryption => true)$$);
RESET ROLE;

-- A role given EXECUTE directly (0.3.0's finer grants) and no queue grant: every queue.
GRANT USAGE ON SCHEMA queen TO qp_legacy;
GRANT EXECUTE ON FUNCTION queen.pop(text, text, int, text, int, bool, int, int, text, bigint) TO qp_legacy;
SET ROLE qp_legacy;
SELECT msg_offset, payload FROM queen.pop('orders', 'legacy', batch => 10, auto_ack => true);
SELECT msg_offset FROM queen.pop('payroll', 'legacy', batch => 10, auto_ack => true);
RESET ROLE;
-- Given EXECUTE on dlq_replay alone (an admin function), it may replay: the replay's
-- push needs admin on the queue, not produce.
CREATE TABLE legacy_letter AS SELECT partition_id, transaction_id, id FROM queen.log_dlq LIMIT 1;
GRANT SELECT ON legacy_letter TO qp_legacy;
GRANT EXECUTE ON FUNCTION queen.dlq_replay(uuid, text, uuid) TO qp_legacy;
SET ROLE qp_legacy;
SELECT queen.dlq_replay(partition_id, transaction_id, id) ->> 'replayed' AS replayed FROM legacy_letter;
RESET ROLE;
DROP TABLE legacy_letter;

-- A NOINHERIT member of qp_app has none of its rights, and is limited all the same: given
-- EXECUTE directly, it still reaches no queue that qp_app was not granted (42501), nor
-- orders (its grants are qp_app's, whose privileges it does not have).
GRANT USAGE ON SCHEMA queen TO qp_noinherit;
GRANT EXECUTE ON FUNCTION queen.pop(text, text, int, text, int, bool, int, int, text, bigint) TO qp_noinherit;
SET ROLE qp_noinherit;
SELECT pg_temp.err($$SELECT payload FROM queen.pop('payroll', 'noinherit')$$);
SELECT pg_temp.err($$SELECT payload FROM queen.pop('orders', 'noinherit')$$);
RESET ROLE;

-- revoke takes the privilege back; the role stays a member of queen_grantee, limited to
-- what it has left.
SELECT queen.revoke('orders', 'qp_app', 'consume') - 'role' AS revoked;
SELECT queen.revoke('orders', 'qp_app', 'consume') ->> 'revoked' AS revoked_again;
SELECT pg_has_role('qp_app', 'queen_grantee', 'MEMBER') AS grantee;
SET ROLE qp_app;
SELECT pg_temp.err($$SELECT payload FROM queen.pop('orders')$$);
SELECT msg_offset FROM queen.push('orders', '{"order": 5}');
RESET ROLE;

-- In one statement, a per-queue admin deletes its one queue, then reads another: a role
-- whose last grant went stays limited, to no queue, while it may still call every queen
-- function (42501; the statement rolls back, payroll stays).
SET ROLE qp_ops;
SELECT pg_temp.err($$SELECT s.d, x.payload FROM (SELECT queen.delete_queue('payroll') AS d OFFSET 0) s
                      CROSS JOIN LATERAL queen.peek(CASE WHEN s.d IS NOT NULL THEN 'orders' END) x$$);
RESET ROLE;
SELECT count(*) AS payroll_kept FROM queen.queues WHERE name = 'payroll';

-- A per-queue admin deletes its queue: the grant goes with it; the role does not become
-- one allowed on every queue.
SET ROLE qp_ops;
SELECT queen.delete_queue('payroll') ->> 'deleted' AS deleted;
SELECT pg_temp.err($$SELECT payload FROM queen.pop('orders')$$);
RESET ROLE;
SELECT pg_has_role('qp_ops', 'queen_grantee', 'MEMBER') AS grantee, count(*) AS grants
  FROM queen.grants() WHERE role = 'qp_ops';
-- It stays limited, to no queue (a member of queen_grantee), also when given EXECUTE
-- directly.
GRANT USAGE ON SCHEMA queen TO qp_ops;
GRANT EXECUTE ON FUNCTION queen.pop(text, text, int, text, int, bool, int, int, text, bigint) TO qp_ops;
SET ROLE qp_ops;
SELECT pg_temp.err($$SELECT payload FROM queen.pop('orders')$$);
RESET ROLE;

-- The membership is the mark; a role that holds a grant is limited without it too (a
-- superuser took the membership away, or a restore into a cluster whose roles were made
-- by hand): given EXECUTE on pop directly, qp_app (produce on orders) still may not
-- consume orders.
REVOKE queen_grantee FROM qp_app;
GRANT USAGE ON SCHEMA queen TO qp_app;
GRANT EXECUTE ON FUNCTION queen.pop(text, text, int, text, int, bool, int, int, text, bigint) TO qp_app;
SET ROLE qp_app;
SELECT pg_temp.err($$SELECT payload FROM queen.pop('orders', 'direct')$$);
RESET ROLE;
-- A role with no grant left returns to the 0.3.0 model when a superuser takes its
-- membership: qp_ops, given EXECUTE on pop directly above, pops every queue again.
REVOKE queen_grantee FROM qp_ops;
SET ROLE qp_ops;
SELECT msg_offset FROM queen.pop('orders', 'ops_again', batch => 1, auto_ack => true);
RESET ROLE;
-- A grant takes back EXECUTE given to the role itself (its membership gives what it
-- needs; a direct right would make it a 0.3.0 role in a restore without the membership).
SELECT count(*) AS direct_before FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) a
 WHERE p.pronamespace = 'queen'::regnamespace AND a.grantee = 'qp_legacy'::regrole;
SELECT queen.grant('orders', 'qp_legacy', 'consume') ->> 'granted' AS granted;
SELECT count(*) AS direct_after FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) a
 WHERE p.pronamespace = 'queen'::regnamespace AND a.grantee = 'qp_legacy'::regrole;

-- Clean up (roles are cluster-wide).
DROP TABLE payroll_lease, payroll_lease2, orders_partition;
SET client_min_messages = warning;
DROP OWNED BY qp_app, qp_ops, qp_legacy, qp_member, qp_nobody, qp_noinherit, qp_exporter;
DROP ROLE qp_app, qp_ops, qp_legacy, qp_member, qp_nobody, qp_noinherit, qp_exporter;
