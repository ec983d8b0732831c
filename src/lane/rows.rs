//! Every statement that writes `queen.lanes`, the table form of a lane: one function per
//! transition of `queen_core::lane` (which decides them) plus the lanes' creation and
//! removal. The lane registry's copies of lanes live in shared memory (`lanes.rs`); these
//! rows are what a pop or ack writes without it, and what the registry loads from.
//! The PL/pgSQL callers `queen.delete_queue` and `queen._empty_journal` reach theirs
//! through `queen._delete_lanes` and `queen._save_journal` below.

use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::pg::clock::timestamptz;
use crate::pg::errors::SpiExt;
use crate::pg::spi::{first_value, run};

/// A new partition gets a lane at 0 for every committed group of its queue. The groups'
/// rows are key-share-locked, without waiting: a group whose row a `seek`, `purge`,
/// `drop_group`, `pause` or `resume` holds right now gets no lane here. One being dropped
/// must get none; any other gets it from a later pop's repair (`create_missing`, at the
/// partition's start, at most once a second per session: retention keeps the partition
/// meanwhile, a missing lane holding its floor at 0). Waiting for that row would deadlock
/// a transaction that popped a lane the holder waits for, then pushed to a new partition.
pub fn create_for_partition(client: &mut SpiClient<'_>, partition_id: pgrx::Uuid, queue_id: i64) {
    run(
        client,
        "INSERT INTO queen.lanes (partition_id, consumer_group, queue_id, committed)
         SELECT $1, g.consumer_group, $2, 0
           FROM (SELECT consumer_group FROM queen.groups WHERE queue_id = $2 FOR KEY SHARE SKIP LOCKED) g
         ON CONFLICT DO NOTHING",
        &[partition_id.into(), queue_id.into()],
    );
}

/// A new group gets a lane for every partition of its queue: at the readable end for
/// subscription 'new', else where retention left off. Returns their partitions (for
/// `registry::forget_on_abort`).
pub fn create_for_group(client: &mut SpiClient<'_>, queue_id: i64, group: &str, subscription: &str) -> Vec<pgrx::Uuid> {
    partition_ids(run(
        client,
        "INSERT INTO queen.lanes (partition_id, consumer_group, queue_id, committed)
         SELECT p.partition_id, $2, $1,
                CASE WHEN $3 = 'new' THEN queen._readable(p.partition_id, p.head) ELSE p.retained_through END
           FROM queen.partitions p WHERE p.queue_id = $1
         ON CONFLICT DO NOTHING RETURNING partition_id",
        &[queue_id.into(), group.into(), subscription.into()],
    ))
}

/// The partition ids a statement returned (its first column).
fn partition_ids(rows: pgrx::spi::SpiTupleTable<'_>) -> Vec<pgrx::Uuid> {
    rows.map(|r| r.get::<pgrx::Uuid>(1).or_raise().expect("a partition id")).collect()
}

/// The lanes a partition and a group created at the same moment both missed, for a group
/// that still exists and that no `seek` or `drop_group` holds right now (not waited for).
/// Returns the partitions of those added (for `registry::forget_on_abort`).
pub fn create_missing(client: &mut SpiClient<'_>, queue_id: i64, group: &str) -> Vec<pgrx::Uuid> {
    // Looked for first, without a lock: the group row's lock below gives the transaction an
    // xid and a WAL record, which a pop that finds nothing missing (nearly always) need not.
    let missing = first_value::<bool>(run(
        client,
        "SELECT EXISTS (SELECT 1 FROM queen.partitions p
                         WHERE p.queue_id = $1
                           AND NOT EXISTS (SELECT 1 FROM queen.lanes l
                                            WHERE l.partition_id = p.partition_id AND l.consumer_group = $2))",
        &[queue_id.into(), group.into()],
    ));
    if missing != Some(true) {
        return Vec::new();
    }
    partition_ids(run(
        client,
        "INSERT INTO queen.lanes (partition_id, consumer_group, queue_id, committed)
         SELECT p.partition_id, $2, $1, p.retained_through FROM queen.partitions p
          WHERE p.queue_id = $1
            AND NOT EXISTS (SELECT 1 FROM queen.lanes l
                             WHERE l.partition_id = p.partition_id AND l.consumer_group = $2)
            -- the group still exists, and no seek or drop_group holds it (that one is not
            -- waited for: a pop that waited here while holding a lane the seek waits for
            -- would deadlock; the repair comes back on a later pop)
            AND EXISTS (SELECT 1 FROM queen.groups g WHERE g.queue_id = $1 AND g.consumer_group = $2
                           FOR KEY SHARE SKIP LOCKED)
         ON CONFLICT DO NOTHING RETURNING partition_id",
        &[queue_id.into(), group.into()],
    ))
}

