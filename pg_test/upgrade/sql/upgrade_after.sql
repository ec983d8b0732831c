-- Upgrade test, part 2 (scripts/upgrade_test.sh): the server now runs the current
-- library over the data 0.3.0 wrote. ALTER EXTENSION queen UPDATE, then the data and
-- behaviour are intact, and the upgraded catalog is exactly a fresh install's.
SELECT extversion FROM pg_extension WHERE extname = 'queen';
-- Before the update, 0.3.0's configure, _lane (under status), dlq_delete and dlq_replay reach
-- C symbols this library keeps only to say so; a pop finds the schema older than the
-- library.
\set VERBOSITY sqlstate
SELECT queen.configure('up');
SELECT queen.configure_group('up', 'audit');
SELECT count(*) FROM queen.status('up');
SELECT queen.dlq_delete(partition_id, transaction_id) FROM queen.log_dlq LIMIT 1;
SELECT queen.dlq_replay(partition_id, transaction_id) FROM queen.log_dlq LIMIT 1;
-- A pop reads 0.4.0's columns (pause, ttl): it asks for the update too.
SELECT count(*) FROM queen.pop('up', 'audit');
\set VERBOSITY default
-- A push needs none of them: it works before the update (with no depth limit).
SELECT count(*) FROM queen.push('up', '"before the update"', partition => 'pre');
-- The update warns of the later copies of dead letters it removed (one:
-- upgrade_before.sql filed a second copy).
ALTER EXTENSION queen UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'queen';
-- The allowance 0.3.0 stored negative (wrapped) is 365 days now (the update warned), and
-- the group's pops work.
SELECT handler_timeout, queue_margin FROM queen.groups WHERE consumer_group = 'forever';
SELECT count(*) FROM queen.pop('up-huge', 'forever');
-- queen.configure, queen.configure_group, queen.dlq_replay and queen.dlq_delete were
-- replaced (new arguments): who could call them still can, with the grant option they had;
-- the app's direct grants still work on every queue (it holds no queue grant).
SELECT has_function_privilege('Queen Upgrade-Ops',
         'queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, interval, bool, interval, interval, bigint, interval)',
         'EXECUTE WITH GRANT OPTION') AS ops_can_configure;
SELECT has_function_privilege('Queen Upgrade-Ops',
         'queen.configure_group(text, text, interval, interval, interval, interval, bigint, text)', 'EXECUTE')
         AS ops_can_configure_group,
       has_function_privilege('Queen Upgrade-Ops',
         'queen.configure_group(text, text, interval, interval, interval, interval, bigint, text)',
         'EXECUTE WITH GRANT OPTION') AS with_grant_option;
SELECT has_function_privilege('Queen Upgrade-Ops', 'queen.dlq_delete(uuid, text, uuid)', 'EXECUTE')
         AS ops_can_dlq_delete,
       has_function_privilege('Queen Upgrade-Ops', 'queen.dlq_replay(uuid, text, uuid)', 'EXECUTE')
         AS ops_can_dlq_replay;
SET ROLE queen_upgrade_app;
SELECT msg_offset FROM queen.push('elsewhere', '1');
SELECT msg_offset, payload FROM queen.pop('elsewhere', auto_ack => true);
RESET ROLE;
REVOKE EXECUTE ON FUNCTION queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, interval, bool, interval, interval, bigint, interval)
  FROM "Queen Upgrade-Ops" CASCADE;
REVOKE EXECUTE ON FUNCTION queen.configure_group(text, text, interval, interval, interval, interval, bigint, text)
  FROM "Queen Upgrade-Ops";
REVOKE EXECUTE ON FUNCTION queen.dlq_delete(uuid, text, uuid), queen.dlq_replay(uuid, text, uuid) FROM "Queen Upgrade-Ops";
REVOKE EXECUTE ON FUNCTION queen.pop(text, text, int, text, int, bool, int, int, text, bigint) FROM queen_upgrade_app;
REVOKE EXECUTE ON FUNCTION queen.push(text, jsonb, text, text, jsonb, timestamptz) FROM queen_upgrade_app;
REVOKE USAGE ON SCHEMA queen FROM queen_upgrade_app;
DROP ROLE queen_upgrade_app;
DROP ROLE "Queen Upgrade-Ops";

