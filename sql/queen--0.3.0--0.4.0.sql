-- queen 0.3.0 -> 0.4.0 (ALTER EXTENSION queen UPDATE TO '0.4.0').
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
-- Roles that were given EXECUTE on queen's functions directly keep what they had: a role
-- is limited to single queues only once it is granted one with queen.grant.

-- New queue options (src/queues.rs, configure).
ALTER TABLE queen.queues
  ADD COLUMN create_groups      bool     NOT NULL DEFAULT true,
  ADD COLUMN partition_idle_ttl interval NOT NULL DEFAULT '0s';

-- Privileges on single queues (queen.grant, src/privileges.rs): a role that is a member of
-- no queen role may use the queues granted to it here, and no other.
CREATE TABLE queen.queue_grants (
    queue_id   bigint NOT NULL REFERENCES queen.queues ON DELETE CASCADE,
    grantee    oid    NOT NULL,
    privilege  text   NOT NULL CHECK (privilege IN ('produce', 'consume', 'admin')),
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, grantee, privilege)
);
COMMENT ON TABLE queen.queue_grants IS 'queen: privileges on single queues (queen.grant)';
REVOKE ALL ON queen.queue_grants FROM PUBLIC;

-- Lanes are keyed by a SHA-256 digest in shared memory now: the old hash's SQL form goes.
DROP FUNCTION queen._group_hash(text);

-- configure gains create_groups and partition_idle_ttl (a new C symbol: the 0.3.0 one
-- raises, asking for this update). Grants given on the old signature are given again.
-- (Role oids, 'g' marking the grant option, kept in a setting of this transaction for the
-- grant below: a table made here would become a member of the extension.)
SELECT pg_catalog.set_config('queen_upgrade.configure_acl', coalesce(pg_catalog.string_agg(
         a.grantee::text || CASE WHEN a.is_grantable THEN 'g' ELSE '' END, ','), ''), true)
  FROM pg_catalog.pg_proc p CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
 WHERE p.oid = 'queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, interval)'::regprocedure
   AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
   AND a.grantee NOT IN (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = 'queen_admin');
DROP FUNCTION queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, interval);

CREATE  FUNCTION "configure"(
	"queue" TEXT, /* Option < & str > */
	"lease_time" INT DEFAULT 300, /* Option < i32 > */
	"retry_limit" INT DEFAULT 3, /* Option < i32 > */
	"dead_letter_queue" bool DEFAULT true, /* Option < bool > */
	"dlq_after_max_retries" bool DEFAULT true, /* Option < bool > */
	"dedup_window" INT DEFAULT 3600, /* Option < i32 > */
	"encryption" bool DEFAULT NULL, /* Option < bool > */
	"retention" INT DEFAULT 0, /* Option < i32 > */
	"retry_backoff" interval DEFAULT '0s', /* Option < pgrx :: datum :: Interval > */
	"retry_backoff_max" interval DEFAULT '600s', /* Option < pgrx :: datum :: Interval > */
	"delay" interval DEFAULT '0s', /* Option < pgrx :: datum :: Interval > */
	"create_groups" bool DEFAULT true, /* Option < bool > */
	"partition_idle_ttl" interval DEFAULT '0s' /* Option < pgrx :: datum :: Interval > */
) RETURNS jsonb /* pgrx :: JsonB */
SECURITY DEFINER 
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'configure_queue_wrapper';

COMMENT ON FUNCTION queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, interval, bool, interval) IS
  'queen: create or update a queue; returns its options in camelCase';

GRANT EXECUTE ON FUNCTION queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, interval, bool, interval) TO queen_admin;

DO $$
DECLARE
  g text;
BEGIN
  FOREACH g IN ARRAY pg_catalog.string_to_array(pg_catalog.current_setting('queen_upgrade.configure_acl', true), ',') LOOP
    EXECUTE 'GRANT EXECUTE ON FUNCTION queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, '
            'interval, bool, interval) TO ' || pg_catalog.rtrim(g, 'g')::oid::regrole
            || CASE WHEN g LIKE '%g' THEN ' WITH GRANT OPTION' ELSE '' END;
  END LOOP;
