-- queen 0.2.0 -> 0.3.0 (ALTER EXTENSION queen UPDATE TO '0.3.0').
-- Tested by scripts/upgrade_test.sh: 0.2.0 writes data, the server restarts on the 0.3.0
-- library, this script runs, and the data, the behaviour and the catalog (compared with a
-- fresh 0.3.0 install) must be intact.
--
-- 0.3.0: pushes reserve offsets without holding their partition row (an offset registry
-- in shared memory; gaps where a push aborts), small pushes write to a fresh tier that
-- compaction merges, push / push_batch are C functions with no SET clause, and a lane's
-- live state (cursor, lease) is kept in shared memory, with a journal of acks.

-- Both segment tiers are split by generation (queen-core::generations): writes go to the
-- current generation, and a rotation copies what is still live in the oldest one into the
-- current one and empties it with TRUNCATE (src/generations.rs), which frees its space even
-- while a snapshot holds the xmin horizon back. queen.generations names the current one.
CREATE TABLE queen.generations (
    one                bool     PRIMARY KEY DEFAULT true CHECK (one),
    current_generation smallint NOT NULL DEFAULT 0 CHECK (current_generation IN (0, 1)),
    rotations          bigint   NOT NULL DEFAULT 0,
    rotated_at         timestamptz
);
INSERT INTO queen.generations DEFAULT VALUES;
COMMENT ON TABLE queen.generations IS 'queen: the segment tables'' current generation (one row)';
REVOKE ALL ON queen.generations FROM PUBLIC;

-- 0.2.0's segments move, unchanged, into generation 0 of the partitioned table: the
-- upgrade rewrites them once (a copy of the table's size, under the upgrade's lock).
ALTER TABLE queen.segments RENAME TO segments_0_2_0;
ALTER INDEX queen.segments_pkey RENAME TO segments_0_2_0_pkey;
CREATE TABLE queen.segments (
    partition_id uuid   NOT NULL,
    first_offset bigint NOT NULL,
    last_offset  bigint NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- queen segment codec (queen-core::segment): blocks of frames, zstd-compressed
    data         bytea  NOT NULL,
    -- the table the row is in (queen.segments_0 or _1): where its space comes back, never
    -- what it holds
    generation   smallint NOT NULL,
    PRIMARY KEY (partition_id, first_offset, generation)
) PARTITION BY LIST (generation);
-- Segments are compressed already: keep TOAST from trying pglz on them again.
ALTER TABLE queen.segments ALTER COLUMN data SET STORAGE EXTERNAL;
CREATE TABLE queen.segments_0 PARTITION OF queen.segments FOR VALUES IN (0);
CREATE TABLE queen.segments_1 PARTITION OF queen.segments FOR VALUES IN (1);
INSERT INTO queen.segments (partition_id, first_offset, last_offset, created_at, data, generation)
SELECT partition_id, first_offset, last_offset, created_at, data, 0 FROM queen.segments_0_2_0;
DROP TABLE queen.segments_0_2_0;
COMMENT ON TABLE queen.segments IS 'queen: immutable compressed runs of messages: large pushes and compacted runs';
COMMENT ON TABLE queen.segments_0 IS 'queen: segments of generation 0';
COMMENT ON TABLE queen.segments_1 IS 'queen: segments of generation 1';
REVOKE ALL ON queen.segments, queen.segments_0, queen.segments_1 FROM PUBLIC;

