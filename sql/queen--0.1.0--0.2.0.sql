-- queen 0.1.0 -> 0.2.0 (ALTER EXTENSION queen UPDATE TO '0.2.0').
-- Tested by pg_test/sql/upgrade.sql: install 0.1.0, write data, update, compare the
-- catalog with a fresh 0.2.0 install and check that the data and behaviour are intact.

-- Retention: the highest offset whose segment was deleted; lanes created later start there.
ALTER TABLE queen.partitions ADD COLUMN retained_through bigint NOT NULL DEFAULT 0;
CREATE INDEX log_dlq_queue ON queen.log_dlq (queue_id, consumer_group);

-- Encryption at rest: a dead letter of an encrypted queue keeps its envelope, not jsonb.
ALTER TABLE queen.log_dlq ALTER COLUMN data DROP NOT NULL;
ALTER TABLE queen.log_dlq ADD COLUMN envelope bytea;
ALTER TABLE queen.log_dlq ADD CHECK ((data IS NULL) <> (envelope IS NULL));
CREATE FUNCTION queen."_open_dead_letter"(
	"envelope" bytea, /* & [u8] */
	"message_id" uuid /* pgrx :: Uuid */
) RETURNS jsonb /* RawJsonb */
STRICT
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'open_dead_letter_wrapper';
-- queen.dlq opens envelopes (same privileges, same comment: CREATE OR REPLACE keeps them).
CREATE OR REPLACE FUNCTION queen.dlq(
    queue text DEFAULT NULL,
    consumer_group text DEFAULT NULL,
    page_size int DEFAULT 100,
    page_offset int DEFAULT 0
) RETURNS SETOF queen.dead_letter
LANGUAGE plpgsql STABLE SECURITY DEFINER
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
           d.error_message, d.retry_count,
           coalesce(d.data, queen._open_dead_letter(d.envelope, d.message_id)),
           d.failed_at, d.failed_at, NULL::text
      FROM queen.log_dlq d
      JOIN queen.queues q ON q.queue_id = d.queue_id
      JOIN queen.partitions p ON p.partition_id = d.partition_id
     WHERE (dlq.queue IS NULL OR q.name = dlq.queue)
       AND (dlq.consumer_group IS NULL OR d.consumer_group = dlq.consumer_group)
     ORDER BY d.failed_at DESC, d.id DESC
     LIMIT page_size OFFSET page_offset;
END $$;

CREATE FUNCTION queen."retain"(
	"queue" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS jsonb /* JsonB */
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'retain_wrapper';
ALTER FUNCTION queen.retain(text) SECURITY DEFINER;
COMMENT ON FUNCTION queen.retain(text) IS
  'queen: one retention pass: delete segments every group has committed past and older than the queue''s retention';

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
    dead_letters   bigint
);

CREATE FUNCTION queen.totals(queue text DEFAULT NULL) RETURNS SETOF queen.queue_totals
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN QUERY
    WITH q AS (
      SELECT q.queue_id, q.name, p.partitions, p.messages
        FROM queen.queues q
        CROSS JOIN LATERAL (SELECT count(*) AS partitions, coalesce(sum(head), 0)::int8 AS messages
                              FROM queen.partitions WHERE queue_id = q.queue_id) p
       WHERE totals.queue IS NULL OR q.name = totals.queue
    ), g AS (
      SELECT l.queue_id, l.consumer_group,
             sum(l.committed)::int8 AS committed,
             sum(p.head - l.committed)::int8 AS lag,
             count(*) FILTER (WHERE l.lease_expires_at > clock_timestamp()) AS leased
        FROM queen.lanes l
        JOIN queen.partitions p ON p.partition_id = l.partition_id
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
COMMENT ON FUNCTION queen.totals(text) IS
  'queen: per queue and consumer group — partitions, messages, committed, lag, leased lanes, dead letters';

-- Hot statements are planned with enable_seqscan = off (see sql/api.sql).
ALTER FUNCTION queen.push(text, jsonb, text, text) SET enable_seqscan = off;
ALTER FUNCTION queen.push_batch(jsonb) SET enable_seqscan = off;
ALTER FUNCTION queen.pop(text, text, int, text, int, bool, int, int, text) SET enable_seqscan = off;
ALTER FUNCTION queen.ack(uuid) SET enable_seqscan = off;
ALTER FUNCTION queen.ack(uuid, jsonb) SET enable_seqscan = off;
ALTER FUNCTION queen.ack(uuid, uuid, bigint, text, text) SET enable_seqscan = off;
ALTER FUNCTION queen.extend_lease(uuid, int) SET enable_seqscan = off;

REVOKE ALL ON FUNCTION queen.retain(text), queen.totals(text), queen._open_dead_letter(bytea, uuid) FROM PUBLIC;

-- Every function of the schema has a comment.
COMMENT ON FUNCTION queen._push(text, jsonb, text, text) IS 'queen internal: the body of queen.push; not granted';
COMMENT ON FUNCTION queen._push_batch(jsonb) IS 'queen internal: the body of queen.push_batch; not granted';
COMMENT ON FUNCTION queen._pop(text, text, int, text, int, bool, int, int, text) IS 'queen internal: the body of queen.pop; not granted';
COMMENT ON FUNCTION queen._open_dead_letter(bytea, uuid) IS 'queen internal: opens the envelope of an encrypted dead letter (queen.dlq, dlq_replay); not granted';
