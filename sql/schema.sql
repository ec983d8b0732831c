-- queen storage. Reviewed by hand; nothing here is built from user input.
--
-- Locking protocol (it is what keeps the invariants: nothing skipped, no deadlock):
--   * A push reserves offsets in shared memory (src/offsets.rs) and locks no row: pushes to
--     one partition run and commit in parallel. A reader reads a partition only up to its
--     readable end, below which every push has ended; an aborted push leaves a gap there.
--     Without shared_preload_libraries there is no shared memory: a push then reserves with
--     UPDATE of its partition row and holds it until it commits (pushes to one partition
--     commit in offset order); a push_batch locks its partitions in (queue, partition)
--     name order.
--   * Compaction and retention lock a partition row FOR NO KEY UPDATE SKIP LOCKED while
--     they rewrite or delete its segments: never at once, and never waiting.
--   * A new partition gets a lane for every committed group; a new group gets a lane for
--     every committed partition. When both are created at the same moment and miss each
--     other, the group's pops add the missing lane (lookup::repair_lanes, run by a pop at
--     most once a second per backend and group, busy or not).
--     Neither path waits on a lock held by a consumer's open transaction.
--   * A pop claims lanes with FOR UPDATE SKIP LOCKED: it never waits on another's lane.
--   * An ack locks only the lanes of its lease, in partition_id order.

-- queen needs a UTF8 database: its names, transaction ids and error texts are Rust
-- strings, and the segments store UTF-8 (docs/concepts.md, "Limits"). This file and every
-- other part of the install script are ASCII (pg_test/sql/encoding.sql checks it), so the
-- check below is what a database of another encoding meets first.
DO $encoding$
BEGIN
  IF pg_catalog.getdatabaseencoding() <> 'UTF8' THEN
    RAISE EXCEPTION 'queen: this database''s encoding is %; queen needs a UTF8 database',
      pg_catalog.getdatabaseencoding()
      USING ERRCODE = 'feature_not_supported',
            HINT = 'Create the database with ENCODING ''UTF8'' (from template0 when the template has another encoding).';
  END IF;
END $encoding$;

-- Roles (docs/functions.md, "Privileges"): the extension ships its privileges as three
-- roles, and each API function grants EXECUTE to one of them where it is defined.
--   queen_producer  push, push_batch
--   queen_consumer  pop, ack, extend_lease, may_start, dlq
--   queen_admin     both of the above, and configure, configure_group, create_group,
--                   drop_group, seek, status, totals, metrics, retain, compact,
--                   delete_queue, dlq_replay, dlq_delete
-- A fourth role, queen_grantee, is not one to grant by hand: queen.grant makes a role a
-- member of it, and membership is what limits a role to the queues granted to it (its
-- members may call every API function; queen's own checks refuse them every other queue,
-- src/queue/privileges.rs). A role's EXECUTE rights from queen.grant and the mark that
-- limits it are then one and the same, so no restore can bring back one without the other.
-- Roles belong to the cluster, not to a database: a second database that installs queen
-- reuses them, and DROP EXTENSION leaves them (drop them by hand once no database uses
-- queen). They cannot log in; grant them to application roles.
DO $roles$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'queen_grantee') THEN
    CREATE ROLE queen_grantee NOLOGIN;
  END IF;
  -- queen_grantee's members get EXECUTE on every queen function, and queen limits them
  -- to their grants: a role of that name made by someone else, with more than that, is
  -- refused rather than adopted.
  IF EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = 'queen_grantee'
              AND (r.rolsuper OR r.rolcanlogin OR r.rolcreaterole OR r.rolcreatedb OR r.rolbypassrls
                   OR r.rolreplication
                   OR EXISTS (SELECT FROM pg_catalog.pg_auth_members m WHERE m.member = r.oid))) THEN
    RAISE EXCEPTION 'queen: the role queen_grantee exists with more than queen gives it (it can log in, has a role attribute, or is a member of another role)'
      USING ERRCODE = '55000',
            HINT = 'queen makes queen_grantee a NOLOGIN role with no attributes and no memberships; drop or fix that role first.';
  END IF;
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
GRANT USAGE ON SCHEMA queen TO queen_producer, queen_consumer, queen_admin, queen_grantee;