-- The fresh tier: the segment of each push of fewer than 64 messages to a partition, until
-- compaction (src/compaction.rs) merges a run of them into one row of queen.segments. Its
-- offsets never overlap those of queen.segments. Emptied by compaction, it gives its pages
-- back to VACUUM.
CREATE TABLE queen.fresh_segments (
    partition_id uuid   NOT NULL,
    first_offset bigint NOT NULL,
    last_offset  bigint NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    data         bytea  NOT NULL,
    generation   smallint NOT NULL,
    PRIMARY KEY (partition_id, first_offset, generation)
) PARTITION BY LIST (generation);
ALTER TABLE queen.fresh_segments ALTER COLUMN data SET STORAGE EXTERNAL;
CREATE TABLE queen.fresh_segments_0 PARTITION OF queen.fresh_segments FOR VALUES IN (0);
CREATE TABLE queen.fresh_segments_1 PARTITION OF queen.fresh_segments FOR VALUES IN (1);
COMMENT ON TABLE queen.fresh_segments IS 'queen: segments of small pushes, until compaction merges them into queen.segments';
COMMENT ON TABLE queen.fresh_segments_0 IS 'queen: fresh segments of generation 0';
COMMENT ON TABLE queen.fresh_segments_1 IS 'queen: fresh segments of generation 1';
REVOKE ALL ON queen.fresh_segments, queen.fresh_segments_0, queen.fresh_segments_1 FROM PUBLIC;

-- The lane journal, and the journal number of the cursor saved in each lane row.
ALTER TABLE queen.lanes ADD COLUMN journal_seq bigint NOT NULL DEFAULT 0;
-- With shared_preload_libraries = 'queen', a lane's live state (cursor, retry count,
-- lease) is kept in shared memory (src/lanes.rs) and queen.lanes holds the cursor and
-- retry count as of the last save by the background worker: every ack appends the new
-- ones here, to the table the registry names as current, and the worker empties the other
-- one with TRUNCATE once it has saved them (so nothing here outlives a few seconds, even
-- while a long transaction holds the xmin horizon back). Without preloading these stay
-- empty and queen.lanes is current.
CREATE TABLE queen.lane_journal_0 (
    partition_id   uuid   NOT NULL,
    consumer_group text   NOT NULL,
    seq            bigint NOT NULL,
    committed      bigint NOT NULL,
    retry_count    int    NOT NULL,
    PRIMARY KEY (partition_id, consumer_group, seq)
);
COMMENT ON TABLE queen.lane_journal_0 IS 'queen: cursors and retry counts acks committed (one of two tables used in turn)';
CREATE TABLE queen.lane_journal_1 (LIKE queen.lane_journal_0 INCLUDING ALL);
COMMENT ON TABLE queen.lane_journal_1 IS 'queen: cursors and retry counts acks committed (one of two tables used in turn)';
REVOKE ALL ON queen.lane_journal_0, queen.lane_journal_1 FROM PUBLIC;

-- Functions whose signature changes are replaced below (push, pop, configure, and the ack
-- of one offset); the roles that could execute the old ones can execute the new ones. Their
-- grants are read here, before any is dropped, and given again after the last one.
SELECT set_config('queen_upgrade.replaced_grants', coalesce(string_agg(format(
         'GRANT EXECUTE ON FUNCTION %s TO %s%s',
         CASE p.oid
           WHEN 'queen.push(text, jsonb, text, text)'::regprocedure
             THEN 'queen.push(text, jsonb, text, text, jsonb, timestamptz)'
           WHEN 'queen.pop(text, text, int, text, int, bool, int, int, text)'::regprocedure
             THEN 'queen.pop(text, text, int, text, int, bool, int, int, text, bigint)'
           WHEN 'queen.configure(text, int, int, bool, bool, int, bool, int)'::regprocedure
             THEN 'queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, interval)'
           ELSE 'queen.ack(uuid, uuid, bigint, text, text, interval)' END,
         CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END,
         CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END), '; '), ''), true)
  FROM pg_proc p, aclexplode(p.proacl) a
 WHERE p.oid IN ('queen.push(text, jsonb, text, text)'::regprocedure,
                 'queen.pop(text, text, int, text, int, bool, int, int, text)'::regprocedure,
                 'queen.configure(text, int, int, bool, bool, int, bool, int)'::regprocedure,
                 'queen.ack(uuid, uuid, bigint, text, text)'::regprocedure)
   AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner;

