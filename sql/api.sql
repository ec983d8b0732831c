-- queen's SQL API: thin SQL wrappers that give the Rust entry points their documented names,
-- defaults and named result types. Every function has a fixed search_path: a SET clause,
-- or (the C functions and the consumer's calls) one pinned in the library.

-- queen.push, queen.send, queen.push_batch and queen.pop are C functions that return their
-- rows all at once and pin their search path themselves (src/ops/push.rs, src/ops/pop.rs); pop, ack and
-- extend_lease also set two planner settings for their own statements, without a SET clause
-- (src/pg/spi.rs, with_queen_plan_settings).

-- Privileges: the API is granted to queen's roles, function by function; internals are not.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA queen FROM PUBLIC;

-- Dead-letter listing (docs/functions.md#dlq): newest first, paged.
CREATE TYPE queen.dead_letter AS (
    id             uuid,
    transaction_id text,
    partition_id   uuid,
    queue          text,
    partition      text,
    consumer_group text,
    error_message  text,
    retry_count    int,
    data           jsonb,
    created_at     timestamptz,
    failed_at      timestamptz,
    producer_sub   text,
    headers        jsonb,
    -- why: 'failed', 'unreadable', 'expired', 'purged' or 'skipped' (queen.log_dlq.reason)
    reason         text
);

CREATE FUNCTION queen.dlq(
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
  -- Per-queue privileges (src/queue/privileges.rs), checked here before a call is forwarded
  -- to the queue's home on Citus (where it may run as the extension's owner).
  IF dlq.queue IS NOT NULL THEN
    PERFORM queen._require(dlq.queue, 'consume', 'queen.dlq(text, text, int, int)'::regprocedure);
  END IF;
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
  -- Without a name, only the queues the call may consume are listed (every role it runs
  -- for may: src/queue/privileges.rs).
  permitted := queen._permitted_queues('consume', 'queen.dlq(text, text, int, int)'::regprocedure);
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
           CASE WHEN x.unopenable IS NULL THEN queen._dead_letter_headers(d.headers, d.message_id) END,
           d.reason
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
COMMENT ON FUNCTION queen.dlq(text, text, int, int) IS
  'queen: list dead-lettered messages, newest first, paged';
REVOKE ALL ON FUNCTION queen.dlq(text, text, int, int) FROM PUBLIC;

-- jit = off on status, totals and metrics: over many lanes their plans cost enough for
-- PostgreSQL's JIT (jit_above_cost), whose compilation took 0.7 s of a 1 s metrics call on
-- 10,000 lanes; the per-row work (one lane lookup, an index probe or two) gains nothing
-- from it.

-- Operations (docs/functions.md#status): one row per lane.
CREATE TYPE queen.lane_status AS (
    queue            text,
    partition        text,
    partition_id     uuid,
    head             bigint,
    consumer_group   text,
    committed        bigint,
    lag              bigint,
    lease_id         uuid,
    lease_expires_at timestamptz,
    batch_end        bigint,
    retry_count      int,
    attempt_count    int,
    dead_letters     bigint,
    retry_at         timestamptz,
    -- queen.pause: the queue or this group is paused (its pops deliver nothing)
    paused           bool
);

CREATE FUNCTION queen.status(queue text DEFAULT NULL) RETURNS SETOF queen.lane_status
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
  permitted bigint[];
BEGIN
  -- Per-queue privileges (src/queue/privileges.rs), checked here before a call is forwarded
  -- to the queue's home on Citus (where it may run as the extension's owner).
  IF status.queue IS NOT NULL THEN
    PERFORM queen._require(status.queue, 'admin', 'queen.status(text)'::regprocedure);
  END IF;
  -- On Citus, a named queue is read on its home: a call that reached another node is
  -- forwarded there through the distributed form (docs/citus.md).
  IF status.queue IS NOT NULL AND queen._lives_elsewhere(status.queue) THEN
    RETURN QUERY EXECUTE format('SELECT * FROM queen._status_at_home(%L)', status.queue);
    RETURN;
  END IF;
  permitted := queen._permitted_queues('admin', 'queen.status(text)'::regprocedure);
  -- Only a live lease is shown; an expired one is as good as none. retry_at: a failed
  -- batch's retry backoff, while it runs (the lane is not claimed before it).
  RETURN QUERY
    SELECT q.name, p.name, p.partition_id, r.head, l.consumer_group, v.committed,
           r.head - v.committed,
           CASE WHEN v.leased THEN v.lease_id END,
           CASE WHEN v.leased THEN v.lease_expires_at END,
           v.batch_end, v.retry_count, v.attempt_count,
           (SELECT count(*) FROM queen.log_dlq d
             WHERE d.partition_id = l.partition_id AND d.consumer_group = l.consumer_group),
           CASE WHEN v.retry_at > clock_timestamp() THEN v.retry_at END,
           (q.paused OR coalesce(gr.paused, false))
      FROM queen.lanes l
      JOIN queen.partitions p ON p.partition_id = l.partition_id
      JOIN queen.queues q ON q.queue_id = l.queue_id
      LEFT JOIN queen.groups gr ON gr.queue_id = l.queue_id AND gr.consumer_group = l.consumer_group
     CROSS JOIN LATERAL (SELECT queen._readable(p.partition_id, p.head) AS head) r
     CROSS JOIN LATERAL queen._lane(l.partition_id, l.consumer_group, l.committed, l.lease_id,
                                    l.lease_expires_at, l.batch_end, l.batch_retry_count, l.attempt_count) v
     WHERE (status.queue IS NULL OR q.name = status.queue)
       AND (permitted IS NULL OR q.queue_id = ANY(permitted))
     ORDER BY q.name, p.name, l.consumer_group;
END $$;
COMMENT ON FUNCTION queen.status(text) IS
  'queen: per lane: head, cursor, lag, live lease, batch end, retry and attempt counters, dead letters, the end of a running retry backoff, and whether it is paused';

-- Per-queue totals (docs/functions.md#totals): one row per (queue, consumer group); a queue nobody has
-- popped yet has one row with consumer_group NULL. One pass over lanes and partitions.
CREATE TYPE queen.queue_totals AS (
    queue          text,
    consumer_group text,
    partitions     bigint,
    messages       bigint,
    committed      bigint,
    lag            bigint,
    leased_lanes   bigint,
    dead_letters   bigint,
    -- queen.pause: the queue (or, on a group's row, the queue or the group) is paused
    paused         bool
);

CREATE FUNCTION queen.totals(queue text DEFAULT NULL) RETURNS SETOF queen.queue_totals
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
  permitted bigint[];
BEGIN
  -- Per-queue privileges (src/queue/privileges.rs), checked here before a call is forwarded
  -- to the queue's home on Citus (where it may run as the extension's owner).
  IF totals.queue IS NOT NULL THEN
    PERFORM queen._require(totals.queue, 'admin', 'queen.totals(text)'::regprocedure);
  END IF;
  -- On Citus, a named queue is read on its home: a call that reached another node is
  -- forwarded there through the distributed form (docs/citus.md).
  IF totals.queue IS NOT NULL AND queen._lives_elsewhere(totals.queue) THEN
    RETURN QUERY EXECUTE format('SELECT * FROM queen._totals_at_home(%L)', totals.queue);
    RETURN;
  END IF;
  permitted := queen._permitted_queues('admin', 'queen.totals(text)'::regprocedure);
  RETURN QUERY
    WITH q AS (
      SELECT q.queue_id, q.name, q.paused, p.partitions, p.messages
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
             count(*) FILTER (WHERE v.leased) AS leased
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
           g.committed, g.lag, g.leased, coalesce(d.dead, 0),
           (q.paused OR coalesce(gr.paused, false))
      FROM q
      LEFT JOIN g ON g.queue_id = q.queue_id
      LEFT JOIN queen.groups gr ON gr.queue_id = g.queue_id AND gr.consumer_group = g.consumer_group
      LEFT JOIN d ON d.queue_id = q.queue_id AND d.consumer_group = g.consumer_group
     ORDER BY q.name, g.consumer_group NULLS FIRST;
END $$;
COMMENT ON FUNCTION queen.totals(text) IS
  'queen: per queue and consumer group: partitions, messages, committed, lag, leased lanes, dead letters, paused';

-- On Citus (docs/citus.md, src/queue/citus.rs): status, totals and dlq for a queue whose home is
-- another node forward the call there through these forms, which queen.distribute() makes
-- distributed functions on their queue (they have no defaults, which Citus needs to route).
-- Each first refuses (55000) a call that reached a node that is not the queue's home, so a
-- call Citus did not delegate cannot forward itself for ever. Not granted.
-- Parameters: as status, totals, dlq. Returns: their rows. Tables: theirs.
CREATE FUNCTION queen._status_at_home(queue text) RETURNS SETOF queen.lane_status
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM queen._ensure_home(_status_at_home.queue);
  RETURN QUERY SELECT * FROM queen.status(_status_at_home.queue);
END $$;
CREATE FUNCTION queen._totals_at_home(queue text) RETURNS SETOF queen.queue_totals
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM queen._ensure_home(_totals_at_home.queue);
  RETURN QUERY SELECT * FROM queen.totals(_totals_at_home.queue);
END $$;
CREATE FUNCTION queen._dlq_at_home(queue text, consumer_group text, page_size int, page_offset int)
RETURNS SETOF queen.dead_letter
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM queen._ensure_home(_dlq_at_home.queue);
  RETURN QUERY SELECT * FROM queen.dlq(_dlq_at_home.queue, _dlq_at_home.consumer_group,
                                       _dlq_at_home.page_size, _dlq_at_home.page_offset);
END $$;
REVOKE ALL ON FUNCTION queen._status_at_home(text), queen._totals_at_home(text),
  queen._dlq_at_home(text, text, int, int) FROM PUBLIC;
COMMENT ON FUNCTION queen._status_at_home(text) IS 'queen internal: status of a queue, on its Citus home (distributed by queue); not granted';
COMMENT ON FUNCTION queen._totals_at_home(text) IS 'queen internal: totals of a queue, on its Citus home (distributed by queue); not granted';
COMMENT ON FUNCTION queen._dlq_at_home(text, text, int, int) IS 'queen internal: dead letters of a queue, on its Citus home (distributed by queue); not granted';

-- delete_queue (docs/functions.md#delete_queue): the queue and everything of it, dead letters included.
CREATE FUNCTION queen.delete_queue(queue text) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  qid bigint;
  n_partitions bigint;
  n_segments bigint;
  n_fresh bigint;
  n_dead bigint;
BEGIN
  IF queue IS NULL THEN
    RAISE EXCEPTION 'queen: queue must not be NULL' USING ERRCODE = '22004';
  END IF;
  -- On Citus, only the queue's home deletes it (src/queue/citus.rs).
  PERFORM queen._ensure_home(delete_queue.queue);
  PERFORM queen._require(delete_queue.queue, 'admin', 'queen.delete_queue(text)'::regprocedure);
  -- The queue lock in exclusive mode before anything else: every call that touched the
  -- queue holds it in share mode until it ends, so this waits for them and none of them
  -- waits for this while holding a row of the queue (src/pg/locks.rs). Then the queue row,
  -- then its partitions in name order.
  SELECT q.queue_id INTO qid FROM queen.queues q WHERE q.name = delete_queue.queue;
  IF qid IS NOT NULL THEN
    PERFORM queen._own_queue(qid);
    SELECT q.queue_id INTO qid FROM queen.queues q WHERE q.queue_id = qid FOR UPDATE;
  END IF;
  IF qid IS NULL THEN
    RETURN jsonb_build_object('queue', queue, 'deleted', false);
  END IF;
  -- Checked again on the queue locked (src/queue/privileges.rs, module docs): its name
  -- finds the locked row now.
  PERFORM queen._require(delete_queue.queue, 'admin', 'queen.delete_queue(text)'::regprocedure);
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
  -- The lanes, rows and registry slots (src/lane/rows.rs).
  PERFORM queen._delete_lanes(qid);
  DELETE FROM queen.leases le WHERE le.queue_id = qid;
  DELETE FROM queen.log_dlq d WHERE d.queue_id = qid;
  GET DIAGNOSTICS n_dead = ROW_COUNT;
  DELETE FROM queen.partitions p WHERE p.queue_id = qid;
  GET DIAGNOSTICS n_partitions = ROW_COUNT;
  -- The queue's grants go with it (ON DELETE CASCADE); their roles stay members of
  -- queen_grantee, limited to the queues left to them (src/queue/privileges.rs).
  DELETE FROM queen.queues q WHERE q.queue_id = qid;
  -- Every backend forgets where this queue's partitions were (src/queue/lookup.rs, targets).
  PERFORM queen._queues_changed();
  RETURN jsonb_build_object('queue', queue, 'deleted', true, 'partitions', n_partitions,
                            'segments', n_segments, 'deadLetters', n_dead);
END $$;
COMMENT ON FUNCTION queen.delete_queue(text) IS
  'queen: remove a queue with its partitions, segments, lanes, leases and dead letters';
REVOKE ALL ON FUNCTION queen.status(text), queen.delete_queue(text) FROM PUBLIC;

-- Metrics (docs/functions.md#metrics): one row per metric and label set, for Prometheus
-- (prometheus/queen.yaml, read by postgres_exporter) or any monitoring query. Per queue:
-- partitions, messages, segments, bytes. Per queue and group: lag in messages and in
-- seconds, live leases, expired leases awaiting reclaim, retries spent, dead letters. And
-- the background worker's retention passes. No row is locked and nothing is written.
CREATE TYPE queen.metric AS (
    metric         text,
    queue          text,
    consumer_group text,
    value          double precision
);

CREATE FUNCTION queen.metrics(kind text DEFAULT NULL) RETURNS SETOF queen.metric
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
  -- Per-queue privileges (src/queue/privileges.rs): the queues the call may administer
  -- (NULL: all); the database-wide parts (retention, maintenance) need all.
  permitted bigint[] := queen._permitted_queues('admin', 'queen.metrics(text)'::regprocedure);
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
                                  ('bytes', coalesce(s.bytes, 0)::float8),
                                  ('paused', q.paused::int::float8)) m(metric, value)
       WHERE permitted IS NULL OR q.queue_id = ANY(permitted);
  END IF;
  IF kind IS NULL OR kind = 'group' THEN
    RETURN QUERY
      WITH l AS (
        SELECT l.queue_id, l.consumer_group, l.partition_id, v.committed, v.lease_id, v.leased,
               v.retry_count, queen._readable(p.partition_id, p.head) AS readable
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
               count(*) FILTER (WHERE l.leased) AS live,
               count(*) FILTER (WHERE l.lease_id IS NOT NULL AND NOT l.leased AND l.readable > l.committed) AS expired,
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
        LEFT JOIN queen.groups gr ON gr.queue_id = g.queue_id AND gr.consumer_group = g.consumer_group
       CROSS JOIN LATERAL (VALUES ('paused', (q.paused OR coalesce(gr.paused, false))::int::float8),
                                  ('lag_messages', g.lag::float8),
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
    -- Of those, the messages that expired (the queue's ttl) before the group consumed them.
    RETURN QUERY
      SELECT 'expired'::text, q.name, d.consumer_group, count(*)::float8
        FROM queen.log_dlq d JOIN queen.queues q ON q.queue_id = d.queue_id
       WHERE (permitted IS NULL OR q.queue_id = ANY(permitted)) AND d.reason = 'expired'
       GROUP BY q.name, d.consumer_group;
    -- And those dropped without a dead letter (a queue that keeps no DLQ), with those of
    -- partitions since deleted.
    RETURN QUERY
      SELECT 'expired_dropped'::text, q.name, e.consumer_group, sum(e.dropped)::float8
        FROM (SELECT x.queue_id, x.consumer_group, x.dropped FROM queen.expired_drops x
              UNION ALL
              SELECT f.queue_id, f.consumer_group, f.dropped FROM queen.expired_drops_folded f) e
        JOIN queen.queues q ON q.queue_id = e.queue_id
       WHERE permitted IS NULL OR q.queue_id = ANY(permitted)
       GROUP BY q.name, e.consumer_group;
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
  -- the server started; seconds since its last success, or, for a pass that has run and
  -- never succeeded, since its first run (an alert on the age fires for a pass failing
  -- from the start too; no row before its first run); seconds since its last error;
  -- whether the worker runs; fresh segments kept undecodable.
  IF (kind IS NULL OR kind = 'maintenance') AND permitted IS NULL THEN
    RETURN QUERY
      SELECT 'maintenance_' || st.pass || '_' || m.metric, NULL::text, NULL::text, m.value
        FROM queen._maintenance_stats() st
       CROSS JOIN LATERAL (VALUES ('runs', st.runs::float8),
                                  ('errors', st.errors::float8),
                                  ('age_seconds',
                                   extract(epoch FROM clock_timestamp() - coalesce(st.last_ok_at, st.first_at))::float8),
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
COMMENT ON FUNCTION queen.metrics(text) IS
  'queen: one row per metric and label set (queue, consumer group) for monitoring: sizes, lag, leases, retries, dead letters, retention; kind picks one part';

-- Privileges (docs/functions.md, "Privileges"). Every API function runs as the extension's
-- owner (SECURITY DEFINER, with a fixed search_path), so an application role needs only
-- USAGE on the schema and EXECUTE on the functions it calls; the tables and the internal
-- functions (_readable, _claimable, ...) stay closed to it. Nothing is granted to PUBLIC.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA queen FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA queen FROM PUBLIC;

-- Who may call what: the one table of grants. Each row gives a shipped role (roles:
-- sql/schema.sql) EXECUTE on every function of that name (all its overloads: a new
-- overload of a public name is public too, so internal forms get names of their own, as
-- _status_at_home does); a function not listed is granted to nobody. Every function listed
-- is also granted to queen_grantee, whose members (the roles of queen.grant) queen's own
-- checks limit to their queues (src/queue/privileges.rs).
-- The upgrade script runs this block again (scripts/upgrade_sql.py keeps DO $grants$).
DO $grants$
DECLARE
  g record;
  f regprocedure;
  n int;
BEGIN
  FOR g IN SELECT * FROM (VALUES
    -- producers
    ('push', 'queen_producer'), ('push_batch', 'queen_producer'), ('send', 'queen_producer'),
    -- consumers
    ('pop', 'queen_consumer'), ('ack', 'queen_consumer'), ('extend_lease', 'queen_consumer'),
    ('may_start', 'queen_consumer'), ('dlq', 'queen_consumer'), ('peek', 'queen_consumer'), ('get', 'queen_consumer'),
    -- admins
    ('configure', 'queen_admin'), ('configure_group', 'queen_admin'), ('configure_limit', 'queen_admin'), ('create_group', 'queen_admin'),
    ('seek', 'queen_admin'), ('purge', 'queen_admin'), ('drop_group', 'queen_admin'), ('drop_partition', 'queen_admin'),
    ('delete_queue', 'queen_admin'), ('dlq_replay', 'queen_admin'), ('dlq_delete', 'queen_admin'),
    ('dlq_redrive', 'queen_admin'),
    ('retain', 'queen_admin'), ('compact', 'queen_admin'), ('revoke_lease', 'queen_admin'),
    ('pause', 'queen_admin'), ('resume', 'queen_admin'),
    ('status', 'queen_admin'), ('totals', 'queen_admin'), ('metrics', 'queen_admin'),
    ('grant', 'queen_admin'), ('revoke', 'queen_admin'), ('grants', 'queen_admin')
  ) AS t(fn, role) LOOP
    n := 0;
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'queen'::regnamespace AND p.proname = g.fn LOOP
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I, queen_grantee', f, g.role);
      n := n + 1;
    END LOOP;
    IF n = 0 THEN
      RAISE EXCEPTION 'queen: the grants table names queen.%, which does not exist', g.fn;
    END IF;
  END LOOP;
END $grants$;

-- queen.distribute(): queen on a Citus coordinator (docs/citus.md). Distributes the
-- routing table queen_citus.queue_homes by queue name and makes every queen function whose
-- first argument is a queue (without a default) a distributed function colocated with it
-- (with the internal _status_at_home, _totals_at_home and _dlq_at_home, which status,
-- totals and dlq forward to), so that the coordinator delegates each call to the worker
-- that holds the queue. Likewise
-- queen_citus.id_routes by uuid, for the functions whose first argument is a lease id or a
-- partition id: a worker mints those ids so that they route back to it (src/queue/citus.rs).
-- queen's own tables stay local on every node. Idempotent. Returns what it distributed.
-- Parameters: none. Returns: jsonb {functions, shards, workers}.
-- Tables: creates queen_citus.queue_homes and queen_citus.id_routes (empty; only their
-- shard placements are used).
CREATE FUNCTION queen.distribute() RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  f regprocedure;
  n int := 0;
  shards bigint;
  workers bigint;
  queues_here bigint;
  queues_there bigint;
  unreached text;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
    RAISE EXCEPTION 'queen: distribute needs the citus extension in this database'
      USING ERRCODE = '55000';
  END IF;
  IF (SELECT groupid FROM pg_dist_local_group) <> 0 THEN
    RAISE EXCEPTION 'queen: distribute runs on the Citus coordinator'
      USING ERRCODE = '55000';
  END IF;
  SELECT count(*) INTO workers FROM pg_dist_node WHERE groupid <> 0 AND noderole = 'primary' AND isactive;
  IF workers = 0 THEN
    RAISE EXCEPTION 'queen: distribute needs at least one active Citus worker (citus_add_node)'
      USING ERRCODE = '55000';
  END IF;
  -- The first run only: a queue that already exists on a node lives there, whatever the
  -- hash of its name says, and would be stranded once calls are routed (its messages left
  -- where no routed call reads them, its leases routed nowhere). The SHARE lock waits for
  -- a queue being created here and holds off the next one until this commits (that one
  -- then meets the routing guard: queue::citus::recheck_created). The count must see
  -- what committed while it waited: READ COMMITTED only.
  IF NOT EXISTS (SELECT 1 FROM pg_dist_partition
                  WHERE logicalrelid = to_regclass('queen_citus.queue_homes')) THEN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
      RAISE EXCEPTION 'queen: distribute runs under READ COMMITTED (its first run counts the queues that exist)'
        USING ERRCODE = '0A000';
    END IF;
    LOCK TABLE queen.queues IN SHARE MODE;
    SELECT count(*) INTO queues_here FROM queen.queues;
    IF queues_here > 0 THEN
      RAISE EXCEPTION 'queen: distribute found % queue(s) on the coordinator; once calls are routed to the workers their messages would be stranded here', queues_here
        USING ERRCODE = '55000',
              HINT = 'Run queen.distribute() before any queue exists: consume and delete_queue these first (docs/citus.md).';
    END IF;
    SELECT coalesce(sum(result::bigint) FILTER (WHERE success), 0),
           string_agg(nodename || ':' || nodeport || ' (' || result || ')', ', ') FILTER (WHERE NOT success)
      INTO queues_there, unreached
      FROM run_command_on_workers('SELECT count(*) FROM queen.queues');
    IF unreached IS NOT NULL THEN
      RAISE EXCEPTION 'queen: distribute could not count the queues of worker %', unreached
        USING ERRCODE = '55000',
              HINT = 'Every worker must be reachable and have queen installed (CREATE EXTENSION queen on the coordinator creates it there).';
    END IF;
    IF queues_there > 0 THEN
      RAISE EXCEPTION 'queen: distribute found % queue(s) on the workers; once calls are routed by queue name they would be stranded where they are', queues_there
        USING ERRCODE = '55000',
              HINT = 'Run queen.distribute() before any queue exists: consume and delete_queue these on their workers first (docs/citus.md).';
    END IF;
  END IF;
  CREATE SCHEMA IF NOT EXISTS queen_citus;
  CREATE TABLE IF NOT EXISTS queen_citus.queue_homes (queue text PRIMARY KEY);
  COMMENT ON TABLE queen_citus.queue_homes IS
    'queen: routing only (queen.distribute): the worker holding a queue''s shard is the queue''s home';
  IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'queen_citus.queue_homes'::regclass) THEN
    -- A colocation group of its own: a user table distributed by text must not drag
    -- these shards along when it is rebalanced (a queue's home must not move without it).
    PERFORM create_distributed_table('queen_citus.queue_homes', 'queue', colocate_with => 'none');
  END IF;
  FOR f IN
    SELECT p.oid::regprocedure FROM pg_proc p
     WHERE p.pronamespace = 'queen'::regnamespace
       AND (p.proname !~ '^_' OR p.proname IN ('_status_at_home', '_totals_at_home', '_dlq_at_home'))
       AND p.proargnames[1] = 'queue' AND p.proargtypes[0] = 'text'::regtype
       AND p.pronargdefaults < p.pronargs
     ORDER BY p.oid::regprocedure::text
  LOOP
    -- '$1' and not the name: Citus counts OUT columns when it looks an argument up by name.
    -- force_delegation: delegated inside BEGIN ... COMMIT too (the worker then runs the
    -- call in a transaction that commits with the coordinator's).
    PERFORM create_distributed_function(f, '$1', colocate_with => 'queen_citus.queue_homes',
                                        force_delegation => true);
    n := n + 1;
  END LOOP;
  CREATE TABLE IF NOT EXISTS queen_citus.id_routes (id uuid PRIMARY KEY);
  COMMENT ON TABLE queen_citus.id_routes IS
    'queen: routing only (queen.distribute): lease and partition ids are minted to hash into a shard their home holds';
  IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'queen_citus.id_routes'::regclass) THEN
    PERFORM create_distributed_table('queen_citus.id_routes', 'id', colocate_with => 'none');
  END IF;
  FOR f IN
    SELECT p.oid::regprocedure FROM pg_proc p
     WHERE p.pronamespace = 'queen'::regnamespace AND p.proname !~ '^_'
       AND p.proargnames[1] IN ('lease_id', 'partition_id') AND p.proargtypes[0] = 'uuid'::regtype
       AND p.pronargdefaults < p.pronargs
     ORDER BY p.oid::regprocedure::text
  LOOP
    PERFORM create_distributed_function(f, '$1', colocate_with => 'queen_citus.id_routes',
                                        force_delegation => true);
    n := n + 1;
  END LOOP;
  SELECT count(*) INTO shards FROM pg_dist_shard WHERE logicalrelid = 'queen_citus.queue_homes'::regclass;
  RETURN jsonb_build_object('functions', n, 'shards', shards, 'workers', workers);
END $$;
REVOKE ALL ON FUNCTION queen.distribute() FROM PUBLIC;
COMMENT ON FUNCTION queen.distribute() IS 'queen: on a Citus coordinator, route every call that names a queue to the worker that holds it';

-- The swap that ends a rotation of the segment generations (src/storage/generations.rs): the
-- oldest generation's tables are locked exclusively, the rows still in generation `oldest`
-- (those the move before it skipped: partitions busy at that moment) are copied into
-- generation `current`, `oldest` is emptied with TRUNCATE and becomes current. Returns the
-- rows copied, or -1 when a lock it needs stayed busy for the whole wait (each lock waits
-- at most lock_timeout) or its wait would close a cycle (nothing is done then). The caller
-- holds the queen.generations row.
-- Whether a pg_dump is connected to this database (a session named `pg_dump`, the name it
-- gives itself): its snapshot is taken before it locks the tables, and a TRUNCATE committed
-- in between empties a table for that snapshot while the rows moved out of it stay
-- invisible to it. Rotations and the lane journal's emptying wait for it
-- (src/pg/dbs.rs, dump_running; docs/concepts.md, "Backup and restore").
CREATE FUNCTION queen._dump_running() RETURNS bool
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT EXISTS (SELECT FROM pg_catalog.pg_stat_activity
                  WHERE datname = pg_catalog.current_database() AND application_name = 'pg_dump'
                    AND pid <> pg_catalog.pg_backend_pid())
$$;
REVOKE ALL ON FUNCTION queen._dump_running() FROM PUBLIC;
COMMENT ON FUNCTION queen._dump_running() IS 'queen internal: whether a pg_dump is connected to this database (background worker, retain); not granted';

CREATE FUNCTION queen._rotate_segments(oldest int, current int) RETURNS bigint
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
  -- A pg_dump that connected since the caller looked may hold a snapshot older than this
  -- TRUNCATE, for which the tables would read empty and the rows copied out of them not
  -- yet there: back off. (One that connects from here to the commit still can: the window
  -- is this copy and the TRUNCATE.)
  IF queen._dump_running() THEN
    RETURN -1;
  END IF;
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
REVOKE ALL ON FUNCTION queen._rotate_segments(int, int) FROM PUBLIC;
COMMENT ON FUNCTION queen._rotate_segments(int, int) IS 'queen internal: the swap that ends a rotation of the segment generations: copy what the move left, empty the oldest generation (background worker, retain); not granted';

-- The lane journal's table `t` saved into queen.lanes and emptied, if nothing holds it
-- (src/lane/registry.rs, rotate_journal: the worker calls it once no ack writes to it).
CREATE FUNCTION queen._empty_journal(t int) RETURNS bool
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
REVOKE ALL ON FUNCTION queen._empty_journal(int) FROM PUBLIC;
COMMENT ON FUNCTION queen._empty_journal(int) IS 'queen internal: save a lane journal table into queen.lanes and empty it (background worker); not granted';