CREATE TABLE queen.queues (
    queue_id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                  text NOT NULL UNIQUE,
    lease_time            int  NOT NULL DEFAULT 60,
    retry_limit           int  NOT NULL DEFAULT 3,
    dead_letter_queue     bool NOT NULL DEFAULT true,
    dlq_after_max_retries bool NOT NULL DEFAULT true,
    dedup_window          int  NOT NULL DEFAULT 3600,
    encryption            bool NOT NULL DEFAULT false,
    retention             int  NOT NULL DEFAULT 0,
    -- the pause before a failed batch is delivered again: retry_backoff, doubled for each
    -- earlier failed ack of the batch, at most retry_backoff_max (0: at once)
    retry_backoff         interval NOT NULL DEFAULT '0s',
    retry_backoff_max     interval NOT NULL DEFAULT '600s',
    -- how long a message waits after its push before it may be delivered (0: at once)
    delay                 interval NOT NULL DEFAULT '0s',
    -- whether a pop may create a consumer group that does not exist yet
    create_groups         bool NOT NULL DEFAULT true,
    -- a partition nobody pushed to for this long, and that is empty, is dropped (0: never)
    partition_idle_ttl    interval NOT NULL DEFAULT '0s',
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    -- queen.pause: no pop of the queue delivers while set (queen.resume clears it)
    paused                bool NOT NULL DEFAULT false,
    -- a message older than this is not delivered to a group that has not consumed it: it
    -- becomes a dead letter with reason 'expired', or is dropped without a DLQ (0: never)
    ttl                   interval NOT NULL DEFAULT '0s',
    -- a push that would take the queue's depth (the lag of its slowest 'hold' group, or
    -- every stored message before any group exists) past this is refused (NULL: no limit)
    max_depth             bigint,
    -- a dead letter filed longer ago than this is deleted by the background worker (0: kept)
    dlq_retention         interval NOT NULL DEFAULT '0s'
);
COMMENT ON TABLE queen.queues IS 'queen: one row per queue and its options (see queen.configure)';

CREATE TABLE queen.partitions (
    partition_id uuid   PRIMARY KEY,
    queue_id     bigint NOT NULL REFERENCES queen.queues ON DELETE CASCADE,
    name         text   NOT NULL,
    -- last offset reserved by pushes without the offset registry (no shared memory); with
    -- it the registry holds the head, and this column is only a lower bound
    head         bigint NOT NULL DEFAULT 0,
    -- highest offset whose segment retention deleted: lanes created later start here
    retained_through bigint NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (queue_id, name)
) WITH (fillfactor = 70);
COMMENT ON TABLE queen.partitions IS 'queen: ordered lanes of a queue, each with its own offsets';

-- Both segment tiers are split by generation (queen-core::generations): writes go to the
-- current generation, and a rotation copies what is still live in the oldest one into the
-- current one and empties it with TRUNCATE (src/storage/generations.rs), which frees its space even
-- while a snapshot holds the xmin horizon back. queen.generations names the current one.
CREATE TABLE queen.generations (
    one                bool     PRIMARY KEY DEFAULT true CHECK (one),
    current_generation smallint NOT NULL DEFAULT 0 CHECK (current_generation IN (0, 1)),
    rotations          bigint   NOT NULL DEFAULT 0,
    rotated_at         timestamptz
);
INSERT INTO queen.generations DEFAULT VALUES;
COMMENT ON TABLE queen.generations IS 'queen: the segment tables'' current generation (one row)';

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
COMMENT ON TABLE queen.segments IS 'queen: immutable compressed runs of messages: large pushes and compacted runs';
COMMENT ON TABLE queen.segments_0 IS 'queen: segments of generation 0';
COMMENT ON TABLE queen.segments_1 IS 'queen: segments of generation 1';