-- push and push_batch become the C functions themselves (no SET clause: they pin their
-- search path in the library). push gains headers and deliver_at (issue 16).
DROP FUNCTION queen.push(text, jsonb, text, text);
CREATE FUNCTION queen.push(
    queue text,
    payload jsonb,
    partition text DEFAULT 'Default',
    transaction_id text DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    deliver_at timestamptz DEFAULT NULL
) RETURNS SETOF queen.push_result
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'push_one_wrapper';
REVOKE ALL ON FUNCTION queen.push(text, jsonb, text, text, jsonb, timestamptz) FROM PUBLIC;
COMMENT ON FUNCTION queen.push(text, jsonb, text, text, jsonb, timestamptz) IS
  'queen: push one message (with optional headers and delivery time); returns queen.push_result (status queued or duplicate)';
CREATE OR REPLACE FUNCTION queen.push_batch(items jsonb) RETURNS SETOF queen.push_result
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'push_batch_wrapper';
COMMENT ON FUNCTION queen.push_batch(jsonb) IS
  'queen: push a JSON array of {queue, partition?, payload, transactionId?, headers?, deliverAt?} atomically';
DROP FUNCTION queen._push(text, jsonb, text, text);
DROP FUNCTION queen._push_batch(jsonb);

-- New internal functions (not granted) and queen.compact.
CREATE FUNCTION queen."_readable"(
	"partition_id" uuid, /* pgrx :: Uuid */
	"head" bigint /* i64 */
) RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'readable_sql_wrapper';
CREATE FUNCTION queen."_queues_changed"() RETURNS void
STRICT VOLATILE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'queues_changed_wrapper';
CREATE FUNCTION queen."_own_queue"(
	"queue_id" bigint /* i64 */
) RETURNS void
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'own_queue_sql_wrapper';
CREATE FUNCTION queen."compact"(
	"queue" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS jsonb /* JsonB */
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'compact_wrapper';
CREATE FUNCTION queen."_group_hash"(
	"name" TEXT /* & str */
) RETURNS bytea /* Vec < u8 > */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'group_hash_sql_wrapper';
CREATE FUNCTION queen."_lane"(
	"partition_id" uuid, /* pgrx :: Uuid */
	"consumer_group" TEXT, /* & str */
	"committed" bigint, /* i64 */
	"lease_id" uuid, /* Option < pgrx :: Uuid > */
	"lease_expires_at" timestamp with time zone, /* Option < pgrx :: datum :: TimestampWithTimeZone > */
	"batch_end" bigint, /* Option < i64 > */
	"retry_count" INT, /* i32 */
	"attempt_count" INT /* i32 */
) RETURNS TABLE (
	"committed" bigint,  /* i64 */
	"lease_id" uuid,  /* Option < pgrx :: Uuid > */
	"lease_expires_at" timestamp with time zone,  /* Option < pgrx :: datum :: TimestampWithTimeZone > */
	"batch_end" bigint,  /* Option < i64 > */
	"retry_count" INT,  /* i32 */
	"attempt_count" INT,  /* i32 */
	"retry_at" timestamp with time zone  /* Option < pgrx :: datum :: TimestampWithTimeZone > */
)
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'lane_sql_wrapper';
CREATE FUNCTION queen."_delete_lanes"(
	"queue_id" bigint /* i64 */
) RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE 
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'delete_lanes_wrapper';
CREATE FUNCTION queen."_save_journal"(
	"t" INT /* i32 */
) RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE 
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'save_journal_table_wrapper';
CREATE FUNCTION queen."_expire_lease"(
	"lease_id" uuid /* pgrx :: Uuid */
) RETURNS bigint /* i64 */
STRICT VOLATILE 
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'expire_lease_sql_wrapper';
CREATE FUNCTION queen."_claimable"(
	"partition_id" uuid, /* pgrx :: Uuid */
	"consumer_group" TEXT, /* & str */
	"head" bigint /* i64 */
) RETURNS bigint /* Option < i64 > */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'claimable_sql_wrapper';
CREATE FUNCTION queen."_committed"(
	"partition_id" uuid, /* pgrx :: Uuid */
	"consumer_group" TEXT, /* & str */
	"committed" bigint /* i64 */
) RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'committed_sql_wrapper';
ALTER FUNCTION queen.compact(text) SECURITY DEFINER;
CREATE FUNCTION queen._empty_journal(t int) RETURNS bool
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
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
-- push_batch for one queue, named first (routable on Citus: src/citus.rs).
CREATE FUNCTION queen.push_batch(queue text, items jsonb) RETURNS SETOF queen.push_result
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'push_batch_to_wrapper';
COMMENT ON FUNCTION queen.push_batch(text, jsonb) IS
  'queen: push a JSON array of {partition?, payload, transactionId?, headers?, deliverAt?} to one queue atomically';

-- The Citus routing guard for queen's SQL functions (src/citus.rs); not granted.
CREATE FUNCTION queen."_lives_elsewhere"(
	"queue" TEXT /* & str */
) RETURNS bool
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'lives_elsewhere_sql_wrapper';
REVOKE ALL ON FUNCTION queen._lives_elsewhere(text) FROM PUBLIC;
COMMENT ON FUNCTION queen._lives_elsewhere(text) IS
  'queen internal: on Citus, whether a queue''s home is another node (status, totals, dlq forward there); not granted';

CREATE FUNCTION queen."_ensure_home"(
	"queue" TEXT /* & str */
) RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'ensure_home_sql_wrapper';
REVOKE ALL ON FUNCTION queen._ensure_home(text) FROM PUBLIC;
COMMENT ON FUNCTION queen._ensure_home(text) IS
  'queen internal: on Citus, refuse (55000) a call about a queue on a node that is not its home (status, totals, dlq, delete_queue); not granted';

-- On Citus (docs/citus.md, src/citus.rs): status, totals and dlq for a queue whose home is
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

-- queen.distribute(): queen on a Citus coordinator (docs/citus.md). Distributes the
-- routing table queen_citus.queue_homes by queue name and makes every queen function whose
-- first argument is a queue (without a default) a distributed function colocated with it
-- (with the internal _status_at_home, _totals_at_home and _dlq_at_home, which status,
-- totals and dlq forward to), so that the coordinator delegates each call to the worker
-- that holds the queue. Likewise
-- queen_citus.id_routes by uuid, for the functions whose first argument is a lease id or a
-- partition id: a worker mints those ids so that they route back to it (src/citus.rs).
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

-- A rotation of the segment generations (src/generations.rs): the rows still in
-- generation `oldest` are copied into generation `current`, `oldest` is emptied with
-- TRUNCATE and becomes current. Returns the rows copied, or -1 when a lock it needs stayed
-- busy for the whole wait (each lock waits at most lock_timeout) or its wait would close a
-- cycle (nothing is done then). The caller holds the queen.generations row.
CREATE FUNCTION queen._rotate_segments(oldest int, current int) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '200ms'
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
REVOKE ALL ON FUNCTION queen._rotate_segments(int, int) FROM PUBLIC;
COMMENT ON FUNCTION queen._rotate_segments(int, int) IS 'queen internal: copy a segment generation''s live rows forward and empty it (background worker, retain); not granted';

REVOKE ALL ON FUNCTION queen._readable(uuid, bigint), queen._queues_changed(), queen.compact(text), queen._group_hash(text), queen._lane(uuid, text, bigint, uuid, timestamptz, bigint, int, int), queen._delete_lanes(bigint), queen._save_journal(int), queen._expire_lease(uuid), queen._claimable(uuid, text, bigint), queen._committed(uuid, text, bigint), queen._empty_journal(int), queen._own_queue(bigint) FROM PUBLIC;
COMMENT ON FUNCTION queen._readable(uuid, bigint) IS 'queen internal: a partition''s readable end (offsets below it are decided); not granted';
COMMENT ON FUNCTION queen._own_queue(bigint) IS 'queen internal: the queue lock in exclusive mode (delete_queue); not granted';
COMMENT ON FUNCTION queen._queues_changed() IS 'queen internal: backends drop their cached queue lookups (delete_queue); not granted';
COMMENT ON FUNCTION queen.compact(text) IS
  'queen: one compaction pass: merge the small segments of small pushes into large ones';
COMMENT ON FUNCTION queen._group_hash(text) IS 'queen internal: the lane registry''s hash of a group name; not granted';
COMMENT ON FUNCTION queen._lane(uuid, text, bigint, uuid, timestamptz, bigint, int, int) IS 'queen internal: a lane''s live state (status, totals); not granted';
COMMENT ON FUNCTION queen._delete_lanes(bigint) IS
  'queen internal: remove a queue''s lanes, from the table and the lane registry (delete_queue); not granted';
COMMENT ON FUNCTION queen._save_journal(int) IS
  'queen internal: save a lane journal table''s newest entries into queen.lanes (_empty_journal); not granted';
COMMENT ON FUNCTION queen._expire_lease(uuid) IS 'queen internal: end a lease now, as if it had expired (tests); not granted';
COMMENT ON FUNCTION queen._claimable(uuid, text, bigint) IS 'queen internal: a lane''s readable end when a pop may claim it (pop''s scan); not granted';
COMMENT ON FUNCTION queen._committed(uuid, text, bigint) IS 'queen internal: a lane''s live cursor (retention); not granted';
COMMENT ON FUNCTION queen._empty_journal(int) IS 'queen internal: save a lane journal table into queen.lanes and empty it (background worker); not granted';

-- status, totals and delete_queue read the readable end, the live lane state and both
-- tiers (CREATE OR REPLACE keeps their privileges and comments).
-- status shows a running retry backoff (issue 16).
ALTER TYPE queen.lane_status ADD ATTRIBUTE retry_at timestamptz;
CREATE OR REPLACE FUNCTION queen.status(queue text DEFAULT NULL) RETURNS SETOF queen.lane_status
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
  -- On Citus, a named queue is read on its home: a call that reached another node is
  -- forwarded there through the distributed form (docs/citus.md).
  IF status.queue IS NOT NULL AND queen._lives_elsewhere(status.queue) THEN
    RETURN QUERY EXECUTE format('SELECT * FROM queen._status_at_home(%L)', status.queue);
    RETURN;
  END IF;
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
     WHERE status.queue IS NULL OR q.name = status.queue
     ORDER BY q.name, p.name, l.consumer_group;
END $$;

CREATE OR REPLACE FUNCTION queen.totals(queue text DEFAULT NULL) RETURNS SETOF queen.queue_totals
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
  -- On Citus, a named queue is read on its home: a call that reached another node is
  -- forwarded there through the distributed form (docs/citus.md).
  IF totals.queue IS NOT NULL AND queen._lives_elsewhere(totals.queue) THEN
    RETURN QUERY EXECUTE format('SELECT * FROM queen._totals_at_home(%L)', totals.queue);
    RETURN;
  END IF;
  RETURN QUERY
    WITH q AS (
      SELECT q.queue_id, q.name, p.partitions, p.messages
        FROM queen.queues q
        CROSS JOIN LATERAL (SELECT count(*) AS partitions,
                                   coalesce(sum(queen._readable(partition_id, head)), 0)::int8 AS messages
                              FROM queen.partitions WHERE queue_id = q.queue_id) p
       WHERE totals.queue IS NULL OR q.name = totals.queue
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
BEGIN
  IF queue IS NULL THEN
    RAISE EXCEPTION 'queen: queue must not be NULL' USING ERRCODE = '22004';
  END IF;
  -- On Citus, only the queue's home deletes it (src/citus.rs).
  PERFORM queen._ensure_home(delete_queue.queue);
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
  DELETE FROM queen.queues q WHERE q.queue_id = qid;
  -- Every backend forgets where this queue's partitions were (src/queues.rs, targets).
  PERFORM queen._queues_changed();
  RETURN jsonb_build_object('queue', queue, 'deleted', true, 'partitions', n_partitions,
                            'segments', n_segments, 'deadLetters', n_dead);
END $$;

-- Consumer groups for deploy scripts (issue 14).
CREATE FUNCTION queen."create_group"(
	"queue" TEXT, /* Option < & str > */
	"consumer_group" TEXT, /* Option < & str > */
	"subscription" TEXT DEFAULT 'all' /* Option < & str > */
) RETURNS jsonb /* pgrx :: JsonB */
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'create_group_wrapper';
ALTER FUNCTION queen.create_group(text, text, text) SECURITY DEFINER;
REVOKE ALL ON FUNCTION queen.create_group(text, text, text) FROM PUBLIC;
COMMENT ON FUNCTION queen.create_group(text, text, text) IS
  'queen: create a consumer group (subscription all or new) before its consumers start; a no-op if it exists';

-- queen.pop gains max_bytes (issue 14: a byte budget per pop); its grants are given again
-- below.
DROP FUNCTION queen.pop(text, text, int, text, int, bool, int, int, text);
DROP FUNCTION queen._pop(text, text, int, text, int, bool, int, int, text);
-- Messages carry headers (issue 16): pop returns them as a last column.
ALTER TYPE queen.message ADD ATTRIBUTE headers jsonb;
CREATE FUNCTION queen.pop(
    queue text,
    consumer_group text DEFAULT '__QUEUE_MODE__',
    batch int DEFAULT 1,
    partition text DEFAULT NULL,
    lease_seconds int DEFAULT 0,
    auto_ack bool DEFAULT false,
    wait_ms int DEFAULT 0,
    max_partitions int DEFAULT 1,
    subscription text DEFAULT 'all',
    max_bytes bigint DEFAULT 33554432
) RETURNS SETOF queen.message
LANGUAGE c VOLATILE SECURITY DEFINER
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS 'MODULE_PATHNAME', 'pop_wrapper';
REVOKE ALL ON FUNCTION queen.pop(text, text, int, text, int, bool, int, int, text, bigint) FROM PUBLIC;
COMMENT ON FUNCTION queen.pop(text, text, int, text, int, bool, int, int, text, bigint) IS
  'queen: claim up to batch messages (and max_bytes of payload) under one lease (or auto_ack); returns queen.message rows';

-- configure: encryption defaults to NULL (keep); an encrypted queue is not turned off
-- unless encryption => false is given (issue 14). Retry backoff and delayed queues (issue
-- 16): configure gains retry_backoff, retry_backoff_max and delay, and the ack of one
-- offset gains retry_after.
-- The grants of the old functions, read at the top, are given to the new ones here.
ALTER TABLE queen.queues ADD COLUMN retry_backoff interval NOT NULL DEFAULT '0s',
                         ADD COLUMN retry_backoff_max interval NOT NULL DEFAULT '600s',
                         ADD COLUMN delay interval NOT NULL DEFAULT '0s';
DROP FUNCTION queen.configure(text, int, int, bool, bool, int, bool, int);
DROP FUNCTION queen.ack(uuid, uuid, bigint, text, text);
CREATE FUNCTION queen."configure"(
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
	"delay" interval DEFAULT '0s' /* Option < pgrx :: datum :: Interval > */
) RETURNS jsonb /* pgrx :: JsonB */
SECURITY DEFINER
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'configure_wrapper';
REVOKE ALL ON FUNCTION queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, interval) FROM PUBLIC;
COMMENT ON FUNCTION queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, interval) IS
  'queen: create or update a queue; returns its options in camelCase';