/// The claims of one pop, lane by lane (`queen_core::lane::claim`), kept column by column
/// as the statements below take them.
#[derive(Default)]
pub struct Claims {
    pub partition_ids: Vec<pgrx::Uuid>,
    pub ends: Vec<i64>,
    pub starts: Vec<i64>,
    pub attempts: Vec<i32>,
    /// Expired leases these lanes carried: their lease rows go.
    pub old_leases: Vec<pgrx::Uuid>,
}

impl Claims {
    /// One lane's claim: its span `start..=end`, the redelivery counter, and the expired
    /// lease it carried, if any.
    pub fn add(&mut self, partition_id: pgrx::Uuid, claim: queen_core::lane::Claim, old_lease: Option<pgrx::Uuid>) {
        self.partition_ids.push(partition_id);
        self.starts.push(claim.start);
        self.ends.push(claim.end);
        self.attempts.push(claim.attempt);
        self.old_leases.extend(old_lease);
    }

    /// Each lane's partition and claim, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = (pgrx::Uuid, queen_core::lane::Claim)> + '_ {
        (0..self.partition_ids.len()).map(|k| {
            let claim = queen_core::lane::Claim { start: self.starts[k], end: self.ends[k], attempt: self.attempts[k] };
            (self.partition_ids[k], claim)
        })
    }
}

/// A leasing pop: every claimed lane is leased to `lease_id` until `expires` with its span
/// and redelivery counter, and the lease row is written, in one statement.
#[allow(clippy::too_many_arguments)]
pub fn claim_leased(
    client: &mut SpiClient<'_>,
    queue_id: i64,
    group: &str,
    c: Claims,
    lease_id: pgrx::Uuid,
    expires: i64,
    now: i64,
) {
    run(
        client,
        "WITH claimed AS (
           UPDATE queen.lanes l
              SET lease_id = $3, lease_expires_at = $4, batch_end = v.batch_end,
                  claim_start = v.claim_start, attempt_count = v.attempt,
                  last_claimed_at = $5
             FROM unnest($1::uuid[], $2::int8[], $6::int8[], $7::int4[])
                  AS v(partition_id, batch_end, claim_start, attempt)
            WHERE l.partition_id = v.partition_id AND l.consumer_group = $8
         ), expired AS (
           DELETE FROM queen.leases WHERE lease_id = ANY($9::uuid[])
         )
         INSERT INTO queen.leases (lease_id, queue_id, consumer_group, partition_ids, expires_at)
         VALUES ($3, $10, $8, $1, $4)",
        &[
            c.partition_ids.into(),
            c.ends.into(),
            lease_id.into(),
            timestamptz(expires).into(),
            timestamptz(now).into(),
            c.starts.into(),
            c.attempts.into(),
            group.into(),
            c.old_leases.into(),
            queue_id.into(),
        ],
    );
}

/// An auto-ack pop (`queen_core::lane::auto_ack`): no lease; each cursor moves to its
/// span's end in this same call, and the lane is left free with its counters reset.
pub fn claim_auto_ack(client: &mut SpiClient<'_>, group: &str, c: Claims, now: i64) {
    run(
        client,
        "WITH done AS (
           UPDATE queen.lanes l
              SET committed = v.batch_end, lease_id = NULL, lease_expires_at = NULL,
                  batch_end = NULL, claim_start = NULL, attempt_count = 0,
                  batch_retry_count = 0, last_claimed_at = $3
             FROM unnest($1::uuid[], $2::int8[]) AS v(partition_id, batch_end)
            WHERE l.partition_id = v.partition_id AND l.consumer_group = $4
         )
         DELETE FROM queen.leases WHERE lease_id = ANY($5::uuid[])",
        &[c.partition_ids.into(), c.ends.into(), timestamptz(now).into(), group.into(), c.old_leases.into()],
    );
}