-- The lease taken under 0.3.0 lived in shared memory: gone with the restart (an ack
-- under it changes nothing), and its message is delivered again.
SELECT queen.ack(lease_id) -> 'lanes' AS lanes FROM held LIMIT 1;
DROP TABLE held;
SELECT partition, msg_offset, payload, attempt FROM queen.pop('up', partition => 'a', auto_ack => true);
-- audit's cursor on b survived (from the lane journal 0.3.0 wrote): nothing again there.
SELECT partition, msg_offset FROM queen.pop('up', 'audit', batch => 10, max_partitions => 2, auto_ack => true);
-- The dead letter filed by 0.3.0 (the upgrade removed its later copy).
SELECT partition, consumer_group, data, error_message FROM queen.dlq('up');
-- The producer id 0.3.0 recorded is still a duplicate; new offsets continue.
SELECT status, msg_offset FROM queen.push('up', '4', 'a', transaction_id => 'once');
SELECT msg_offset FROM queen.push('up', '5', 'a');
-- New in 0.4.0: queue options, per-queue grants, dropping a partition, revoking a lease.
SELECT queen.configure('up', create_groups => false, partition_idle_ttl => '1 day')
         - 'leaseTime' - 'dedupWindow' - 'retention' - 'encryption' - 'delay' - 'retryLimit' - 'retryBackoff'
         - 'retryBackoffMax' - 'deadLetterQueue' - 'dlqAfterMaxRetries' AS options;
\set VERBOSITY sqlstate
SELECT count(*) FROM queen.pop('up', 'newcomer');
\set VERBOSITY default
CREATE ROLE queen_upgrade_one;
SELECT queen.grant('up', 'queen_upgrade_one', 'consume') - 'role' AS granted;
SELECT queue, privilege FROM queen.grants('up');
SELECT queen.revoke('up', 'queen_upgrade_one', 'consume') - 'role' AS revoked;
DROP ROLE queen_upgrade_one;
SELECT count(*) FROM queen.push('up', '"other"', 'c');
SELECT count(*) FROM queen.pop('up', partition => 'c', auto_ack => true);
SELECT count(*) FROM queen.pop('up', 'audit', partition => 'c', auto_ack => true);
SELECT queen.drop_partition('up', 'c') - 'segments' AS dropped;
SELECT queen.revoke_lease(gen_random_uuid()) - 'leaseId' AS revoked_nothing;
SELECT * FROM queen.totals('up');

-- Every object, column, default, index, function setting, privilege and comment, and the
-- tables a dump holds.
CREATE FUNCTION pg_temp.queen_catalog() RETURNS SETOF text LANGUAGE sql AS $$
  SELECT 'member ' || pg_describe_object(d.classid, d.objid, d.objsubid)
    FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
   WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e' AND e.extname = 'queen'
  UNION ALL
  SELECT format('column %s.%s %s not null %s default %s', c.relname, a.attname,
                format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(ad.adbin, ad.adrelid))
    FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
   WHERE n.nspname = 'queen' AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
  SELECT format('schema %s acl %s', n.nspname, n.nspacl) FROM pg_namespace n WHERE n.nspname = 'queen'
  UNION ALL
  SELECT format('relation %s %s %s %s', c.relname, c.relkind, c.reloptions, c.relacl)
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'queen'
  UNION ALL
  SELECT format('constraint %s on %s: %s', co.conname, co.conrelid::regclass, pg_get_constraintdef(co.oid))
    FROM pg_constraint co WHERE co.connamespace = 'queen'::regnamespace
  UNION ALL
  SELECT 'index ' || pg_get_indexdef(i.indexrelid)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
   WHERE n.nspname = 'queen'
  UNION ALL
  SELECT format('function %s(%s) returns %s definer %s volatility %s strict %s config %s acl %s body %s',
                p.proname, pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid),
                p.prosecdef, p.provolatile, p.proisstrict, p.proconfig, p.proacl, md5(p.prosrc))
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'queen'
  UNION ALL
  SELECT format('comment %s: %s', pg_describe_object(ds.classoid, ds.objoid, ds.objsubid), ds.description)
    FROM pg_description ds
    JOIN pg_depend d ON d.classid = ds.classoid AND d.objid = ds.objoid AND d.deptype = 'e'
    JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'queen'
  UNION ALL
  -- what pg_dump dumps of the tables (pg_extension_config_dump), and with which filter
  SELECT format('dumped %s %s', x.rel::regclass, x.cond)
    FROM pg_extension e CROSS JOIN LATERAL unnest(e.extconfig, e.extcondition) AS x(rel, cond)
   WHERE e.extname = 'queen'
$$;
CREATE TEMP TABLE upgraded AS SELECT * FROM pg_temp.queen_catalog() AS x(line);
SET client_min_messages = warning;
DROP EXTENSION queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;
CREATE TEMP TABLE fresh AS SELECT * FROM pg_temp.queen_catalog() AS x(line);
SELECT count(*) > 100 AS compared_many_lines FROM fresh;
SELECT 'only after the upgrade' AS side, line FROM (TABLE upgraded EXCEPT ALL TABLE fresh) u
UNION ALL
SELECT 'only in a fresh install', line FROM (TABLE fresh EXCEPT ALL TABLE upgraded) f
ORDER BY 1, 2;