CREATE FUNCTION queen."ack"(
	"lease_id" uuid, /* Option < pgrx :: Uuid > */
	"partition_id" uuid, /* Option < pgrx :: Uuid > */
	"msg_offset" bigint, /* Option < i64 > */
	"status" TEXT DEFAULT 'completed', /* Option < & str > */
	"error" TEXT DEFAULT NULL, /* Option < & str > */
	"retry_after" interval DEFAULT NULL /* Option < pgrx :: datum :: Interval > */
) RETURNS jsonb /* JsonB */
SECURITY DEFINER 
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'ack_one_wrapper';
ALTER FUNCTION queen.ack(uuid, uuid, bigint, text, text, interval)
  SET plan_cache_mode = force_generic_plan SET enable_seqscan = off;
REVOKE ALL ON FUNCTION queen.ack(uuid, uuid, bigint, text, text, interval) FROM PUBLIC;
COMMENT ON FUNCTION queen.ack(uuid, uuid, bigint, text, text, interval) IS
  'queen: ack one offset under a lease (completed, failed, retry, dlq; retry_after delays a redelivery)';
COMMENT ON FUNCTION queen.ack(uuid, jsonb) IS
  'queen: ack [{partitionId, offset, status?, error?, retryAfter?}] under a lease (completed, failed, retry, dlq)';