-- The fresh tier: the segment of each push of fewer than 64 messages to a partition, until
-- compaction (src/storage/compaction.rs) merges a run of them into one row of queen.segments. Its
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

CREATE TABLE queen.groups (
    queue_id        bigint NOT NULL REFERENCES queen.queues ON DELETE CASCADE,
    consumer_group  text   NOT NULL,
    subscription    text   NOT NULL DEFAULT 'all',
    -- consumer lease budget (queen.configure_group); NULL when none is stored
    handler_timeout interval,
    queue_margin    interval,
    timeout_grace   interval,
    record_margin   interval,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- queen.pause(queue, group): no pop of this group delivers while set
    paused          bool NOT NULL DEFAULT false,
    -- the group's lag allowed in each partition (NULL: no limit), and what happens past it:
    -- 'hold' refuses pushes there, 'skip' passes over the oldest (queen.configure_group)
    max_lag         bigint,
    on_overflow     text NOT NULL DEFAULT 'hold' CHECK (on_overflow IN ('hold', 'skip')),
    PRIMARY KEY (queue_id, consumer_group)
);
COMMENT ON TABLE queen.groups IS 'queen: consumer groups of a queue';

-- Rate limits and concurrency caps of a consumer group (queen.configure_limit): `key` is a
-- partition name prefix (its partitions share one bucket) or '*' (each partition its own);
-- NULL means no limit of that kind.
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
-- many, and which offsets past the group's cursor were counted (a later pop that meets
-- them again, after a lease ended, counts them once; src/ops/pop.rs, count_dropped).
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
-- The counts of partitions since deleted (drop_partition, partition_idle_ttl), per queue and
-- group, so that the count never goes down while the group exists (src/storage/churn.rs).
CREATE TABLE queen.expired_drops_folded (
    queue_id        bigint NOT NULL REFERENCES queen.queues ON DELETE CASCADE,
    consumer_group  text   NOT NULL,
    dropped         bigint NOT NULL,
    PRIMARY KEY (queue_id, consumer_group)
);
COMMENT ON TABLE queen.expired_drops_folded IS 'queen: expired messages dropped without a dead letter in partitions since deleted';
REVOKE ALL ON queen.expired_drops_folded FROM PUBLIC;

-- One row per (partition, consumer group). Only non-indexed columns change on pop and
-- ack, so those updates stay HOT; fillfactor leaves room for them on the page.
CREATE TABLE queen.lanes (
    partition_id      uuid   NOT NULL,
    consumer_group    text   NOT NULL,
    queue_id          bigint NOT NULL,
    committed         bigint NOT NULL DEFAULT 0,
    lease_id          uuid,
    lease_expires_at  timestamptz,
    batch_end         bigint,
    batch_retry_count int    NOT NULL DEFAULT 0,
    attempt_count     int    NOT NULL DEFAULT 0,
    -- first offset of the latest claim: a reclaim at the same start counts an attempt
    claim_start       bigint,
    -- when the lane was last claimed (telemetry)
    last_claimed_at   timestamptz,
    -- the lane journal's number of the cursor and retry count saved here
    journal_seq       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (partition_id, consumer_group)
) WITH (fillfactor = 50);
-- A pop scans a group's lanes in partition order from a cursor (see pop::claim_candidates).
-- None of these columns change on claim or ack, so lane updates stay HOT.
CREATE INDEX lanes_queue_group ON queen.lanes (queue_id, consumer_group, partition_id);
COMMENT ON TABLE queen.lanes IS 'queen: a consumer group''s cursor and lease on one partition';

-- With shared_preload_libraries = 'queen', a lane's live state (cursor, retry count,
-- lease) is kept in shared memory (src/lane/registry.rs) and queen.lanes holds the cursor and
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

