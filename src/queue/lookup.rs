//! Queues, partitions and consumer groups: lookup and implicit creation.

use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::PgSqlErrorCode;
use queen_core::policy::QueueOptions;

use crate::pg::cache;
use crate::pg::errors::{self, SpiExt};
use crate::pg::ids::to_pg_uuid;
use crate::pg::spi::{first_value, run};

/// Where one (queue, partition) of a push goes.
#[derive(Clone, Copy)]
pub struct Target {
    pub queue_id: i64,
    pub partition_id: pgrx::Uuid,
    pub dedup_window: i32,
    pub encrypted: bool,
    /// The queue's `max_depth`, and whether a `hold` group has a `max_lag`: a push then
    /// checks them (`ops::overflow::check_push`).
    pub max_depth: Option<i64>,
    pub lag_limited: bool,
}

thread_local! {
    /// Per backend: (queue, partition) -> target, so that a push looks nothing up, under
    /// the cache generation it was filled in (`cache::generation`: cleared when
    /// `queen.queues` is invalidated by `configure`, `configure_group`, `drop_group`,
    /// `delete_queue` or the extension dropped, and when a transaction aborts, as it may
    /// have created what it cached).
    static TARGETS: std::cell::RefCell<std::collections::HashMap<(String, String), Target>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
    static TARGETS_GENERATION: std::cell::Cell<u64> = const { std::cell::Cell::new(u64::MAX) };
}

/// Most (queue, partition) pairs a backend remembers; past it, it starts again.
const MAX_TARGETS: usize = 10_000;

/// The target of (queue, partition): from this backend's cache, or `locate`d and cached.
pub fn target(queue: &str, partition: &str, locate: impl FnOnce() -> Target) -> Target {
    // Invalidations other transactions committed (a queue deleted, say) apply first.
    let seen = cache::generation();
    if TARGETS_GENERATION.with(|g| g.replace(seen)) != seen {
        TARGETS.with(|c| c.borrow_mut().clear());
    }
    let key = (queue.to_string(), partition.to_string());
    if let Some(t) = TARGETS.with(|c| c.borrow().get(&key).copied()) {
        return t;
    }
    let t = locate();
    if TARGETS.with(|c| c.borrow().len() >= MAX_TARGETS) {
        TARGETS.with(|c| c.borrow_mut().clear());
    }
    // An invalidation that arrived while locating: the target may be stale already.
    if cache::last_generation() == seen {
        TARGETS.with(|c| c.borrow_mut().insert(key, t));
    }
    t
}

/// A queue's id by name, without creating it (None: no such queue).
pub fn queue_id(client: &mut SpiClient<'_>, name: &str) -> Option<i64> {
    first_value::<i64>(run(client, "SELECT queue_id FROM queen.queues WHERE name = $1", &[name.into()]))
}

/// Finds a queue by name, or creates it with the implicit defaults (lease_time 60).
/// Returns its id, its dedup window in seconds, and whether it is encrypted.
pub fn ensure_queue(client: &mut SpiClient<'_>, name: &str) -> (i64, i32, bool) {
    const FIND: &str = "SELECT queue_id, dedup_window, encryption FROM queen.queues WHERE name = $1";
    let read = |t: pgrx::spi::SpiTupleTable<'_>| {
        t.into_iter().next().map(|r| {
            (
                r.get::<i64>(1).or_raise().unwrap(),
                r.get::<i32>(2).or_raise().unwrap(),
                r.get::<bool>(3).or_raise().unwrap(),
            )
        })
    };
    // The common case first: no write, no lock.
    if let Some(found) = read(run(client, FIND, &[name.into()])) {
        return found;
    }
    run(
        client,
        "INSERT INTO queen.queues (name, lease_time) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        &[name.into(), QueueOptions::IMPLICIT.lease_time.into()],
    );
    // A queue created while `queen.distribute()` ran waited for it at this insert.
    crate::queue::citus::recheck_created(name);
    read(run(client, FIND, &[name.into()]))
        .unwrap_or_else(|| crate::pg::errors::internal(format_args!("queue {name:?} vanished while being created")))
}

/// `ensure_queue`, then the queue lock in share mode (`locks::share_queue`): a queue that
/// a `delete_queue` removed while this waited is created again. Callers check their
/// privilege on the queue it returns (`privileges::ensure_queue_locked_for`).
pub(super) fn ensure_queue_locked(client: &mut SpiClient<'_>, name: &str) -> (i64, i32, bool) {
    loop {
        let found = ensure_queue(client, name);
        if crate::pg::locks::share_queue(found.0) {
            return found;
        }
    }
}

