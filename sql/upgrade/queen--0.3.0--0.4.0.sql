-- queen 0.3.0 -> 0.4.0 (ALTER EXTENSION queen UPDATE TO '0.4.0'): the hand-written part.
-- The upgrade script is built from this file by scripts/upgrade_sql.py: what is above the
-- `-- @functions` line, then every function of the 0.4.0 install script (CREATE OR
-- REPLACE, with its COMMENT, GRANT, REVOKE and ALTER FUNCTION), then what is below the
-- line. Only table and data changes, DROPs (a function whose arguments or result type
-- changed, or that went away) and what must follow the functions are written here.
-- Tested by scripts/upgrade_test.sh: 0.3.0 writes data, the server restarts on the 0.4.0
-- library, this script runs, and the data, the behaviour and the catalog (compared with a
-- fresh 0.4.0 install) must be intact.
--
-- 0.4.0: readers that act see committed lane state only; a maintenance worker in every
-- database; maintenance that never stops; fault-tolerant shared state; limits by policy
-- (queen.max_lease, revoke_lease, create_groups, per-queue privileges); fair pops for new
-- connections; no stall behind maintenance; bounded pop and compaction memory; partition
-- churn bounded (drop_partition, partition_idle_ttl, dedup expiry).
--
-- Roles that were given EXECUTE on queen's functions directly keep what they had, each
-- function on every queue: a role is limited to single queues once it is granted one with
-- queen.grant, in any database of the cluster (it becomes a member of queen_grantee; so is
-- a role that is a member of such a role, with or without INHERIT).

-- A new install needs a UTF8 database (sql/schema.sql). An install made before that rule
-- in a database of another encoding is updated all the same, so as not to strand it, with
-- a warning: there distinct non-UTF-8 transaction ids can read as one (docs/concepts.md,
-- "Limits").
DO $encoding$
BEGIN
  IF pg_catalog.getdatabaseencoding() <> 'UTF8' THEN
    RAISE WARNING 'queen: this database''s encoding is %; queen needs a UTF8 database, and new installs refuse others',
      pg_catalog.getdatabaseencoding()
      USING HINT = 'Move queen''s queues to a UTF8 database: transaction ids that are not valid UTF-8 can be taken for duplicates here.';
  END IF;
END $encoding$;

-- New queue options (src/api/configure.rs).
ALTER TABLE queen.queues
  ADD COLUMN create_groups      bool     NOT NULL DEFAULT true,
  ADD COLUMN partition_idle_ttl interval NOT NULL DEFAULT '0s';

-- Pause and resume (src/api/pause.rs): a flag per queue and per group, which status and
-- totals show in a new last column.
ALTER TABLE queen.queues ADD COLUMN paused bool NOT NULL DEFAULT false;
ALTER TABLE queen.groups ADD COLUMN paused bool NOT NULL DEFAULT false;
ALTER TYPE queen.lane_status ADD ATTRIBUTE paused bool;
ALTER TYPE queen.queue_totals ADD ATTRIBUTE paused bool;

-- Purge (src/api/groups.rs): a dead-letter row can be a span of offsets passed without
-- delivery, with no payload.
ALTER TABLE queen.log_dlq ADD COLUMN last_offset bigint,
  DROP CONSTRAINT log_dlq_check,
  ADD CONSTRAINT log_dlq_check CHECK ((data IS NULL) <> (envelope IS NULL) OR last_offset IS NOT NULL);