DO $$
BEGIN
  IF current_setting('queen_upgrade.replaced_grants') <> '' THEN
    EXECUTE current_setting('queen_upgrade.replaced_grants');
  END IF;
END $$;

-- Removing and moving consumer groups (issue 14).
CREATE FUNCTION queen."drop_group"(
	"queue" TEXT, /* Option < & str > */
	"consumer_group" TEXT, /* Option < & str > */
	"force" bool DEFAULT false /* Option < bool > */
) RETURNS jsonb /* JsonB */
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'drop_group_wrapper';
CREATE FUNCTION queen."seek"(
	"queue" TEXT, /* Option < & str > */
	"consumer_group" TEXT, /* Option < & str > */
	"partition" TEXT DEFAULT NULL, /* Option < & str > */
	"to_offset" bigint DEFAULT NULL, /* Option < i64 > */
	"to_time" timestamp with time zone DEFAULT NULL, /* Option < TimestampWithTimeZone > */
	"force" bool DEFAULT false /* Option < bool > */
) RETURNS jsonb /* JsonB */
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'seek_wrapper';
ALTER FUNCTION queen.drop_group(text, text, bool) SECURITY DEFINER;
ALTER FUNCTION queen.seek(text, text, text, bigint, timestamptz, bool) SECURITY DEFINER;
REVOKE ALL ON FUNCTION queen.drop_group(text, text, bool), queen.seek(text, text, text, bigint, timestamptz, bool) FROM PUBLIC;
COMMENT ON FUNCTION queen.drop_group(text, text, bool) IS
  'queen: remove a consumer group (its cursors and leases) so that it no longer holds retention back';