/// Creates a partition and the lanes of every existing consumer group, all starting at 0:
/// everything in a partition newer than a group is new to it. Returns None when another
/// session created the partition first; the caller then looks it up.
pub fn create_partition(client: &mut SpiClient<'_>, queue_id: i64, name: &str) -> Option<pgrx::Uuid> {
    // On Citus the id routes back to this node, the queue's home (`citus::routed_id`).
    let pid = to_pg_uuid(crate::queue::citus::routed_id(crate::pg::ids::new_id));
    let inserted = run(
        client,
        "INSERT INTO queen.partitions (partition_id, queue_id, name) VALUES ($1, $2, $3)
         ON CONFLICT (queue_id, name) DO NOTHING RETURNING true",
        &[pid.into(), queue_id.into(), name.into()],
    );
    first_value::<bool>(inserted)?;
    crate::lane::rows::create_for_partition(client, pid, queue_id);
    Some(pid)
}

/// Before lanes are created from partition rows: the queue's lane-creation lock in share
/// mode (`locks::lanes_creation`), which a retention step takes exclusively. Either the
/// step sees the new lanes (their cursors hold segments back) or the lanes start at what
/// it deleted (`retain`). With `wait` false (a pop) it is not waited for: false when a
/// retention step holds it right now (the pop creates its lanes on a later call). Taken
/// before the INSERT, whose statement snapshot then sees the step's deletions.
fn lock_for_new_lanes(queue_id: i64, wait: bool) -> bool {
    crate::pg::locks::lanes_creation(queue_id, false, wait)
}

/// The error for a group that does not exist on a queue configured with `create_groups =>
/// false`, where only `create_group` and `configure_group` create one (42704).
pub fn no_group_to_create(queue: &str, group: &str) -> ! {
    errors::raise(
        PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
        format!(
            "queen: queue {queue:?} has no consumer group {group:?}, and it is created only by queen.create_group \
             or queen.configure_group (configure create_groups => false)"
        ),
    )
}

/// `ensure_group` ('all') for an operator's call that names a group (`pause`, `resume`,
/// `configure_limit`): on a queue configured with `create_groups => false` a group that
/// does not exist is an error, as for a pop (a mistyped name would otherwise make a group
/// that holds retention back and counts toward `max_depth`).
pub fn ensure_named_group(client: &mut SpiClient<'_>, queue_id: i64, queue: &str, group: &str) {
    let creates = first_value::<bool>(run(
        client,
        "SELECT q.create_groups FROM queen.queues q WHERE q.queue_id = $1",
        &[queue_id.into()],
    ));
    let may_create = creates != Some(false);
    // Without create_groups the group must exist, also after a drop_group that committed
    // while this call waited for its row (`ensure_group` then answers None).
    if ensure_group_as(client, queue_id, group, queen_core::policy::Subscription::DEFAULT.as_str(), true, may_create)
        .is_none()
    {
        no_group_to_create(queue, group);
    }
}

/// Creates the consumer group and its lanes if it does not exist yet. `subscription`
/// 'new' starts the lanes of existing partitions at their readable end, 'all' at 0 (or
/// where retention left off).
///
/// The caller holds the queue lock (`locks::share_queue`). With `wait` false (a pop),
/// returns None without waiting when another session is creating the same group right
/// now, or when a retention step of the queue runs: a pop never waits on a lock that is
/// not its own. Otherwise returns whether this call created the group.
pub fn ensure_group(
    client: &mut SpiClient<'_>,
    queue_id: i64,
    group: &str,
    subscription: &str,
    wait: bool,
) -> Option<bool> {
    ensure_group_as(client, queue_id, group, subscription, wait, true)
}