-- Which lanes a lease holds, for ack(lease_id) and extend_lease without a lease_id index
-- on lanes (which would make every claim a non-HOT update).
CREATE TABLE queen.leases (
    lease_id       uuid   PRIMARY KEY,
    queue_id       bigint NOT NULL,
    consumer_group text   NOT NULL,
    partition_ids  uuid[] NOT NULL,
    expires_at     timestamptz NOT NULL
);
COMMENT ON TABLE queen.leases IS 'queen: the lanes each live lease holds';

-- API result types.
CREATE TYPE queen.push_result AS (
    idx            int,
    status         text,
    message_id     uuid,
    transaction_id text,
    partition_id   uuid,
    msg_offset     bigint
);

CREATE TYPE queen.message AS (
    lease_id         uuid,
    lease_expires_at timestamptz,
    partition_id     uuid,
    partition        text,
    consumer_group   text,
    msg_offset       bigint,
    message_id       uuid,
    transaction_id   text,
    payload          jsonb,
    created_at       timestamptz,
    attempt          int,
    headers          jsonb
);

-- Internal tables are for the extension's functions only.
REVOKE ALL ON ALL TABLES IN SCHEMA queen FROM PUBLIC;

-- Dead-lettered messages: a snapshot of the frame, filed by the ack that gave up on it.
-- Retention never touches these rows; only dlq_replay, dlq_delete and delete_queue do
-- (and the update to 0.4.0, which removed a group's later rows of a message already filed).
CREATE TABLE queen.log_dlq (
    id             uuid   PRIMARY KEY,
    queue_id       bigint NOT NULL REFERENCES queen.queues ON DELETE CASCADE,
    partition_id   uuid   NOT NULL,
    consumer_group text   NOT NULL,
    msg_offset     bigint NOT NULL,
    message_id     uuid   NOT NULL,
    transaction_id text   NOT NULL,
    -- the payload; for an encrypted queue NULL, and the sealed envelope in `envelope`
    data           jsonb,
    error_message  text   NOT NULL,
    retry_count    int    NOT NULL,
    failed_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    envelope       bytea,
    -- the message's headers as the segment held them (jsonb's binary form, or an
    -- envelope of an encrypted queue); NULL when it had none. queen.dlq shows them as jsonb.
    headers        bytea,
    -- a span of offsets passed without delivery (queen.purge, a skip group's overflow):
    -- msg_offset..last_offset, no payload; NULL for a dead-lettered message
    last_offset    bigint,
    -- why: 'failed' (an ack gave up on it, or asked for it: status dlq), 'unreadable' (it
    -- cannot be decoded or opened), 'expired' (older than the queue's ttl), 'purged' (a
    -- span queen.purge passed), 'skipped' (a span a skip group passed past its max_lag)
    reason         text   NOT NULL DEFAULT 'failed'
                   CHECK (reason IN ('failed', 'unreadable', 'expired', 'purged', 'skipped')),
    -- when queen.dlq_redrive pushed it again (NULL: not yet); it is redriven once unless forced
    redriven_at    timestamptz,
    CONSTRAINT log_dlq_check CHECK ((data IS NULL) <> (envelope IS NULL) OR last_offset IS NOT NULL)
);
CREATE INDEX log_dlq_address ON queen.log_dlq (partition_id, transaction_id);
-- A group files a message once (src/ops/dlq.rs): the same message (or damaged segment,
-- whose row has its own transaction id) is never filed twice, whatever the snapshots of
-- the transactions that meet it. Spans (last_offset set) are not messages.
CREATE UNIQUE INDEX log_dlq_message ON queen.log_dlq (partition_id, consumer_group, msg_offset, transaction_id)
  WHERE last_offset IS NULL;
CREATE INDEX log_dlq_failed_at ON queen.log_dlq (failed_at DESC);
-- A skip group's span is merged into the lane's row that ends right before it
-- (src/ops/dlq.rs, file_skipped): that row is found here.
CREATE INDEX log_dlq_skipped ON queen.log_dlq (partition_id, consumer_group, last_offset) WHERE reason = 'skipped';
CREATE INDEX log_dlq_queue ON queen.log_dlq (queue_id, consumer_group);
-- A queue's dead letters by age: the worker's expiry of those older than its dlq_retention.
CREATE INDEX log_dlq_queue_age ON queen.log_dlq (queue_id, failed_at);
COMMENT ON TABLE queen.log_dlq IS 'queen: the dead-letter queue';
REVOKE ALL ON queen.log_dlq FROM PUBLIC;

-- Producer-supplied transaction ids seen within a queue's dedup window. Expired entries
-- are pruned by later pushes to the same partition, and by the background worker.
CREATE TABLE queen.dedup (
    partition_id   uuid   NOT NULL,
    transaction_id text   NOT NULL,
    message_id     uuid   NOT NULL,
    msg_offset     bigint NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, transaction_id)
);
COMMENT ON TABLE queen.dedup IS 'queen: recent producer transaction ids, for the dedup window';
REVOKE ALL ON queen.dedup FROM PUBLIC;

