//! Partitions that come and go (a partition per customer, per order, per session): what
//! removes them, so that queen's tables do not grow with the names ever used.
//!
//! - `queen.drop_partition(queue, partition)` removes an empty partition now: its
//!   segments, lanes, journal entries and dedup entries go with its row; its groups'
//!   counts of expired messages dropped are added to the queue's (`delete`).
//! - `configure(queue, partition_idle_ttl => interval)` lets the background worker drop,
//!   the same way, every partition of the queue that nobody pushed to for that long and
//!   that is empty (`expire_queue`).
//! - Dedup entries older than their queue's dedup window are deleted by the worker
//!   (`expire_queue`), whether or not the partition gets more pushes.
//! - `configure(queue, dlq_retention => interval)` lets the worker delete the queue's dead
//!   letters filed longer ago than that (`expire_queue`), which also lets a partition that
//!   held them be dropped.
//!
//! **Empty** means: nothing a consumer group still needs. No push to it is in flight, no
//! lane holds a live lease, every group's cursor is at the partition's readable end, and,
//! when the queue has no group yet, nothing is stored (retention deleted it all, or nothing
//! was ever pushed). A partition with dead letters is kept too: `queen.dlq` names their
//! partition. A push that comes after a drop creates the partition anew, with offsets from
//! 1 and a new partition id.
//!
//! **The worker's expiry** reads idle partitions without locking anything, a page of them
//! per step, going on from the last page in the next step (`RESUME_AFTER`), and locks and
//! checks only those whose cursors all look at the end (`looks_consumed`): locking the
//! lanes of a partition that still holds messages would keep pops off them until the
//! step's transaction ends (a pop passes over a lane another transaction holds), and a
//! queue whose first page holds messages would never have the consumed partitions after
//! it dropped.
//!
//! **Safety against a push at the same moment.** With the offset registry the partition is
//! marked as being dropped (`offsets::begin_drop`), refused while pushes are in flight;
//! a push that comes meanwhile waits for the dropping transaction and then looks its
//! partition up again. Without the registry a push holds the partition row until it
//! commits, and the drop locks that row first. The lanes are locked as an ack locks them.

use pgrx::spi::SpiClient;

use crate::pg::errors::SpiExt;
use crate::pg::spi::{first_value, run};

/// Most lanes an expiry step examines (it loads them into the lane registry) and locks in
/// one transaction (each partition's lanes are locked while it is checked, until the
/// transaction ends): well below `queen.tracked_lanes`.
const EXPIRE_LANES: i64 = 1000;