/// A lane whose only pending offsets are poison (filed as dead letters): its cursor
/// passes them.
pub fn pass(client: &mut SpiClient<'_>, partition_id: pgrx::Uuid, group: &str, to: i64) {
    run(
        client,
        "UPDATE queen.lanes SET committed = greatest(committed, $3), batch_retry_count = 0
          WHERE partition_id = $1 AND consumer_group = $2",
        &[partition_id.into(), group.into(), to.into()],
    );
}

/// The ack plans of one call, lane by lane (`queen_core::lane::apply_ack`), kept column
/// by column as the statement below takes them.
#[derive(Default)]
pub struct AckPlans {
    pub partition_ids: Vec<pgrx::Uuid>,
    pub committed: Vec<i64>,
    pub release: Vec<bool>,
    pub retry: Vec<i32>,
    pub reset: Vec<bool>,
    /// The end of a released lane's retry backoff (`queen_core::lane::retry_at`), kept in
    /// its lease expiry while it has no lease.
    pub retry_at: Vec<Option<pgrx::datum::TimestampWithTimeZone>>,
}

/// One lane's part of an ack, as `AckPlans` keeps it.
pub struct AckPlan {
    pub partition_id: pgrx::Uuid,
    pub committed: i64,
    pub release: bool,
    pub retry: i32,
    pub reset: bool,
    /// The end of the lane's retry backoff, in microseconds (None: none).
    pub retry_at: Option<i64>,
}

impl AckPlans {
    pub fn add(&mut self, p: AckPlan) {
        self.partition_ids.push(p.partition_id);
        self.committed.push(p.committed);
        self.release.push(p.release);
        self.retry.push(p.retry);
        self.reset.push(p.reset);
        self.retry_at.push(p.retry_at.map(crate::pg::clock::timestamptz));
    }

    pub fn is_empty(&self) -> bool {
        self.partition_ids.is_empty()
    }

    /// Each lane's plan, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = AckPlan> + '_ {
        (0..self.partition_ids.len()).map(|k| AckPlan {
            partition_id: self.partition_ids[k],
            committed: self.committed[k],
            release: self.release[k],
            retry: self.retry[k],
            reset: self.reset[k],
            retry_at: self.retry_at[k].map(i64::from),
        })
    }
}

/// Applies an ack's plans, and drops the lease row once no lane holds the lease any more,
/// in one statement. (The DELETE sees the lanes as they were before the UPDATE, so the
/// lanes this UPDATE releases are subtracted explicitly.)
pub fn apply_acks(client: &mut SpiClient<'_>, lease_id: pgrx::Uuid, group: &str, p: AckPlans) {
    run(
        client,
        "WITH applied AS (
           UPDATE queen.lanes l
              SET committed = v.committed,
                  lease_id = CASE WHEN v.release THEN NULL ELSE l.lease_id END,
                  lease_expires_at = CASE WHEN v.release THEN v.retry_at ELSE l.lease_expires_at END,
                  batch_end = CASE WHEN v.release THEN NULL ELSE l.batch_end END,
                  batch_retry_count = v.retry,
                  attempt_count = CASE WHEN v.reset THEN 0 ELSE l.attempt_count END,
                  claim_start = CASE WHEN v.reset THEN NULL ELSE l.claim_start END
             FROM unnest($1::uuid[], $2::int8[], $3::bool[], $4::int4[], $5::bool[], $8::timestamptz[])
                  AS v(partition_id, committed, release, retry, reset, retry_at)
            WHERE l.partition_id = v.partition_id AND l.consumer_group = $6
           RETURNING l.partition_id, v.release
         )
         DELETE FROM queen.leases le
          WHERE le.lease_id = $7
            AND EXISTS (SELECT 1 FROM applied WHERE release)
            AND NOT EXISTS (
                  SELECT 1 FROM queen.lanes l
                   WHERE l.partition_id = ANY(le.partition_ids) AND l.lease_id = $7
                     AND NOT EXISTS (SELECT 1 FROM applied a
                                      WHERE a.partition_id = l.partition_id AND a.release))",
        &[
            p.partition_ids.into(),
            p.committed.into(),
            p.release.into(),
            p.retry.into(),
            p.reset.into(),
            group.into(),
            lease_id.into(),
            p.retry_at.into(),
        ],
    );
}

