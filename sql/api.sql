-- queen's SQL API: thin SQL wrappers that give the Rust entry points their spec names,
-- defaults and named result types. Every function has a fixed search_path.

CREATE FUNCTION queen.push(
    queue text,
    payload jsonb,
    partition text DEFAULT 'Default',
    transaction_id text DEFAULT NULL
) RETURNS SETOF queen.push_result
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT r.idx, r.status, r.message_id, r.transaction_id, r.partition_id, r.msg_offset
       FROM queen._push($1, $2::text, $3, $4) r $$;

CREATE FUNCTION queen.push_batch(items jsonb) RETURNS SETOF queen.push_result
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT r.idx, r.status, r.message_id, r.transaction_id, r.partition_id, r.msg_offset
       FROM queen._push_batch($1::text) r $$;

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
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT r.lease_id, r.lease_expires_at, r.partition_id, r.partition, r.consumer_group,
             r.msg_offset, r.message_id, r.transaction_id, r.payload::jsonb, r.created_at,
             r.attempt
        FROM queen._pop($1, $2, $3, $4, $5, $6, $7, $8, $9) r $$;

COMMENT ON FUNCTION queen.push(text, jsonb, text, text) IS
  'queen: push one message; returns queen.push_result (status queued or duplicate)';
COMMENT ON FUNCTION queen.push_batch(jsonb) IS
  'queen: push a JSON array of {queue, partition?, payload, transactionId?} atomically';
COMMENT ON FUNCTION queen.pop(text, text, int, text, int, bool, int, int, text) IS
  'queen: claim up to batch messages under one lease (or auto_ack); returns queen.message rows';

-- Privileges: the API is granted explicitly (see README, "Privileges"); internals are not.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA queen FROM PUBLIC;
