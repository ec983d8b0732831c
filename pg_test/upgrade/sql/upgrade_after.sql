-- Upgrade test, part 2 (scripts/upgrade_test.sh): the server now runs the current
-- library over the data 0.2.0 wrote. ALTER EXTENSION queen UPDATE, then the data and
-- behaviour are intact, and the upgraded catalog is exactly a fresh install's.
SELECT extversion FROM pg_extension WHERE extname = 'queen';
-- Before the update, 0.2.0's pop reaches a C symbol this library keeps only to say so.
\set VERBOSITY sqlstate
SELECT count(*) FROM queen.pop('up');
\set VERBOSITY default
ALTER EXTENSION queen UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'queen';
-- queen.pop was replaced (max_bytes) and queen.push too (headers): who could pop or push
-- still can.
SELECT has_function_privilege('queen_upgrade_app',
         'queen.pop(text, text, int, text, int, bool, int, int, text, bigint)', 'EXECUTE') AS app_can_pop,
       has_function_privilege('Queen Upgrade-Ops',
         'queen.pop(text, text, int, text, int, bool, int, int, text, bigint)', 'EXECUTE WITH GRANT OPTION') AS ops_can_grant;
SELECT has_function_privilege('queen_upgrade_app', 'queen.push(text, jsonb, text, text, jsonb, timestamptz)', 'EXECUTE')
         AS app_can_push,
       has_function_privilege('queen_upgrade_app', 'queen.ack(uuid, uuid, bigint, text, text, interval)', 'EXECUTE')
         AS app_can_ack,
       has_function_privilege('Queen Upgrade-Ops',
         'queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, interval)', 'EXECUTE')
         AS ops_can_configure;
REVOKE EXECUTE ON FUNCTION queen.pop(text, text, int, text, int, bool, int, int, text, bigint)
  FROM queen_upgrade_app, "Queen Upgrade-Ops" CASCADE;
REVOKE EXECUTE ON FUNCTION queen.push(text, jsonb, text, text, jsonb, timestamptz) FROM queen_upgrade_app;
REVOKE EXECUTE ON FUNCTION queen.ack(uuid, uuid, bigint, text, text, interval) FROM queen_upgrade_app;
REVOKE EXECUTE ON FUNCTION queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, interval)
  FROM "Queen Upgrade-Ops";
DROP ROLE queen_upgrade_app;
DROP ROLE "Queen Upgrade-Ops";
-- New in 0.3.0: explicit consumer groups.
SELECT queen.create_group('up', 'deploy', 'new') - 'lanes' AS created;
SELECT queen.drop_group('up', 'deploy') AS dropped;

-- The lease taken under 0.2.0 is live and acks; the partition goes on after it.
SELECT queen.ack(lease_id) -> 'lanes' -> 0 -> 'committed' AS committed FROM held LIMIT 1;
DROP TABLE held;
SELECT partition, msg_offset, payload FROM queen.pop('up', partition => 'a', auto_ack => true);
-- audit's cursor on b survived (nothing again there); a is still all unread.
-- (segments in format 1, written by 0.2.0: no headers)
SELECT partition, msg_offset, headers FROM queen.pop('up', 'audit', batch => 10, max_partitions => 2, auto_ack => true);
-- The dead letter filed by 0.2.0 has no headers.
SELECT partition, consumer_group, data, error_message, headers FROM queen.dlq('up');
-- New offsets continue after the ones 0.2.0 handed out; a rolled-back push is a gap now.
SELECT msg_offset FROM queen.push('up', '4', 'a');
BEGIN;
SELECT msg_offset FROM queen.push('up', '"rolled back"', 'a');
ROLLBACK;
SELECT msg_offset FROM queen.push('up', '6', 'a', headers => '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}');
SELECT * FROM queen.totals('up');
SELECT queen.retain('up') - 'bytesDeleted' AS pass;
-- New in 0.3.0: compaction over the fresh tier (the two single pushes after the upgrade:
-- too few and too young to merge yet).
SELECT queen.compact('up') AS compacted;
-- Retention over segments 0.2.0 wrote: once both groups have read everything and the
-- window has passed, every segment goes, and the partitions remember how far.
SELECT count(*) FROM queen.pop('up', batch => 10, partition => 'a', auto_ack => true);
-- Pushed after the upgrade: headers where they were given.
SELECT msg_offset, payload, headers FROM queen.pop('up', 'audit', batch => 10, partition => 'a', auto_ack => true);
SELECT queen.configure('up', retention => 1) ->> 'retention' AS retention;
SELECT pg_sleep(1.1);
SELECT queen.retain('up') - 'bytesDeleted' AS pass;
SELECT name, retained_through FROM queen.partitions ORDER BY name;
SELECT (SELECT count(*) FROM queen.segments) + (SELECT count(*) FROM queen.fresh_segments) AS segments_left;

-- Every object, column, default, index, function setting, privilege and comment.
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