/// `extend_lease` (`queen_core::lane::extend`): every lane the lease still holds lasts
/// until at least `target`, never shorter, locked in partition order as an ack locks them
/// (`queen_core::lock_order`); the lease row follows. Returns how many lanes were renewed
/// and their earliest expiry (ISO 8601, UTC).
pub fn extend(client: &mut SpiClient<'_>, lease_id: pgrx::Uuid, target: i64, now: i64) -> (i64, Option<String>) {
    let row = run(
        client,
        concat!(
            r#"WITH lease AS (
             SELECT partition_ids FROM queen.leases WHERE lease_id = $1
           ), locked AS (
             SELECT l.partition_id, l.consumer_group FROM queen.lanes l, lease
              WHERE l.partition_id = ANY(lease.partition_ids) AND l.lease_id = $1
              ORDER BY l.partition_id
                FOR UPDATE OF l
           ), renewed AS (
             UPDATE queen.lanes l SET lease_expires_at = greatest(l.lease_expires_at, $2)
               FROM locked k
              WHERE l.partition_id = k.partition_id AND l.consumer_group = k.consumer_group
                AND l.lease_id = $1 AND "#,
            queen_core::lease_live_sql!("l", "$3"),
            r#"
             RETURNING l.lease_expires_at
           ), stored AS (
             UPDATE queen.leases SET expires_at = greatest(expires_at, $2)
              WHERE lease_id = $1 AND EXISTS (SELECT 1 FROM renewed)
           )
           SELECT count(*)::int8,
                  to_char(min(lease_expires_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
             FROM renewed"#
        ),
        &[lease_id.into(), timestamptz(target).into(), timestamptz(now).into()],
    );
    let row = row.first();
    (row.get::<i64>(1).or_raise().unwrap_or(0), row.get::<String>(2).or_raise())
}

/// Ends a lease now, as if it had expired (tests): its lanes become claimable.
pub fn expire_lease(client: &mut SpiClient<'_>, lease_id: pgrx::Uuid, now: i64) -> i64 {
    first_value::<i64>(run(
        client,
        concat!(
            "WITH e AS (UPDATE queen.lanes l SET lease_expires_at = $2 WHERE l.lease_id = $1 AND ",
            queen_core::lease_live_sql!("l", "$2"),
            " RETURNING 1) SELECT count(*)::int8 FROM e"
        ),
        &[lease_id.into(), timestamptz(now - 1).into()],
    ))
    .unwrap_or(0)
}

/// `revoke_lease`: every lane the lease still holds, live, is released (locked in
/// partition order, as an ack locks them); its cursor and claim counters stay, so the next
/// claim counts a redelivery. The lease row goes. Returns how many lanes.
pub fn revoke_lease(client: &mut SpiClient<'_>, lease_id: pgrx::Uuid, now: i64) -> i64 {
    first_value::<i64>(run(
        client,
        concat!(
            "WITH locked AS (
               SELECT l.partition_id, l.consumer_group FROM queen.lanes l, queen.leases le
                WHERE le.lease_id = $1 AND l.partition_id = ANY(le.partition_ids) AND l.lease_id = $1
                ORDER BY l.partition_id
                  FOR UPDATE OF l
             ), released AS (
               UPDATE queen.lanes l SET lease_id = NULL, lease_expires_at = NULL, batch_end = NULL
                 FROM locked k
                WHERE l.partition_id = k.partition_id AND l.consumer_group = k.consumer_group AND ",
            queen_core::lease_live_sql!("l", "$2"),
            "
               RETURNING 1
             ), gone AS (
               DELETE FROM queen.leases WHERE lease_id = $1
             )
             SELECT count(*)::int8 FROM released"
        ),
        &[lease_id.into(), timestamptz(now).into()],
    ))
    .unwrap_or(0)
}

/// `seek`: the lane's cursor moves to `to`, any lease it carried ends, its counters reset.
pub fn seek(client: &mut SpiClient<'_>, partition_id: pgrx::Uuid, group: &str, to: i64) {
    run(
        client,
        "UPDATE queen.lanes SET committed = $3, batch_retry_count = 0, lease_id = NULL,
                lease_expires_at = NULL, batch_end = NULL, claim_start = NULL, attempt_count = 0
          WHERE partition_id = $1 AND consumer_group = $2",
        &[partition_id.into(), group.into(), to.into()],
    );
}