-- Message TTL (configure's ttl) and the reason of each dead letter, which queen.dlq lists.
-- A 0.3.0 dead letter keeps 'failed', the reason of nearly all of them (those a pop filed
-- because it could not open or decode them are not told apart).
ALTER TABLE queen.queues ADD COLUMN ttl interval NOT NULL DEFAULT '0s';
ALTER TABLE queen.log_dlq ADD COLUMN reason text NOT NULL DEFAULT 'failed'
  CHECK (reason IN ('failed', 'unreadable', 'expired', 'purged', 'skipped'));
ALTER TYPE queen.dead_letter ADD ATTRIBUTE reason text;

-- A group files a message once (src/ops/dlq.rs), now by a unique index: 0.3.0 looked
-- under the snapshot, so two pops under REPEATABLE READ could file the same message
-- twice, and 0.1.0 and 0.2.0 filed a message again each time a group failed it (after a
-- seek back). Those later rows of the same message and group are removed first, with a
-- WARNING of how many (an extension script's NOTICEs are not shown); the earliest stays
-- (the one dlq_replay and dlq_delete take).
DO $dedup$
DECLARE
  removed bigint;
BEGIN
  DELETE FROM queen.log_dlq d
   USING queen.log_dlq e
   WHERE d.last_offset IS NULL AND e.last_offset IS NULL
     AND d.partition_id = e.partition_id AND d.consumer_group = e.consumer_group
     AND d.msg_offset = e.msg_offset AND d.transaction_id = e.transaction_id
     AND (d.failed_at, d.id) > (e.failed_at, e.id);
  GET DIAGNOSTICS removed = ROW_COUNT;
  IF removed > 0 THEN
    RAISE WARNING 'queen: removed % later dead letters of messages a group had already filed (the earliest of each stays)', removed;
  END IF;
END
$dedup$;
CREATE UNIQUE INDEX log_dlq_message ON queen.log_dlq (partition_id, consumer_group, msg_offset, transaction_id)
  WHERE last_offset IS NULL;

-- Maximum depth (configure's max_depth) and each group's overflow policy (configure_group's
-- max_lag and on_overflow): src/api/overflow.rs, queen_core::overflow.
ALTER TABLE queen.queues ADD COLUMN max_depth bigint;
-- How long a queue keeps its dead letters (configure's dlq_retention; 0: for ever), found
-- by age (src/storage/churn.rs).
ALTER TABLE queen.queues ADD COLUMN dlq_retention interval NOT NULL DEFAULT '0s';
CREATE INDEX log_dlq_queue_age ON queen.log_dlq (queue_id, failed_at);
ALTER TABLE queen.groups ADD COLUMN max_lag bigint,
  ADD COLUMN on_overflow text NOT NULL DEFAULT 'hold' CHECK (on_overflow IN ('hold', 'skip'));

-- Rate limits and concurrency caps (queen.configure_limit, src/lane/limits.rs).
CREATE TABLE queen.limits (
    queue_id        bigint  NOT NULL,
    consumer_group  text    NOT NULL,
    key             text    NOT NULL,
    rate            numeric,
    burst           int,
    max_in_flight   int,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, consumer_group, key),
    FOREIGN KEY (queue_id, consumer_group) REFERENCES queen.groups ON DELETE CASCADE
);
COMMENT ON TABLE queen.limits IS 'queen: rate limits and concurrency caps per consumer group and key';
REVOKE ALL ON queen.limits FROM PUBLIC;

-- Rate-limit buckets kept in a table (src/lane/limits.rs): every bucket when the library
-- is not preloaded, and a key's bucket when shared memory has no room for it. A pop
-- locks the rows it draws from. `micro` is the tokens in millionths as of `at`
-- (microseconds), counted for `rate` and `capacity`; `flight` the lanes the bucket let be
-- claimed that may still be in flight; `partition_id` is NULL for a prefix key.
CREATE TABLE queen.limit_buckets (
    queue_id        bigint  NOT NULL,
    consumer_group  text    NOT NULL,
    key             text    NOT NULL,
    partition_id    uuid    REFERENCES queen.partitions ON DELETE CASCADE,
    micro           bigint  NOT NULL,
    at              bigint  NOT NULL,
    rate            float8  NOT NULL,
    capacity        bigint  NOT NULL,
    flight          uuid[]  NOT NULL DEFAULT '{}',
    UNIQUE NULLS NOT DISTINCT (queue_id, consumer_group, key, partition_id),
    FOREIGN KEY (queue_id, consumer_group, key) REFERENCES queen.limits ON DELETE CASCADE
);
CREATE INDEX limit_buckets_partition ON queen.limit_buckets (partition_id);
COMMENT ON TABLE queen.limit_buckets IS 'queen: rate-limit buckets kept in a table (without preloading, or when shared memory has no room)';
REVOKE ALL ON queen.limit_buckets FROM PUBLIC;

-- Messages a group's pops dropped because they outlived the queue's ttl on a queue that
-- keeps no dead-letter queue (no row records them otherwise): per partition and group, how
-- many, and the last offset counted (a later pop that meets them again counts them once).
CREATE TABLE queen.expired_drops (
    partition_id    uuid   NOT NULL REFERENCES queen.partitions ON DELETE CASCADE,
    consumer_group  text   NOT NULL,
    queue_id        bigint NOT NULL,
    dropped         bigint NOT NULL DEFAULT 0,
    counted         int8multirange NOT NULL DEFAULT '{}',
    PRIMARY KEY (partition_id, consumer_group)
);
COMMENT ON TABLE queen.expired_drops IS 'queen: expired messages dropped without a dead letter, counted per partition and group';
REVOKE ALL ON queen.expired_drops FROM PUBLIC;
CREATE TABLE queen.expired_drops_folded (
    queue_id        bigint NOT NULL REFERENCES queen.queues ON DELETE CASCADE,
    consumer_group  text   NOT NULL,
    dropped         bigint NOT NULL,
    PRIMARY KEY (queue_id, consumer_group)
);
COMMENT ON TABLE queen.expired_drops_folded IS 'queen: expired messages dropped without a dead letter in partitions since deleted';
REVOKE ALL ON queen.expired_drops_folded FROM PUBLIC;

-- Bulk redrive (queen.dlq_redrive): when a dead letter was pushed again.
ALTER TABLE queen.log_dlq ADD COLUMN redriven_at timestamptz;

-- Skip groups (configure_group on_overflow => 'skip') file the spans they pass; a span is
-- merged into the lane's row that ends right before it, found by this index.
CREATE INDEX log_dlq_skipped ON queen.log_dlq (partition_id, consumer_group, last_offset) WHERE reason = 'skipped';

-- Privileges on single queues (queen.grant, src/queue/privileges.rs): a member of
-- queen_grantee that holds no queen role may use the queues granted to it here, and no
-- other.
CREATE TABLE queen.queue_grants (
    queue_id   bigint NOT NULL REFERENCES queen.queues ON DELETE CASCADE,
    grantee    regrole NOT NULL,
    privilege  text   NOT NULL CHECK (privilege IN ('produce', 'consume', 'admin')),
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, grantee, privilege)
);
COMMENT ON TABLE queen.queue_grants IS 'queen: privileges on single queues (queen.grant)';
REVOKE ALL ON queen.queue_grants FROM PUBLIC;
-- queen_grantee, the role whose members queen.grant limits to their queues, comes with the
-- install script's roles block, which the generated part below carries (sql/schema.sql).

-- Lanes are keyed by a SHA-256 digest in shared memory now: the old hash's SQL form goes.
DROP FUNCTION queen._group_hash(text);

-- _lane returns whether the lease is live (one test of a live lease for status, totals and
-- metrics): a new result type, and a new C symbol (the 0.3.0 one raises, asking for this
-- update).
DROP FUNCTION queen._lane(uuid, text, bigint, uuid, timestamptz, bigint, int, int);

-- A group's allowances stop at 365 days in 0.4.0 (queen_core::policy::limits::ALLOWANCE):
-- 0.3.0 stored longer ones as given, and a huge one (a stand-in for "no timeout") wrapped
-- around to a negative interval when stored (0.3.0 refused negative allowances, so a
-- negative one is always such a value). Both are cut to 365 days, far above any lease
-- (queen.max_lease cuts a lease anyway); a WARNING says how many groups.
DO $clamp$
DECLARE n bigint;
BEGIN
  UPDATE queen.groups
     SET handler_timeout = CASE WHEN handler_timeout NOT BETWEEN interval '0' AND interval '365 days'
                                THEN interval '365 days' ELSE handler_timeout END,
         queue_margin    = CASE WHEN queue_margin NOT BETWEEN interval '0' AND interval '365 days'
                                THEN interval '365 days' ELSE queue_margin END,
         timeout_grace   = CASE WHEN timeout_grace NOT BETWEEN interval '0' AND interval '365 days'
                                THEN interval '365 days' ELSE timeout_grace END,
         record_margin   = CASE WHEN record_margin NOT BETWEEN interval '0' AND interval '365 days'
                                THEN interval '365 days' ELSE record_margin END
   WHERE handler_timeout NOT BETWEEN interval '0' AND interval '365 days'
      OR queue_margin NOT BETWEEN interval '0' AND interval '365 days'
      OR timeout_grace NOT BETWEEN interval '0' AND interval '365 days'
      OR record_margin NOT BETWEEN interval '0' AND interval '365 days';
  GET DIAGNOSTICS n = ROW_COUNT;
  IF n > 0 THEN
    RAISE WARNING 'queen: % consumer groups had a budget allowance over 365 days (or stored negative, wrapped around); cut to 365 days', n;
  END IF;
END $clamp$;

-- configure gains create_groups, partition_idle_ttl, ttl, max_depth and dlq_retention; configure_group
-- gains max_lag and on_overflow; dlq_replay and dlq_delete gain id (new C symbols: the 0.3.0
-- ones raise, asking for this update). Grants given on the old signatures are given again. (Role oids, 'g' marking the
-- grant option, kept in settings of this transaction for the grants below: a table made
-- here would become a member of the extension.)
SELECT pg_catalog.set_config('queen_upgrade.' || p.proname || '_acl', coalesce(pg_catalog.string_agg(
         a.grantee::text || CASE WHEN a.is_grantable THEN 'g' ELSE '' END, ','), ''), true)
  FROM pg_catalog.pg_proc p LEFT JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
    ON a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
   AND a.grantee NOT IN (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = 'queen_admin')
 WHERE p.oid IN ('queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, interval)'::regprocedure,
                 'queen.configure_group(text, text, interval, interval, interval, interval)'::regprocedure,
                 'queen.dlq_replay(uuid, text)'::regprocedure, 'queen.dlq_delete(uuid, text)'::regprocedure)
 GROUP BY p.proname;
DROP FUNCTION queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, interval);
DROP FUNCTION queen.configure_group(text, text, interval, interval, interval, interval);
DROP FUNCTION queen.dlq_replay(uuid, text);
DROP FUNCTION queen.dlq_delete(uuid, text);

-- @functions

-- Grants given on the 0.3.0 signatures of configure, configure_group, dlq_replay and
-- dlq_delete, given again on the new ones.
DO $$
DECLARE
  f text;
  g text;
BEGIN
  FOREACH f IN ARRAY ARRAY['configure', 'configure_group', 'dlq_replay', 'dlq_delete'] LOOP
    FOREACH g IN ARRAY pg_catalog.string_to_array(pg_catalog.current_setting('queen_upgrade.' || f || '_acl', true), ',') LOOP
      EXECUTE 'GRANT EXECUTE ON FUNCTION ' || ('queen.' || f)::regproc::oid::regprocedure || ' TO '
              || pg_catalog.rtrim(g, 'g')::oid::regrole
              || CASE WHEN g LIKE '%g' THEN ' WITH GRANT OPTION' ELSE '' END;
    END LOOP;
  END LOOP;
END $$;