/// `ensure_group`, creating the group only when `may_create` (else None when it is not
/// there: a queue with `create_groups => false`, for `ensure_named_group`).
fn ensure_group_as(
    client: &mut SpiClient<'_>,
    queue_id: i64,
    group: &str,
    subscription: &str,
    wait: bool,
    may_create: bool,
) -> Option<bool> {
    if !crate::pg::locks::group_creation(queue_id, group, wait) {
        return None;
    }
    // The queue row before the group row: a pop that would wait for it returns nothing.
    if !lock_for_new_lanes(queue_id, wait) {
        return None;
    }
    const CREATE: &str = "INSERT INTO queen.groups (queue_id, consumer_group, subscription) VALUES ($1, $2, $3)
                          ON CONFLICT DO NOTHING RETURNING 1";
    macro_rules! find {
        () => {
            "SELECT 1 FROM queen.groups WHERE queue_id = $1 AND consumer_group = $2 FOR KEY SHARE"
        };
    }
    const FIND: &str = find!();
    const FIND_UNLESS_HELD: &str = concat!(find!(), " SKIP LOCKED");
    let args = [queue_id.into(), group.into(), subscription.into()];
    if !may_create {
        // Only an existing group, kept until this transaction ends (as below); one this
        // transaction dropped is not there.
        return (!run(client, FIND, &[queue_id.into(), group.into()]).is_empty()).then_some(false);
    }
    if crate::lane::registry::dropped_here(queue_id, group) {
        errors::raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "queen: consumer group \"{group}\" was dropped in this transaction; commit the drop before creating the group again"
            ),
        );
    }
    if run(client, CREATE, &args).is_empty() {
        // The group exists. Its row is kept (FOR KEY SHARE) until this transaction ends,
        // so a drop_group cannot commit meanwhile and leave what the caller writes next
        // (a limit, a budget, a pause, a claim) pointing at a group that is gone. A drop in
        // flight is waited for, and when it commits the group is created anew; a pop does
        // not wait, and returns no rows this time.
        let kept = run(client, if wait { FIND } else { FIND_UNLESS_HELD }, &[queue_id.into(), group.into()]);
        if !kept.is_empty() {
            return Some(false);
        }
        if !wait || run(client, CREATE, &args).is_empty() {
            return None;
        }
    }
    CREATED_HERE.with(|c| c.set(true));
    let lanes = crate::lane::rows::create_for_group(client, queue_id, group, subscription);
    // The registry forgets them if this transaction rolls back (it may load them before).
    crate::lane::registry::forget_on_abort(&lanes, group);
    Some(true)
}

thread_local! {
    /// Set when this pop call created its group: until it commits, partitions created by
    /// others cannot see the group, so its repairs must not wait for the rate limit.
    pub static CREATED_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static LAST_REPAIR: std::cell::RefCell<std::collections::HashMap<(i64, String), std::time::Instant>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// How often a backend repairs the lanes of one (queue, group) at most.
const REPAIR_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// How many (queue, group) repair times a backend keeps before it drops those older than
/// `REPAIR_EVERY`.
const MAX_REPAIRS_KEPT: usize = 10_000;

/// Adds lanes that a partition and a group created at the same moment both missed (each
/// transaction saw only the other's committed rows). Such lanes start where retention
/// left off: the partition is as new as the group. The anti-join is O(partitions), so a
/// backend runs it at most once a second per (queue, group), before its pop claims
/// anything (the queue row lock comes before lanes). Returns true when it added a lane.
pub fn repair_lanes(client: &mut SpiClient<'_>, queue_id: i64, group: &str) -> bool {
    let key = (queue_id, group.to_string());
    let now = std::time::Instant::now();
    let due = LAST_REPAIR.with(|m| {
        let mut m = m.borrow_mut();
        match m.get(&key) {
            Some(t) if now.duration_since(*t) < REPAIR_EVERY && !CREATED_HERE.with(|c| c.get()) => false,
            _ => {
                // An entry older than the second means what no entry means: past a bound,
                // those go, so a session that serves ever new queues or groups does not
                // grow without end.
                if m.len() >= MAX_REPAIRS_KEPT {
                    m.retain(|_, t| now.duration_since(*t) < REPAIR_EVERY);
                }
                m.insert(key, now);
                true
            }
        }
    });
    if !due {
        return false;
    }
    // Never waited for: a pop skips the repair while a retention step runs (it comes back
    // within a second), and while a seek or drop_group holds the group row
    // (`create_missing`).
    if !lock_for_new_lanes(queue_id, false) {
        return false;
    }
    let lanes = crate::lane::rows::create_missing(client, queue_id, group);
    crate::lane::registry::forget_on_abort(&lanes, group);
    !lanes.is_empty()
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._queues_changed() IS
  'queen internal: backends drop their cached queue lookups (delete_queue); not granted';
"#,
    name = "queues_changed_home",
    requires = [queues_changed]
);

/// `queen._queues_changed()`: for `delete_queue` (PL/pgSQL), which cannot call `invalidate`
/// otherwise. Not granted.
#[pg_extern(name = "_queues_changed", volatile)]
fn queues_changed() {
    cache::invalidate();
}