thread_local! {
    /// The background worker's expiry steps: per queue, the last partition the last step
    /// examined when it stopped at its limit; the next step goes on after it. A queue
    /// without an entry is read from its first partition.
    static RESUME_AFTER: std::cell::RefCell<std::collections::HashMap<i64, pgrx::Uuid>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// Why a partition is not dropped.
pub enum Kept {
    /// Someone holds it (a push in flight, a lane held by another transaction): not now.
    Busy(String),
    /// It holds something a group still needs, or dead letters.
    NotEmpty(String),
}

/// Drops partition `pid` of queue `queue_id` if it is empty; the caller holds the
/// queue's lane-creation lock exclusively (no group gets lanes meanwhile: a group created
/// now, subscribed to 'all', would need this partition's messages, so the groups read
/// here are all there are until the transaction ends) and the partition's row. `wait`: wait for another transaction that holds one of its lanes (else it is
/// busy). Returns the segments deleted.
pub fn try_drop(client: &mut SpiClient<'_>, queue_id: i64, pid: pgrx::Uuid, wait: bool) -> Result<i64, Kept> {
    let groups = groups_of(client, queue_id);
    check_empty(client, pid, &groups, wait)?;
    Ok(delete(client, &[pid], &groups))
}

/// The queue's consumer groups.
fn groups_of(client: &mut SpiClient<'_>, queue_id: i64) -> Vec<String> {
    run(
        client,
        "SELECT consumer_group FROM queen.groups WHERE queue_id = $1 ORDER BY consumer_group",
        &[queue_id.into()],
    )
    .map(|r| r.get(1).or_raise().unwrap())
    .collect()
}

/// Keeps every push out of partition `pid` until this transaction ends, and locks its
/// lanes; Ok when it is empty (see the module docs), else why it is kept.
fn check_empty(client: &mut SpiClient<'_>, pid: pgrx::Uuid, groups: &[String], wait: bool) -> Result<(), Kept> {
    if crate::offsets::begin_drop(client, pid).is_err() {
        return Err(Kept::Busy("pushes to it are in flight".into()));
    }
    let row = run(client, "SELECT p.retained_through FROM queen.partitions p WHERE p.partition_id = $1", &[pid.into()]);
    let row = row.first();
    let retained: i64 = row.get(1).or_raise().unwrap_or(0);
    let readable = crate::offsets::readable(pid);
    if groups.is_empty() && readable > retained {
        return Err(Kept::NotEmpty("the queue has no consumer group, and it holds messages".into()));
    }
    let now = crate::pg::clock::clock_now();
    for group in groups {
        let (committed, live) = lock_lane(client, pid, group, wait, retained, now)?;
        if live {
            return Err(Kept::Busy(format!("group {group:?} has a live lease on it")));
        }
        if committed < readable {
            return Err(Kept::NotEmpty(format!(
                "group {group:?} has not consumed it (cursor {committed}, end {readable})"
            )));
        }
    }
    nothing_else_held(client, pid)
}

/// Locks the group's lane of the partition until this transaction ends, as an ack locks a
/// lane (or, without `wait`, fails when another transaction holds it): its cursor, and
/// whether a lease on it is live. A missing lane reads as `retained` (the group's pops
/// would create it where retention left off).
fn lock_lane(
    client: &mut SpiClient<'_>,
    pid: pgrx::Uuid,
    group: &str,
    wait: bool,
    retained: i64,
    now: i64,
) -> Result<(i64, bool), Kept> {
    let held = || Kept::Busy(format!("group {group:?} holds its lane"));
    if crate::lane::registry::enabled() {
        return match crate::lane::registry::lock(pid, group, wait) {
            Some(s) => Ok((s.committed, s.live_lease(now))),
            None if wait => Ok((retained, false)),
            None => Err(held()),
        };
    }
    let sql = if wait {
        concat!(
            "SELECT committed, coalesce(",
            queen_core::lease_live_sql!("l", "$3"),
            ", false) FROM queen.lanes l WHERE partition_id = $1 AND consumer_group = $2 FOR UPDATE"
        )
    } else {
        concat!(
            "SELECT committed, coalesce(",
            queen_core::lease_live_sql!("l", "$3"),
            ", false) FROM queen.lanes l WHERE partition_id = $1 AND consumer_group = $2
              FOR UPDATE SKIP LOCKED"
        )
    };
    let r = run(client, sql, &[pid.into(), group.into(), crate::pg::clock::timestamptz(now).into()]);
    match r.into_iter().next() {
        Some(r) => Ok((r.get::<i64>(1).or_raise().unwrap(), r.get::<bool>(2).or_raise().unwrap())),
        None if wait => Ok((retained, false)),
        None => Err(held()),
    }
}

/// What else keeps a partition whose lanes are all consumed: dead letters, or a producer
/// id still inside the queue's dedup window.
fn nothing_else_held(client: &mut SpiClient<'_>, pid: pgrx::Uuid) -> Result<(), Kept> {
    // Dead letters, read once the lanes are locked: an ack or a pop that files one holds
    // its lane until it commits, so a dead letter filed meanwhile is seen here.
    let dead = first_value::<bool>(run(
        client,
        "SELECT EXISTS (SELECT 1 FROM queen.log_dlq d WHERE d.partition_id = $1)",
        &[pid.into()],
    ));
    if dead.unwrap_or(false) {
        return Err(Kept::NotEmpty("it has dead letters (replay or delete them first)".into()));
    }
    // A producer id still inside the queue's dedup window: a retry of that push after the
    // drop would be stored again in a new partition (delivered twice).
    let recent = first_value::<bool>(run(
        client,
        concat!(
            "SELECT EXISTS (SELECT 1 FROM queen.dedup d JOIN queen.partitions p ON p.partition_id = d.partition_id
                              JOIN queen.queues q ON q.queue_id = p.queue_id
                             WHERE d.partition_id = $1 AND ",
            queen_core::dedup_live_sql!("d", "q.dedup_window"),
            ")"
        ),
        &[pid.into()],
    ));
    if recent.unwrap_or(false) {
        return Err(Kept::NotEmpty("a transaction id pushed to it is still inside the queue's dedup window".into()));
    }
    Ok(())
}

/// Deletes partitions and everything of theirs: segments of both tiers, dedup entries,
/// lane journal entries, lanes and leases (the registry forgets the lanes when this
/// commits), and the rows. Their counts of expired messages dropped without a dead letter
/// are added to their queue's (`queen.expired_drops_folded`), so that a group's count never
/// goes down. Returns the segments deleted.
fn delete(client: &mut SpiClient<'_>, pids: &[pgrx::Uuid], groups: &[String]) -> i64 {
    // In key order, so that two deletions folding into the same rows lock them in one order.
    run(
        client,
        "INSERT INTO queen.expired_drops_folded AS f (queue_id, consumer_group, dropped)
         SELECT queue_id, consumer_group, sum(dropped) FROM queen.expired_drops
          WHERE partition_id = ANY($1) GROUP BY queue_id, consumer_group ORDER BY queue_id, consumer_group
         ON CONFLICT (queue_id, consumer_group) DO UPDATE SET dropped = f.dropped + EXCLUDED.dropped",
        &[pids.to_vec().into()],
    );
    let segments = first_value::<i64>(run(
        client,
        "WITH s AS (DELETE FROM queen.segments WHERE partition_id = ANY($1) RETURNING 1),
              f AS (DELETE FROM queen.fresh_segments WHERE partition_id = ANY($1) RETURNING 1),
              d AS (DELETE FROM queen.dedup WHERE partition_id = ANY($1)),
              j0 AS (DELETE FROM queen.lane_journal_0 WHERE partition_id = ANY($1)),
              j1 AS (DELETE FROM queen.lane_journal_1 WHERE partition_id = ANY($1)),
              l AS (DELETE FROM queen.lanes WHERE partition_id = ANY($1)),
              p AS (DELETE FROM queen.partitions WHERE partition_id = ANY($1))
         SELECT (SELECT count(*) FROM s) + (SELECT count(*) FROM f)",
        &[pids.to_vec().into()],
    ))
    .unwrap_or(0);
    let keys = pids.iter().flat_map(|p| groups.iter().map(move |g| crate::lane::registry::key(*p, g))).collect();
    crate::lane::registry::forget_on_commit(keys);
    segments
}

/// The queues the expiry step looks at: those with a partition idle TTL or a dead-letter
/// retention, and those that hold dedup entries (whatever their window now: entries left
/// from a window since set to 0 go too). Not every queue with a dedup window: most pushes
/// carry no transaction id of their own and record none, and a round that visited every
/// such queue took time in proportion to all the queues there are (about 35 s for
/// 200,000), holding up the journal and compaction meanwhile. The probe is one index
/// lookup per partition.
pub fn queues_to_expire(client: &mut SpiClient<'_>) -> Vec<i64> {
    run(
        client,
        "SELECT q.queue_id FROM queen.queues q
          WHERE q.partition_idle_ttl > '0s' OR q.dlq_retention > '0s'
             OR EXISTS (SELECT 1 FROM queen.partitions p JOIN queen.dedup d ON d.partition_id = p.partition_id
                         WHERE p.queue_id = q.queue_id)
          ORDER BY q.queue_id",
        &[],
    )
    .map(|r| r.get(1).or_raise().unwrap())
    .collect()
}

/// The idle partitions of queue `$1` (id, retained through): the newest segment of
/// either tier (or the partition itself, with none) is older than the queue's
/// `partition_idle_ttl` (`queen_core::policy::outlived`). The caller adds the rest of the
/// WHERE clause (from `$2` on) and the order.
macro_rules! idle_partitions_sql {
    () => {
        concat!(
            "SELECT p.partition_id, p.retained_through
               FROM queen.partitions p JOIN queen.queues q ON q.queue_id = p.queue_id
              WHERE p.queue_id = $1 AND ",
            queen_core::outlived_sql!(
                "greatest(p.created_at,
                          (SELECT max(s.created_at) FROM (
                             (SELECT created_at FROM queen.segments s WHERE s.partition_id = p.partition_id
                               ORDER BY first_offset DESC LIMIT 1)
                             UNION ALL
                             (SELECT created_at FROM queen.fresh_segments f WHERE f.partition_id = p.partition_id
                               ORDER BY first_offset DESC LIMIT 1)) s))",
                "q.partition_idle_ttl"
            )
        )
    };
}