/// `drop_group`: the group's lanes, leases, counts of expired messages dropped, limits and
/// their buckets, and row go, in one statement (a group created again under the name
/// starts its counts anew, with no limit). Each table by name, not by the foreign keys'
/// cascades, which `session_replication_role = replica` turns off.
pub fn drop_group(client: &mut SpiClient<'_>, queue_id: i64, group: &str) {
    run(
        client,
        "WITH le AS (DELETE FROM queen.leases WHERE queue_id = $1 AND consumer_group = $2),
              la AS (DELETE FROM queen.lanes WHERE queue_id = $1 AND consumer_group = $2),
              lb AS (DELETE FROM queen.limit_buckets WHERE queue_id = $1 AND consumer_group = $2),
              li AS (DELETE FROM queen.limits WHERE queue_id = $1 AND consumer_group = $2),
              ed AS (DELETE FROM queen.expired_drops e USING queen.partitions p
                      WHERE p.queue_id = $1 AND e.partition_id = p.partition_id AND e.consumer_group = $2),
              ef AS (DELETE FROM queen.expired_drops_folded WHERE queue_id = $1 AND consumer_group = $2)
         DELETE FROM queen.groups WHERE queue_id = $1 AND consumer_group = $2",
        &[queue_id.into(), group.into()],
    );
}

thread_local! {
    /// Without the registry: this backend found the lane journal empty in a transaction
    /// that had not emptied it itself, so as committed (it stays so: only a server with the
    /// library preloaded writes it).
    static JOURNAL_EMPTY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The transaction (local id) that last saved and emptied the journal here: until it
    /// ends, the journal it sees empty may come back (a rollback, of it or of a savepoint).
    static SAVED_IN: std::cell::Cell<Option<pg_sys::LocalTransactionId>> = const { std::cell::Cell::new(None) };
}

fn local_xid() -> pg_sys::LocalTransactionId {
    // SAFETY: MyProc is this backend's own PGPROC, set before any query runs; inside a
    // transaction, lxid is its top-level transaction's local id (new for each one).
    unsafe { (*pg_sys::MyProc).lxid }
}

/// Whether the current transaction saved the lane journal (`settle_journal`): it holds the
/// journal tables' lock until it ends, so a pop that did returns without waiting.
pub fn saved_journal_here() -> bool {
    SAVED_IN.with(|s| s.get()) == Some(local_xid())
}

/// Without the lane registry (the caller checks), on a primary: the lane journal a
/// preloaded server left behind when it stopped without saving it (a crash, an immediate
/// stop, then a restart without the library preloaded) goes into `queen.lanes`, and is
/// emptied, before a pop, a cursor change, retention or a partition's drop reads the rows.
/// Otherwise the rows' cursors would be older than what was acked (a lane acked all the
/// time never has its row updated while the registry runs: delivered again), or newer than
/// a `seek` back (retention would delete what the seek wants again), and a later restart
/// with the library preloaded would prefer the journal's entries to what was acked or
/// sought since (`registry::stored` takes the newest journal number).
/// The journal tables are locked until the transaction ends, against another session
/// doing the same. `wait`: wait for a session that holds them; else (a pop) false when
/// one does, and the caller reads nothing (its transaction may last: a consumer's own).
/// A transaction that cannot write (read only) leaves it for the next one that can.
pub fn settle_journal(client: &mut SpiClient<'_>, wait: bool) -> bool {
    if JOURNAL_EMPTY.with(|e| e.get()) || crate::pg::shmem::in_recovery() {
        return true;
    }
    // SAFETY: a plain read of the current transaction's read-only flag.
    if unsafe { pg_sys::XactReadOnly } {
        return true;
    }
    let any = |client: &mut SpiClient<'_>| {
        first_value::<bool>(run(
            client,
            "SELECT EXISTS (SELECT 1 FROM queen.lane_journal_0) OR EXISTS (SELECT 1 FROM queen.lane_journal_1)",
            &[],
        ))
        .unwrap_or(false)
    };
    if !any(client) {
        if !saved_journal_here() {
            JOURNAL_EMPTY.with(|e| e.set(true));
        }
        return true;
    }
    // DELETE under a lock that only this conflicts with, where the worker's rotation
    // (`queen._empty_journal`) TRUNCATEs under an exclusive one: this runs in a caller's
    // transaction, which may last, and must not keep readers of the journal waiting.
    // Table 0 before table 1, always.
    let mode = pg_sys::ShareRowExclusiveLock as pg_sys::LOCKMODE;
    let tables = [c"lane_journal_0", c"lane_journal_1"].map(crate::pg::catalog::queen_table);
    for (i, &oid) in tables.iter().enumerate() {
        if wait {
            // SAFETY: a relation lock taken by oid, held until the transaction ends.
            unsafe { pg_sys::LockRelationOid(oid, mode) };
        // SAFETY: as above, without waiting.
        } else if !unsafe { pg_sys::ConditionalLockRelationOid(oid, mode) } {
            for &held in &tables[..i] {
                // SAFETY: a lock this loop just took, given back.
                unsafe { pg_sys::UnlockRelationOid(held, mode) };
            }
            return false;
        }
    }
    if !any(client) {
        // Another session saved it meanwhile: nothing to hold the tables for.
        for oid in tables {
            // SAFETY: a lock this call took above, given back; nothing was written under it.
            unsafe { pg_sys::UnlockRelationOid(oid, mode) };
        }
        return true;
    }
    save_journal(client);
    run(client, "WITH j0 AS (DELETE FROM queen.lane_journal_0) DELETE FROM queen.lane_journal_1", &[]);
    SAVED_IN.with(|s| s.set(Some(local_xid())));
    true
}

