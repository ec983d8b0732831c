-- queen's SQL API: thin SQL wrappers that give the Rust entry points their spec names,
-- defaults and named result types. Every function has a fixed search_path.

-- The set-returning API functions are PL/pgSQL with RETURN QUERY: they materialize their
-- rows, so the fixed search_path is set once per call. (A SQL or C function with a SET
-- clause runs its GUC save and restore once per returned row: that cost showed in
-- profiles.) The internal _push, _push_batch and _pop carry no SET clause of their own:
-- only these wrappers call them, and every name in them is schema-qualified.
--
-- plan_cache_mode = force_generic_plan: queen's statements are kept plans over indexes
-- whose best plan does not depend on the parameter values; without it PostgreSQL
-- re-plans them for every call (custom plans), which cost about a sixth of a pop.

CREATE FUNCTION queen.push(
    queue text,
    payload jsonb,
    partition text DEFAULT 'Default',
    transaction_id text DEFAULT NULL
) RETURNS SETOF queen.push_result
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT r.idx, r.status, r.message_id, r.transaction_id, r.partition_id, r.msg_offset
                 FROM queen._push($1, $2, $3, $4) r;
END $$;

CREATE FUNCTION queen.push_batch(items jsonb) RETURNS SETOF queen.push_result
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT r.idx, r.status, r.message_id, r.transaction_id, r.partition_id, r.msg_offset
                 FROM queen._push_batch($1) r;
END $$;

CREATE FUNCTION queen.pop(
    queue text,
    consumer_group text DEFAULT '__QUEUE_MODE__',
    batch int DEFAULT 1,
    partition text DEFAULT NULL,
    lease_seconds int DEFAULT 0,
    auto_ack bool DEFAULT false,
    wait_ms int DEFAULT 0,
    max_partitions int DEFAULT 1,
    subscription text DEFAULT 'all'
) RETURNS SETOF queen.message
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT r.lease_id, r.lease_expires_at, r.partition_id, r.partition, r.consumer_group,
                      r.msg_offset, r.message_id, r.transaction_id, r.payload, r.created_at, r.attempt
                 FROM queen._pop($1, $2, $3, $4, $5, $6, $7, $8, $9) r;
END $$;

COMMENT ON FUNCTION queen.push(text, jsonb, text, text) IS
  'queen: push one message; returns queen.push_result (status queued or duplicate)';
COMMENT ON FUNCTION queen.push_batch(jsonb) IS
  'queen: push a JSON array of {queue, partition?, payload, transactionId?} atomically';
COMMENT ON FUNCTION queen.pop(text, text, int, text, int, bool, int, int, text) IS
  'queen: claim up to batch messages under one lease (or auto_ack); returns queen.message rows';

-- Privileges: the API is granted explicitly (see README, "Privileges"); internals are not.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA queen FROM PUBLIC;

-- Dead-letter listing (spec §7): newest first, paged.
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
    producer_sub   text
);

CREATE FUNCTION queen.dlq(
    queue text DEFAULT NULL,
    consumer_group text DEFAULT NULL,
    page_size int DEFAULT 100,
    page_offset int DEFAULT 0
) RETURNS SETOF queen.dead_letter
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF page_size IS NULL OR page_size < 1 OR page_size > 10000 THEN
    RAISE EXCEPTION 'queen: invalid page_size: % (must be 1 to 10000)', page_size
      USING ERRCODE = '22023';
  END IF;
  IF page_offset IS NULL OR page_offset < 0 THEN
    RAISE EXCEPTION 'queen: invalid page_offset: % (must be >= 0)', page_offset
      USING ERRCODE = '22023';
  END IF;
  -- created_at equals failed_at: a frame's enqueue time is not kept per message.
  RETURN QUERY
    SELECT d.id, d.transaction_id, d.partition_id, q.name, p.name, d.consumer_group,
           d.error_message, d.retry_count, d.data, d.failed_at, d.failed_at, NULL::text
      FROM queen.log_dlq d
      JOIN queen.queues q ON q.queue_id = d.queue_id
      JOIN queen.partitions p ON p.partition_id = d.partition_id
     WHERE (dlq.queue IS NULL OR q.name = dlq.queue)
       AND (dlq.consumer_group IS NULL OR d.consumer_group = dlq.consumer_group)
     ORDER BY d.failed_at DESC, d.id DESC
     LIMIT page_size OFFSET page_offset;
END $$;
COMMENT ON FUNCTION queen.dlq(text, text, int, int) IS
  'queen: list dead-lettered messages, newest first, paged';
REVOKE ALL ON FUNCTION queen.dlq(text, text, int, int) FROM PUBLIC;

-- The same for the API functions that pgrx defines (see the comment at the top).
ALTER FUNCTION queen.ack(uuid) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.ack(uuid, jsonb) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.ack(uuid, uuid, bigint, text, text) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.extend_lease(uuid, int) SET plan_cache_mode = force_generic_plan;