/// One queue's expiry (the background worker, in a transaction of its own): dedup entries
/// older than the queue's window go; with a `dlq_retention`, dead letters filed longer ago
/// than it (`DLQ_EXPIRE_STEP` at most); and, with a `partition_idle_ttl`, the partitions
/// that nobody pushed to for that long and that are empty, among the next idle ones (as
/// many as hold `EXPIRE_LANES` lanes between them; see the module docs). It never waits: a
/// partition or dead letter someone holds is left for a later pass. Returns whether it
/// stopped at a limit: there is more to examine, and the worker takes another step.
pub fn expire_queue(client: &mut SpiClient<'_>, queue_id: i64) -> bool {
    // The queue lock first, as every call takes it before the queue's rows (a dedup row
    // locked before it would deadlock with a delete_queue); a queue being deleted waits
    // for the next pass.
    if !crate::pg::locks::try_share_queue(queue_id) {
        return false;
    }
    run(
        client,
        concat!(
            "DELETE FROM queen.dedup d USING queen.partitions p, queen.queues q
              WHERE q.queue_id = $1 AND p.queue_id = q.queue_id AND d.partition_id = p.partition_id AND ",
            queen_core::dedup_expired_sql!("d", "q.dedup_window")
        ),
        &[queue_id.into()],
    );
    // Dead letters past the queue's dlq_retention (`policy::outlived`), oldest first.
    // One that a call holds at this moment (a replay, a delete, a redrive) is left for the
    // next round.
    let dead_letters = first_value::<i64>(run(
        client,
        concat!(
            "WITH old AS (SELECT d.id FROM queen.log_dlq d JOIN queen.queues q ON q.queue_id = d.queue_id
                           WHERE d.queue_id = $1 AND ",
            queen_core::outlived_sql!("d.failed_at", "q.dlq_retention"),
            "
                           ORDER BY d.failed_at LIMIT $2 FOR UPDATE OF d SKIP LOCKED),
                  gone AS (DELETE FROM queen.log_dlq d USING old WHERE d.id = old.id RETURNING 1)
             SELECT count(*)::int8 FROM gone"
        ),
        &[queue_id.into(), queen_core::policy::limits::DLQ_EXPIRE_STEP.into()],
    ))
    .unwrap_or(0);
    let more_dead_letters = dead_letters >= queen_core::policy::limits::DLQ_EXPIRE_STEP;
    // Only a queue with a partition_idle_ttl has partitions to drop. The others do not
    // take the lane-creation lock below: while it is held, a pop that would create a group
    // returns no rows, and this step runs for every queue with a dedup window, every pass.
    let idle_ttl = first_value::<bool>(run(
        client,
        "SELECT partition_idle_ttl > '0s' FROM queen.queues WHERE queue_id = $1",
        &[queue_id.into()],
    ));
    if idle_ttl != Some(true) {
        return more_dead_letters;
    }
    // As in try_drop: no group gets lanes while the partitions are checked (busy: next pass).
    if !crate::pg::locks::lanes_creation(queue_id, true, false) {
        return more_dead_letters;
    }
    let groups = groups_of(client, queue_id);
    let limit = (EXPIRE_LANES / groups.len().max(1) as i64).max(1);
    // The next idle partitions, read without locking anything (see the module docs).
    let after = RESUME_AFTER.with_borrow(|m| m.get(&queue_id).copied());
    let idle: Vec<(pgrx::Uuid, i64)> = run(
        client,
        concat!(
            idle_partitions_sql!(),
            " AND ($3::uuid IS NULL OR p.partition_id > $3) ORDER BY p.partition_id LIMIT $2"
        ),
        &[queue_id.into(), limit.into(), after.into()],
    )
    .map(|r| (r.get(1).or_raise().unwrap(), r.get(2).or_raise().unwrap_or(0)))
    .collect();
    let full = idle.len() as i64 == limit;
    // Set before the step's work, on purpose: a step that raises (and rolls back) does not
    // hold the queue's later partitions up. Its own are examined again once the steps come
    // round to the first partition (a step that stops below its limit starts them over).
    RESUME_AFTER.with_borrow_mut(|m| match idle.last().filter(|_| full) {
        Some(&(last, _)) => m.insert(queue_id, last),
        None => m.remove(&queue_id), // the next step starts again from the first partition
    });
    let consumed: Vec<pgrx::Uuid> = idle
        .into_iter()
        .filter(|&(pid, retained)| looks_consumed(pid, retained, &groups))
        .map(|(pid, _)| pid)
        .collect();
    if consumed.is_empty() {
        return more_dead_letters || full;
    }
    // Those that look consumed are locked (if still idle; a busy one waits for a later
    // step) and checked under their locks (`check_empty`), which decides.
    let locked: Vec<pgrx::Uuid> = run(
        client,
        concat!(
            idle_partitions_sql!(),
            " AND p.partition_id = ANY($2) ORDER BY p.partition_id FOR UPDATE OF p SKIP LOCKED"
        ),
        &[queue_id.into(), consumed.into()],
    )
    .map(|r| r.get(1).or_raise().unwrap())
    .collect();
    let empty: Vec<pgrx::Uuid> =
        locked.into_iter().filter(|&pid| check_empty(client, pid, &groups, false).is_ok()).collect();
    if !empty.is_empty() {
        delete(client, &empty, &groups);
    }
    more_dead_letters || full
}

/// Whether partition `pid` looks empty, read without locking anything (the registry's
/// committed cursors; the worker runs only with the library preloaded): as `check_empty`
/// has it, every group's cursor is at the readable end, or, with no group, retention
/// deleted everything. A cursor behind `retained` counts as there (retention deleted what
/// it had left), so this may let through a partition `check_empty` keeps: it only spares
/// the lock to those that still hold messages.
fn looks_consumed(pid: pgrx::Uuid, retained: i64, groups: &[String]) -> bool {
    let readable = crate::offsets::readable(pid);
    if groups.is_empty() {
        return readable <= retained;
    }
    groups.iter().all(|group| crate::lane::registry::lane_committed(pid, group).committed.max(retained) >= readable)
}