COMMENT ON FUNCTION queen.seek(text, text, text, bigint, timestamptz, bool) IS
  'queen: move a consumer group''s cursors to an offset or to the first message at or after a time';

-- Poison messages (issue 14): queen.dlq lists a dead letter whose envelope cannot be
-- opened, with a NULL payload and the reason.
CREATE FUNCTION queen."_dead_letter_unopenable"(
	"envelope" bytea, /* & [u8] */
	"message_id" uuid /* pgrx :: Uuid */
) RETURNS TEXT /* Option < String > */
STRICT 
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'dead_letter_unopenable_wrapper';
REVOKE ALL ON FUNCTION queen._dead_letter_unopenable(bytea, uuid) FROM PUBLIC;
COMMENT ON FUNCTION queen._dead_letter_unopenable(bytea, uuid) IS 'queen internal: why a dead letter''s envelope cannot be opened (queen.dlq); not granted';
-- Dead letters keep their message's headers (issue 16), as stored, and list them as jsonb.
ALTER TABLE queen.log_dlq ADD COLUMN headers bytea;
ALTER TYPE queen.dead_letter ADD ATTRIBUTE headers jsonb;
CREATE FUNCTION queen."_dead_letter_headers"(
	"headers" bytea, /* & [u8] */
	"message_id" uuid /* pgrx :: Uuid */
) RETURNS jsonb /* Option < RawJsonb > */
STRICT 
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'dead_letter_headers_wrapper';
REVOKE ALL ON FUNCTION queen._dead_letter_headers(bytea, uuid) FROM PUBLIC;
COMMENT ON FUNCTION queen._dead_letter_headers(bytea, uuid) IS 'queen internal: a dead letter''s headers as jsonb, opened if sealed (queen.dlq); not granted';
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
       AND (dlq.consumer_group IS NULL OR d.consumer_group = dlq.consumer_group)
     ORDER BY d.failed_at DESC, d.id DESC
     LIMIT page_size OFFSET page_offset;