/// Copies every lane's newest journal entry (of both tables) into `queen.lanes` where the
/// row is older, dropping any lease the row carried: a clean stop of the worker, so that a
/// restart without the library preloaded (no registry, no journal) finds every cursor in
/// the table; and `settle_journal`, after a stop that did not. Each table's pass skips the
/// entries the other holds newer, so the two passes together save each lane's newest.
/// Returns how many rows.
pub fn save_journal(client: &mut SpiClient<'_>) -> i64 {
    save_journal_from(client, 0) + save_journal_from(client, 1)
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._save_journal(int) IS
  'queen internal: save a lane journal table''s newest entries into queen.lanes (_empty_journal); not granted';
"#,
    name = "save_journal_table_home",
    requires = [save_journal_table]
);

/// `queen._save_journal(t)`: each lane's newest entry of journal table `t` goes into
/// `queen.lanes`, unless the other table holds one at least as new (it stays there), so
/// nothing the journal knew is lost when `t` is emptied. Any lease a saved row carried
/// ends. The caller (`queen._empty_journal`) holds table `t` exclusively.
#[pg_extern(name = "_save_journal", volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn save_journal_table(t: i32) -> i64 {
    Spi::connect_mut(|client| save_journal_from(client, t))
}

/// The newest entries of journal table `t` that the other table does not hold newer go
/// into `queen.lanes` where the row is older. Returns how many rows.
fn save_journal_from(client: &mut SpiClient<'_>, t: i32) -> i64 {
    macro_rules! save {
        ($retired:literal, $newer:literal) => {
            concat!(
                "WITH u AS (
                   UPDATE queen.lanes l SET committed = j.committed, batch_retry_count = j.retry_count,
                          journal_seq = j.seq, lease_id = NULL, lease_expires_at = NULL, batch_end = NULL
                     FROM (SELECT DISTINCT ON (partition_id, consumer_group) partition_id, consumer_group, seq,
                                  committed, retry_count
                             FROM ",
                $retired,
                " ORDER BY partition_id, consumer_group, seq DESC) j
                    WHERE l.partition_id = j.partition_id AND l.consumer_group = j.consumer_group
                      AND l.journal_seq < j.seq
                      AND NOT EXISTS (SELECT 1 FROM ",
                $newer,
                " c WHERE c.partition_id = j.partition_id AND c.consumer_group = j.consumer_group
                                    AND c.seq >= j.seq)
                   RETURNING 1)
                 SELECT count(*)::int8 FROM u"
            )
        };
    }
    let sql = match t {
        0 => save!("queen.lane_journal_0", "queen.lane_journal_1"),
        1 => save!("queen.lane_journal_1", "queen.lane_journal_0"),
        _ => crate::pg::errors::invalid("t", format_args!("{t} (no lane journal table)")),
    };
    first_value::<i64>(run(client, sql, &[])).unwrap_or(0)
}