-- Privileges on single queues (queen.grant, src/queue/privileges.rs): a member of
-- queen_grantee that holds no queen role may use the queues granted to it here, and no
-- other (none, once its last grant goes: it stays a member).
CREATE TABLE queen.queue_grants (
    queue_id   bigint NOT NULL REFERENCES queen.queues ON DELETE CASCADE,
    -- regrole: a dump (below) writes the role's name, and a restore finds the role by it
    grantee    regrole NOT NULL,
    privilege  text   NOT NULL CHECK (privilege IN ('produce', 'consume', 'admin')),
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, grantee, privilege)
);
COMMENT ON TABLE queen.queue_grants IS 'queen: privileges on single queues (queen.grant)';
REVOKE ALL ON queen.queue_grants FROM PUBLIC;


-- Backups with pg_dump (docs/concepts.md, "Backup and restore"): a dump holds the rows of
-- these tables (an extension's tables are otherwise left out, so a restore would bring back
-- an empty queen), and the queue id sequence's position. Not dumped: queen.generations,
-- whose one row the install script makes (a restore keeps its default, which is correct
-- wherever the rows are: see generations.rs), and queen.limit_buckets (tokens and lanes in
-- flight, which refill). A grant of a role that no longer exists is
-- left out; the others are written with the role's name. The update scripts carry these lines over
-- (scripts/upgrade_sql.py).
SELECT pg_catalog.pg_extension_config_dump('queen.queues', '');
SELECT pg_catalog.pg_extension_config_dump('queen.queues_queue_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('queen.partitions', '');
SELECT pg_catalog.pg_extension_config_dump('queen.segments_0', '');
SELECT pg_catalog.pg_extension_config_dump('queen.segments_1', '');
SELECT pg_catalog.pg_extension_config_dump('queen.fresh_segments_0', '');
SELECT pg_catalog.pg_extension_config_dump('queen.fresh_segments_1', '');
SELECT pg_catalog.pg_extension_config_dump('queen.groups', '');
SELECT pg_catalog.pg_extension_config_dump('queen.limits', '');
SELECT pg_catalog.pg_extension_config_dump('queen.expired_drops', '');
SELECT pg_catalog.pg_extension_config_dump('queen.expired_drops_folded', '');
SELECT pg_catalog.pg_extension_config_dump('queen.lanes', '');
SELECT pg_catalog.pg_extension_config_dump('queen.lane_journal_0', '');
SELECT pg_catalog.pg_extension_config_dump('queen.lane_journal_1', '');
SELECT pg_catalog.pg_extension_config_dump('queen.leases', '');
SELECT pg_catalog.pg_extension_config_dump('queen.log_dlq', '');
SELECT pg_catalog.pg_extension_config_dump('queen.dedup', '');
SELECT pg_catalog.pg_extension_config_dump('queen.queue_grants',
  'WHERE grantee::oid IN (SELECT oid FROM pg_catalog.pg_roles)');