END $$;

-- Privileges ship as roles (sql/schema.sql has the same block for a fresh install): each
-- API function grants EXECUTE to queen_producer, queen_consumer or queen_admin. Grants an
-- operator made to other roles before the update stay as they were.
DO $roles$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'queen_producer') THEN
    CREATE ROLE queen_producer NOLOGIN;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'queen_consumer') THEN
    CREATE ROLE queen_consumer NOLOGIN;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'queen_admin') THEN
    CREATE ROLE queen_admin NOLOGIN;
    GRANT queen_producer, queen_consumer TO queen_admin;
  END IF;
END $roles$;
GRANT USAGE ON SCHEMA queen TO queen_producer, queen_consumer, queen_admin;
GRANT EXECUTE ON FUNCTION queen.push(text, jsonb, text, text, jsonb, timestamptz), queen.push_batch(jsonb) TO queen_producer;
GRANT EXECUTE ON FUNCTION queen.pop(text, text, int, text, int, bool, int, int, text, bigint),
    queen.ack(uuid), queen.ack(uuid, jsonb), queen.ack(uuid, uuid, bigint, text, text, interval),
    queen.extend_lease(uuid, int), queen.may_start(uuid, interval), queen.dlq(text, text, int, int)
  TO queen_consumer;
GRANT EXECUTE ON FUNCTION queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, interval),
    queen.configure_group(text, text, interval, interval, interval, interval),
    queen.create_group(text, text, text), queen.drop_group(text, text, bool),
    queen.seek(text, text, text, bigint, timestamptz, bool), queen.status(text), queen.totals(text),
    queen.retain(text), queen.compact(text), queen.delete_queue(text),
    queen.dlq_replay(uuid, text), queen.dlq_delete(uuid, text)
  TO queen_admin;