END $$;

-- New functions (src/stats.rs, src/privileges.rs, src/churn.rs, src/extend.rs).

CREATE  FUNCTION "_maintenance_stats"() RETURNS TABLE (
	"pass" TEXT,  /* String */
	"runs" bigint,  /* i64 */
	"errors" bigint,  /* i64 */
	"last_ok_at" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"last_error_at" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"worker_running" bool,  /* bool */
	"corrupt_segments" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'maintenance_stats_wrapper';

CREATE  FUNCTION "_permitted_queues"(
	"privilege" TEXT /* & str */
) RETURNS bigint[] /* :: std :: option :: Option < Vec < i64 > > */
STRICT VOLATILE PARALLEL UNSAFE 
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'permitted_sql_wrapper';

CREATE  FUNCTION "_sync_grants"(
	"role" oid /* pg_sys :: Oid */
) RETURNS void
STRICT VOLATILE PARALLEL UNSAFE 
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'sync_grants_sql_wrapper';

CREATE  FUNCTION "_require"(
	"queue" TEXT, /* Option < & str > */
	"privilege" TEXT /* & str */
) RETURNS void
VOLATILE PARALLEL UNSAFE 
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'require_sql_wrapper';

CREATE  FUNCTION "drop_partition"(
	"queue" TEXT, /* Option < & str > */
	"partition" TEXT /* Option < & str > */
) RETURNS jsonb /* JsonB */
SECURITY DEFINER
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'drop_partition_wrapper';

CREATE  FUNCTION "grant"(
	"queue" TEXT, /* Option < & str > */
	"role" TEXT, /* Option < & str > */
	"privilege" TEXT /* Option < & str > */
) RETURNS jsonb /* JsonB */
SECURITY DEFINER 
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'grant_sql_wrapper';

CREATE  FUNCTION "grants"(
	"queue" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS TABLE (
	"queue" TEXT,  /* String */
	"role" TEXT,  /* String */
	"privilege" TEXT  /* String */
)
SECURITY DEFINER 
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'grants_sql_wrapper';

CREATE  FUNCTION "revoke"(
	"queue" TEXT, /* Option < & str > */
	"role" TEXT, /* Option < & str > */
	"privilege" TEXT /* Option < & str > */
) RETURNS jsonb /* JsonB */
SECURITY DEFINER 
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'revoke_sql_wrapper';

CREATE  FUNCTION "revoke_lease"(
	"lease_id" uuid /* Option < pgrx :: Uuid > */
) RETURNS jsonb /* JsonOut */
SECURITY DEFINER
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'revoke_lease_wrapper';

COMMENT ON FUNCTION queen._committed(uuid, text, bigint) IS
  'queen internal: a lane''s last committed cursor (retention); not granted';

COMMENT ON FUNCTION queen._lane(uuid, text, bigint, uuid, timestamptz, bigint, int, int) IS
  'queen internal: a lane''s last committed state (status, totals, metrics); not granted';

COMMENT ON FUNCTION queen._maintenance_stats() IS
  'queen internal: this database''s maintenance passes: runs, errors, last success and last error (queen.metrics); not granted';

COMMENT ON FUNCTION queen._require(text, text) IS
  'queen internal: refuse (42501) unless the session''s role has the privilege on the queue (NULL: every queue); not granted';


COMMENT ON FUNCTION queen._permitted_queues(text) IS
  'queen internal: the queues on which the session''s role has the privilege, NULL for all; not granted';
COMMENT ON FUNCTION queen._sync_grants(oid) IS
  'queen internal: make the functions a role may call match the queue grants it still holds (delete_queue); not granted';

COMMENT ON FUNCTION queen._retention_stats() IS
  'queen internal: this database''s retention counters (queen.metrics); not granted';

COMMENT ON FUNCTION queen.drop_partition(text, text) IS
  'queen: remove an empty partition (every group consumed it, no lease, nothing in flight, no dead letters) with its segments and lanes';

GRANT EXECUTE ON FUNCTION queen.drop_partition(text, text) TO queen_admin;

COMMENT ON FUNCTION queen."grant"(text, text, text) IS
  'queen: give a role one privilege (produce, consume, admin) on one queue, and what it needs to call those functions';

GRANT EXECUTE ON FUNCTION queen."grant"(text, text, text) TO queen_admin;

COMMENT ON FUNCTION queen."revoke"(text, text, text) IS
  'queen: take a privilege on a queue back from a role';

GRANT EXECUTE ON FUNCTION queen."revoke"(text, text, text) TO queen_admin;

COMMENT ON FUNCTION queen.grants(text) IS
  'queen: the privileges granted on queues with queen.grant (of one queue, or all)';

GRANT EXECUTE ON FUNCTION queen.grants(text) TO queen_admin;

COMMENT ON FUNCTION queen.revoke_lease(uuid) IS
  'queen: end a lease now (an operator''s call): its lanes are claimable again and its messages are delivered again';

GRANT EXECUTE ON FUNCTION queen.revoke_lease(uuid) TO queen_admin;

-- Changed SQL functions (sql/api.sql): per-queue privileges in dlq, status, totals,
-- delete_queue and metrics (and metrics' kind maintenance); the rotation's swap; the
-- journal's emptying waits at most 100 ms for a lock.

CREATE OR REPLACE FUNCTION queen.dlq(
    queue text DEFAULT NULL,
    consumer_group text DEFAULT NULL,
    page_size int DEFAULT 100,
    page_offset int DEFAULT 0
) RETURNS SETOF queen.dead_letter
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  permitted bigint[];
BEGIN
  -- On Citus, a named queue is read on its home: a call that reached another node is
  -- forwarded there through the distributed form (docs/citus.md).
  IF dlq.queue IS NOT NULL AND queen._lives_elsewhere(dlq.queue) THEN
    RETURN QUERY EXECUTE format('SELECT * FROM queen._dlq_at_home(%L, %L, %L, %L)', dlq.queue, dlq.consumer_group, dlq.page_size, dlq.page_offset);
    RETURN;
  END IF;
  IF page_size IS NULL OR page_size < 1 OR page_size > 10000 THEN
    RAISE EXCEPTION 'queen: invalid page_size: % (must be 1 to 10000)', page_size
      USING ERRCODE = '22023';
  END IF;
  IF page_offset IS NULL OR page_offset < 0 THEN
    RAISE EXCEPTION 'queen: invalid page_offset: % (must be >= 0)', page_offset
      USING ERRCODE = '22023';
  END IF;
  -- Per-queue privileges (src/privileges.rs): a named queue must be one the session's
  -- role may consume; without a name, only those are listed.
  IF dlq.queue IS NOT NULL THEN
    PERFORM queen._require(dlq.queue, 'consume');
  END IF;
  permitted := queen._permitted_queues('consume');
  -- created_at equals failed_at: a frame's enqueue time is not kept per message. A row
  -- whose envelope cannot be opened (its key is not configured, or it does not
  -- authenticate) is listed with a NULL payload and the reason after its error.
  RETURN QUERY
    SELECT d.id, d.transaction_id, d.partition_id, q.name, p.name, d.consumer_group,
           CASE WHEN x.unopenable IS NULL THEN d.error_message
                ELSE d.error_message || ' (payload not shown: ' || x.unopenable || ')' END,
           d.retry_count,
           CASE WHEN x.unopenable IS NULL THEN coalesce(d.data, queen._open_dead_letter(d.envelope, d.message_id)) END,
           d.failed_at, d.failed_at, NULL::text,
           CASE WHEN x.unopenable IS NULL THEN queen._dead_letter_headers(d.headers, d.message_id) END
      FROM queen.log_dlq d
      JOIN queen.queues q ON q.queue_id = d.queue_id
      JOIN queen.partitions p ON p.partition_id = d.partition_id
     CROSS JOIN LATERAL (SELECT CASE WHEN d.data IS NULL
                                     THEN queen._dead_letter_unopenable(d.envelope, d.message_id) END AS unopenable) x
     WHERE (dlq.queue IS NULL OR q.name = dlq.queue)
       AND (permitted IS NULL OR q.queue_id = ANY(permitted))
       AND (dlq.consumer_group IS NULL OR d.consumer_group = dlq.consumer_group)
     ORDER BY d.failed_at DESC, d.id DESC
     LIMIT page_size OFFSET page_offset;
END $$;

CREATE OR REPLACE FUNCTION queen.status(queue text DEFAULT NULL) RETURNS SETOF queen.lane_status
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
  permitted bigint[];
BEGIN
  -- On Citus, a named queue is read on its home: a call that reached another node is
  -- forwarded there through the distributed form (docs/citus.md).
  IF status.queue IS NOT NULL AND queen._lives_elsewhere(status.queue) THEN
    RETURN QUERY EXECUTE format('SELECT * FROM queen._status_at_home(%L)', status.queue);
    RETURN;
  END IF;
  -- Per-queue privileges (src/privileges.rs).
  IF status.queue IS NOT NULL THEN
    PERFORM queen._require(status.queue, 'admin');
  END IF;
  permitted := queen._permitted_queues('admin');
  -- Only a live lease is shown; an expired one is as good as none. retry_at: a failed
  -- batch's retry backoff, while it runs (the lane is not claimed before it).
  RETURN QUERY
    SELECT q.name, p.name, p.partition_id, r.head, l.consumer_group, v.committed,
           r.head - v.committed,
           CASE WHEN v.lease_expires_at > clock_timestamp() THEN v.lease_id END,
           CASE WHEN v.lease_expires_at > clock_timestamp() THEN v.lease_expires_at END,
           v.batch_end, v.retry_count, v.attempt_count,
           (SELECT count(*) FROM queen.log_dlq d
             WHERE d.partition_id = l.partition_id AND d.consumer_group = l.consumer_group),
           CASE WHEN v.retry_at > clock_timestamp() THEN v.retry_at END
      FROM queen.lanes l
      JOIN queen.partitions p ON p.partition_id = l.partition_id
      JOIN queen.queues q ON q.queue_id = l.queue_id
     CROSS JOIN LATERAL (SELECT queen._readable(p.partition_id, p.head) AS head) r
     CROSS JOIN LATERAL queen._lane(l.partition_id, l.consumer_group, l.committed, l.lease_id,
                                    l.lease_expires_at, l.batch_end, l.batch_retry_count, l.attempt_count) v
     WHERE (status.queue IS NULL OR q.name = status.queue)
       AND (permitted IS NULL OR q.queue_id = ANY(permitted))
     ORDER BY q.name, p.name, l.consumer_group;
END $$;

CREATE OR REPLACE FUNCTION queen.totals(queue text DEFAULT NULL) RETURNS SETOF queen.queue_totals
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
  permitted bigint[];
BEGIN
  -- On Citus, a named queue is read on its home: a call that reached another node is
  -- forwarded there through the distributed form (docs/citus.md).
  IF totals.queue IS NOT NULL AND queen._lives_elsewhere(totals.queue) THEN
    RETURN QUERY EXECUTE format('SELECT * FROM queen._totals_at_home(%L)', totals.queue);
    RETURN;
  END IF;
  -- Per-queue privileges (src/privileges.rs).
  IF totals.queue IS NOT NULL THEN
    PERFORM queen._require(totals.queue, 'admin');
  END IF;
  permitted := queen._permitted_queues('admin');
  RETURN QUERY
    WITH q AS (
      SELECT q.queue_id, q.name, p.partitions, p.messages
        FROM queen.queues q
        CROSS JOIN LATERAL (SELECT count(*) AS partitions,
                                   coalesce(sum(queen._readable(partition_id, head)), 0)::int8 AS messages
                              FROM queen.partitions WHERE queue_id = q.queue_id) p
       WHERE (totals.queue IS NULL OR q.name = totals.queue)
         AND (permitted IS NULL OR q.queue_id = ANY(permitted))
    ), g AS (
      SELECT l.queue_id, l.consumer_group,
             sum(v.committed)::int8 AS committed,
             sum(queen._readable(p.partition_id, p.head) - v.committed)::int8 AS lag,
             count(*) FILTER (WHERE v.lease_expires_at > clock_timestamp()) AS leased
        FROM queen.lanes l
        JOIN queen.partitions p ON p.partition_id = l.partition_id
       CROSS JOIN LATERAL queen._lane(l.partition_id, l.consumer_group, l.committed, l.lease_id,
                                      l.lease_expires_at, l.batch_end, l.batch_retry_count, l.attempt_count) v
       WHERE l.queue_id IN (SELECT queue_id FROM q)
       GROUP BY l.queue_id, l.consumer_group
    ), d AS (
      SELECT d.queue_id, d.consumer_group, count(*) AS dead
        FROM queen.log_dlq d
       WHERE d.queue_id IN (SELECT queue_id FROM q)
       GROUP BY d.queue_id, d.consumer_group
    )
    SELECT q.name, g.consumer_group, q.partitions, q.messages,
           g.committed, g.lag, g.leased, coalesce(d.dead, 0)
      FROM q
      LEFT JOIN g ON g.queue_id = q.queue_id
      LEFT JOIN d ON d.queue_id = q.queue_id AND d.consumer_group = g.consumer_group
     ORDER BY q.name, g.consumer_group NULLS FIRST;
END $$;

CREATE OR REPLACE FUNCTION queen.delete_queue(queue text) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  qid bigint;
  n_partitions bigint;
  n_segments bigint;
  n_fresh bigint;
  n_dead bigint;
  grantees oid[];
BEGIN
  IF queue IS NULL THEN
    RAISE EXCEPTION 'queen: queue must not be NULL' USING ERRCODE = '22004';
  END IF;
  -- On Citus, only the queue's home deletes it (src/citus.rs).
  PERFORM queen._ensure_home(delete_queue.queue);
  PERFORM queen._require(delete_queue.queue, 'admin');
  -- The queue lock in exclusive mode before anything else: every call that touched the
  -- queue holds it in share mode until it ends, so this waits for them and none of them
  -- waits for this while holding a row of the queue (src/locks.rs). Then the queue row,
  -- then its partitions in name order.
  SELECT q.queue_id INTO qid FROM queen.queues q WHERE q.name = delete_queue.queue;
  IF qid IS NOT NULL THEN
    PERFORM queen._own_queue(qid);
    SELECT q.queue_id INTO qid FROM queen.queues q WHERE q.queue_id = qid FOR UPDATE;
  END IF;
  IF qid IS NULL THEN
    RETURN jsonb_build_object('queue', queue, 'deleted', false);
  END IF;
  PERFORM 1 FROM queen.partitions p WHERE p.queue_id = qid ORDER BY p.name FOR UPDATE;
  DELETE FROM queen.segments s USING queen.partitions p
   WHERE p.queue_id = qid AND s.partition_id = p.partition_id;
  GET DIAGNOSTICS n_segments = ROW_COUNT;
  DELETE FROM queen.fresh_segments s USING queen.partitions p
   WHERE p.queue_id = qid AND s.partition_id = p.partition_id;
  GET DIAGNOSTICS n_fresh = ROW_COUNT;
  n_segments := n_segments + n_fresh;
  DELETE FROM queen.dedup d USING queen.partitions p
   WHERE p.queue_id = qid AND d.partition_id = p.partition_id;
  -- The lanes, rows and registry slots (src/lane_rows.rs).
  PERFORM queen._delete_lanes(qid);
  DELETE FROM queen.leases le WHERE le.queue_id = qid;
  DELETE FROM queen.log_dlq d WHERE d.queue_id = qid;
  GET DIAGNOSTICS n_dead = ROW_COUNT;
  DELETE FROM queen.partitions p WHERE p.queue_id = qid;
  GET DIAGNOSTICS n_partitions = ROW_COUNT;
  -- The queue's grants, and with them the functions a role no longer needs: a role left
  -- with no queue grant and the EXECUTE rights queen.grant gave it would otherwise count
  -- as a 0.3.0 role, allowed on every queue (src/privileges.rs).
  WITH gone AS (DELETE FROM queen.queue_grants g WHERE g.queue_id = qid RETURNING g.grantee)
  SELECT array_agg(DISTINCT grantee) INTO grantees FROM gone;
  PERFORM queen._sync_grants(r) FROM unnest(grantees) r;
  DELETE FROM queen.queues q WHERE q.queue_id = qid;
  -- Every backend forgets where this queue's partitions were (src/queues.rs, targets).
  PERFORM queen._queues_changed();
  RETURN jsonb_build_object('queue', queue, 'deleted', true, 'partitions', n_partitions,
                            'segments', n_segments, 'deadLetters', n_dead);
END $$;

CREATE OR REPLACE FUNCTION queen.metrics(kind text DEFAULT NULL) RETURNS SETOF queen.metric
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
  -- Per-queue privileges (src/privileges.rs): the queues the session's role administers
  -- (NULL: all); the database-wide parts (retention, maintenance) need all.
  permitted bigint[] := queen._permitted_queues('admin');
BEGIN
  IF kind IS NOT NULL AND kind NOT IN ('queue', 'group', 'dead_letters', 'retention', 'maintenance') THEN
    RAISE EXCEPTION 'queen: invalid kind: % (must be queue, group, dead_letters, retention, maintenance or NULL)', kind
      USING ERRCODE = '22023';
  END IF;
  IF kind IS NULL OR kind = 'queue' THEN
    RETURN QUERY
      WITH p AS (
        SELECT p.queue_id, count(*) AS partitions,
               coalesce(sum(queen._readable(p.partition_id, p.head)), 0) AS messages
          FROM queen.partitions p GROUP BY p.queue_id
      ), s AS (
        SELECT p.queue_id, count(*) AS segments, coalesce(sum(pg_column_size(x.data)), 0) AS bytes
          FROM (SELECT partition_id, data FROM queen.segments
                UNION ALL SELECT partition_id, data FROM queen.fresh_segments) x
          JOIN queen.partitions p ON p.partition_id = x.partition_id
         GROUP BY p.queue_id
      )
      SELECT m.metric, q.name, NULL::text, m.value
        FROM queen.queues q
        LEFT JOIN p ON p.queue_id = q.queue_id
        LEFT JOIN s ON s.queue_id = q.queue_id
       CROSS JOIN LATERAL (VALUES ('partitions', coalesce(p.partitions, 0)::float8),
                                  ('messages', coalesce(p.messages, 0)::float8),
                                  ('segments', coalesce(s.segments, 0)::float8),
                                  ('bytes', coalesce(s.bytes, 0)::float8)) m(metric, value)
       WHERE permitted IS NULL OR q.queue_id = ANY(permitted);
  END IF;
  IF kind IS NULL OR kind = 'group' THEN
    RETURN QUERY
      WITH l AS (
        SELECT l.queue_id, l.consumer_group, l.partition_id, v.committed, v.lease_id,
               v.lease_expires_at, v.retry_count, queen._readable(p.partition_id, p.head) AS readable
          FROM queen.lanes l
          JOIN queen.partitions p ON p.partition_id = l.partition_id
         CROSS JOIN LATERAL queen._lane(l.partition_id, l.consumer_group, l.committed, l.lease_id,
                                        l.lease_expires_at, l.batch_end, l.batch_retry_count, l.attempt_count) v
      ), g AS (
        -- The oldest unconsumed message's age: the time its segment was written (a lower
        -- bound for a batch or a compacted run, whose time is its newest message's).
        SELECT l.queue_id, l.consumer_group,
               sum(l.readable - l.committed) AS lag,
               coalesce(max(extract(epoch FROM clock_timestamp() - o.written)), 0) AS lag_seconds,
               count(*) FILTER (WHERE l.lease_expires_at > clock_timestamp()) AS live,
               count(*) FILTER (WHERE l.lease_id IS NOT NULL AND l.lease_expires_at <= clock_timestamp()
                                  AND l.readable > l.committed) AS expired,
               sum(l.retry_count) AS retries
          FROM l
          LEFT JOIN LATERAL (
            -- The segment that holds the next offset (durable tier, then fresh), else the
            -- first one after it (the next offset is a gap): one probe in the common case.
            -- The segment found is checked outside its probe, so that a probe never walks
            -- back over the segments before the cursor.
            SELECT coalesce(
              (SELECT CASE WHEN s.last_offset > l.committed THEN s.created_at END FROM (
                 SELECT s.created_at, s.last_offset FROM queen.segments s
                  WHERE s.partition_id = l.partition_id AND s.first_offset <= l.committed + 1
                  ORDER BY s.first_offset DESC LIMIT 1) s),
              -- (A fresh segment holds fewer than 64 offsets, compaction's FRESH_MAX: the
              -- floor keeps the probe off the entries of segments compaction replaced.)
              (SELECT CASE WHEN f.last_offset > l.committed THEN f.created_at END FROM (
                 SELECT f.created_at, f.last_offset FROM queen.fresh_segments f
                  WHERE f.partition_id = l.partition_id AND f.first_offset <= l.committed + 1
                    AND f.first_offset > l.committed + 1 - 64
                  ORDER BY f.first_offset DESC LIMIT 1) f),
              (SELECT min(t.created_at) FROM (
                 (SELECT s.created_at FROM queen.segments s
                   WHERE s.partition_id = l.partition_id AND s.first_offset > l.committed
                   ORDER BY s.first_offset LIMIT 1)
                 UNION ALL
                 (SELECT f.created_at FROM queen.fresh_segments f
                   WHERE f.partition_id = l.partition_id AND f.first_offset > l.committed
                   ORDER BY f.first_offset LIMIT 1)) t)) AS written
          ) o ON l.readable > l.committed
         GROUP BY l.queue_id, l.consumer_group
      )
      SELECT m.metric, q.name, g.consumer_group, m.value
        FROM g JOIN queen.queues q ON q.queue_id = g.queue_id
                AND (permitted IS NULL OR q.queue_id = ANY(permitted))
       CROSS JOIN LATERAL (VALUES ('lag_messages', g.lag::float8),
                                  ('lag_seconds', g.lag_seconds::float8),
                                  ('leases_live', g.live::float8),
                                  ('leases_expired', g.expired::float8),
                                  ('retries', g.retries::float8)) m(metric, value);
  END IF;
  IF kind IS NULL OR kind = 'dead_letters' THEN
    RETURN QUERY
      SELECT 'dead_letters'::text, q.name, d.consumer_group, count(*)::float8
        FROM queen.log_dlq d JOIN queen.queues q ON q.queue_id = d.queue_id
       WHERE permitted IS NULL OR q.queue_id = ANY(permitted)
       GROUP BY q.name, d.consumer_group;
  END IF;
  IF (kind IS NULL OR kind = 'retention') AND permitted IS NULL THEN
    RETURN QUERY
      SELECT m.metric, NULL::text, NULL::text, m.value
        FROM queen._retention_stats() r
       CROSS JOIN LATERAL (VALUES ('retention_runs', r.runs::float8),
                                  ('retention_freed_bytes_last', r.bytes_last::float8),
                                  ('retention_freed_bytes_total', r.bytes_total::float8),
                                  ('retention_last_run_timestamp_seconds',
                                   extract(epoch FROM r.last_run_at)::float8)) m(metric, value)
       WHERE m.value IS NOT NULL;
  END IF;
  -- This database's maintenance worker (src/worker.rs): per pass, runs and errors since
  -- the server started, seconds since its last success (NULL before the first: no row)
  -- and since its last error; whether the worker runs; fresh segments kept undecodable.
  IF (kind IS NULL OR kind = 'maintenance') AND permitted IS NULL THEN
    RETURN QUERY
      SELECT 'maintenance_' || st.pass || '_' || m.metric, NULL::text, NULL::text, m.value
        FROM queen._maintenance_stats() st
       CROSS JOIN LATERAL (VALUES ('runs', st.runs::float8),
                                  ('errors', st.errors::float8),
                                  ('age_seconds', extract(epoch FROM clock_timestamp() - st.last_ok_at)::float8),
                                  ('error_age_seconds',
                                   extract(epoch FROM clock_timestamp() - st.last_error_at)::float8)) m(metric, value)
       WHERE m.value IS NOT NULL;
    RETURN QUERY
      SELECT m.metric, NULL::text, NULL::text, m.value
        FROM (SELECT bool_or(worker_running) AS running, max(corrupt_segments) AS corrupt
                FROM queen._maintenance_stats()) st
       CROSS JOIN LATERAL (VALUES ('maintenance_worker_running', st.running::int::float8),
                                  ('maintenance_corrupt_segments', st.corrupt::float8)) m(metric, value)
       WHERE m.value IS NOT NULL;
  END IF;
END $$;

CREATE OR REPLACE FUNCTION queen._rotate_segments(oldest int, current int) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '150ms'
-- An autovacuum holding a table (TOAST included, which TRUNCATE locks later) is cancelled
-- after deadlock_timeout; below lock_timeout, so that it is, and a cycle with another
-- waiter is found before the wait gives up (this call is then the one that backs off).
SET deadlock_timeout = '50ms'
AS $$
DECLARE
  seg text := format('queen.segments_%s', oldest);
  fresh text := format('queen.fresh_segments_%s', oldest);
  copied bigint;
  copied_fresh bigint;
BEGIN
  IF oldest IS NULL OR current IS NULL OR oldest NOT IN (0, 1) OR current NOT IN (0, 1) OR oldest = current THEN
    RAISE EXCEPTION 'queen: no rotation from generation % into %', oldest, current USING ERRCODE = '22023';
  END IF;
  EXECUTE format('LOCK TABLE %s, %s IN ACCESS EXCLUSIVE MODE', seg, fresh);
  EXECUTE format('INSERT INTO queen.segments (partition_id, first_offset, last_offset, created_at, data, generation)
                  SELECT partition_id, first_offset, last_offset, created_at, data, %s FROM %s', current, seg);
  GET DIAGNOSTICS copied = ROW_COUNT;
  EXECUTE format('INSERT INTO queen.fresh_segments (partition_id, first_offset, last_offset, created_at, data, generation)
                  SELECT partition_id, first_offset, last_offset, created_at, data, %s FROM %s', current, fresh);
  GET DIAGNOSTICS copied_fresh = ROW_COUNT;
  EXECUTE format('TRUNCATE %s, %s', seg, fresh);
  UPDATE queen.generations
     SET current_generation = oldest, rotations = rotations + 1, rotated_at = clock_timestamp();
  RETURN copied + copied_fresh;
EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
  RETURN -1;
END $$;

CREATE OR REPLACE FUNCTION queen._empty_journal(t int) RETURNS bool
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- The TRUNCATE also locks the table's index and TOAST table: a session that holds one of
-- those makes this round give up (after at most this wait) rather than stall the worker.
SET lock_timeout = '100ms'
AS $$
DECLARE
  retired text := format('queen.lane_journal_%s', t);
BEGIN
  IF t IS NULL OR t NOT IN (0, 1) THEN
    RAISE EXCEPTION 'queen: no lane journal table %', t USING ERRCODE = '22023';
  END IF;
  EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE NOWAIT', retired);
  -- Each lane's newest entry goes into queen.lanes first, unless the current table holds
  -- one at least as new (it stays there): nothing the journal knew is lost.
  PERFORM queen._save_journal(t);
  EXECUTE format('TRUNCATE %s', retired);
  RETURN true;
EXCEPTION WHEN lock_not_available THEN
  RETURN false;
END $$;

COMMENT ON FUNCTION queen._rotate_segments(int, int) IS 'queen internal: the swap that ends a rotation of the segment generations: copy what the move left, empty the oldest generation (background worker, retain); not granted';

-- Functions created above are closed to PUBLIC, as every queen function is.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA queen FROM PUBLIC;