-- Metrics: the worker's retention counters (shared memory) and queen.metrics().
CREATE FUNCTION queen."_retention_stats"() RETURNS TABLE (
	"last_run_at" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"bytes_last" bigint,  /* i64 */
	"bytes_total" bigint,  /* i64 */
	"runs" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'retention_stats_wrapper';
REVOKE ALL ON FUNCTION queen._retention_stats() FROM PUBLIC;
COMMENT ON FUNCTION queen._retention_stats() IS
  'queen internal: the background worker''s retention counters (queen.metrics); not granted';
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
BEGIN
  IF kind IS NOT NULL AND kind NOT IN ('queue', 'group', 'dead_letters', 'retention') THEN
    RAISE EXCEPTION 'queen: invalid kind: % (must be queue, group, dead_letters, retention or NULL)', kind
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
                                  ('bytes', coalesce(s.bytes, 0)::float8)) m(metric, value);
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
       GROUP BY q.name, d.consumer_group;
  END IF;
  IF kind IS NULL OR kind = 'retention' THEN
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
END $$;
COMMENT ON FUNCTION queen.metrics(text) IS
  'queen: one row per metric and label set (queue, consumer group) for monitoring: sizes, lag, leases, retries, dead letters, retention; kind picks one part';
GRANT EXECUTE ON FUNCTION queen.metrics(text) TO queen_admin;
REVOKE ALL ON FUNCTION queen.metrics(text) FROM PUBLIC;

-- push_batch for one queue (created above) goes to producers, like push_batch(items).
REVOKE ALL ON FUNCTION queen.push_batch(text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queen.push_batch(text, jsonb) TO queen_producer;
