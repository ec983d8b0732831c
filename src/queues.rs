//! Queues, partitions and consumer groups: lookup and implicit creation.

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use queen_core::policy::{QueueOptions, Subscription};

use crate::errors::SpiExt;
use crate::ids::to_pg_uuid;
use crate::spi::{first_value, run};

/// Where one (queue, partition) of a push goes.
#[derive(Clone, Copy)]
pub struct Target {
    pub queue_id: i64,
    pub partition_id: pgrx::Uuid,
    pub dedup_window: i32,
    pub encrypted: bool,
}

thread_local! {
    /// Per backend: (queue, partition) -> target, so that a push looks nothing up. Cleared
    /// when `queen.queues` is invalidated (`configure`, `delete_queue`, the extension
    /// dropped) and when a transaction aborts (it may have created what it cached).
    static TARGETS: std::cell::RefCell<std::collections::HashMap<(String, String), Target>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
    static QUEUES_OID: std::cell::Cell<pg_sys::Oid> = const { std::cell::Cell::new(pg_sys::InvalidOid) };
    /// Set by the invalidation callback, which may run in the middle of anything (even
    /// while the cache is borrowed): the cache is cleared at its next use.
    static STALE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Set by the same callback, for `locks::share_queue` (see `changed_since`).
    static CHANGED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Counts the callback's calls, for caches of queue options (see `generation`).
    static GENERATION: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A number that changes whenever `queen.queues` may have changed (options set by
/// `configure`, a queue deleted; `configure_group` and `drop_group` send the same
/// invalidation) since it was last read, and when a transaction of this backend aborts:
/// a cache of queue or group settings filled under one generation is good while
/// `generation` still returns it. Processes the invalidations other transactions
/// committed first.
pub fn generation() -> u64 {
    // SAFETY: processing pending invalidations is allowed at any point in a transaction.
    unsafe { pg_sys::AcceptInvalidationMessages() };
    track_queues_oid();
    GENERATION.with(|g| g.get())
}

/// Settings a backend keeps per key: each entry with the `generation` it was read under.
pub type Settings<K, V> = std::cell::RefCell<std::collections::HashMap<K, (u64, V)>>;

/// Most entries a `Settings` cache holds; past it, it starts again.
const MAX_SETTINGS: usize = 10_000;

/// `key`'s settings from `cache` while no queue or group changed since they were read
/// (`generation`), else from `read` (None: nothing to read, such as a deleted queue). What
/// `read` returns is kept when `keep` accepts it, no change arrived while it ran, and its
/// read saw the latest committed rows (`cacheable`).
pub fn cached<K: std::hash::Hash + Eq, V: Clone>(
    cache: &'static std::thread::LocalKey<Settings<K, V>>,
    key: K,
    read: impl FnOnce() -> Option<V>,
    keep: impl FnOnce(&V) -> bool,
) -> Option<V> {
    let seen = generation();
    let hit = cache.with(|c| c.borrow().get(&key).filter(|e| e.0 == seen).map(|e| e.1.clone()));
    if hit.is_some() {
        return hit;
    }
    let value = read()?;
    if keep(&value) && cacheable() && generation() == seen {
        cache.with(|c| {
            let mut c = c.borrow_mut();
            if c.len() >= MAX_SETTINGS {
                c.clear();
            }
            c.insert(key, (seen, value.clone()));
        });
    }
    Some(value)
}

/// Whether settings read now may be cached (`generation`): not in a REPEATABLE READ or
/// SERIALIZABLE transaction, whose snapshot may predate a change whose invalidation this
/// backend has already taken in (the row read would be the old one, kept as current).
fn cacheable() -> bool {
    // SAFETY: a plain read of the current transaction's isolation level.
    unsafe { pg_sys::XactIsoLevel < pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// Follows `queen.queues` to its current OID (the extension dropped and created again
/// gives it a new one): the invalidation callback compares against it. A new OID counts
/// as a change.
fn track_queues_oid() {
    let oid = queues_oid();
    if QUEUES_OID.with(|o| o.replace(oid)) != oid {
        STALE.with(|s| s.set(true));
        CHANGED.with(|c| c.set(true));
        GENERATION.with(|g| g.set(g.get() + 1));
    }
}

/// Whether `queen.queues` may have changed (a queue deleted, say) since the last call:
/// processes the invalidations other transactions committed, then reads and clears the
/// flag they set.
pub fn changed_since() -> bool {
    // SAFETY: processing pending invalidations is allowed at any point in a transaction.
    unsafe { pg_sys::AcceptInvalidationMessages() };
    track_queues_oid();
    CHANGED.with(|c| c.replace(false))
}

/// Most (queue, partition) pairs a backend remembers; past it, it starts again.
const MAX_TARGETS: usize = 10_000;

/// Called from `_PG_init`: clear the cache when `queen.queues` is invalidated.
pub fn init() {
    // SAFETY: registering a relcache callback is allowed at any time; the function lives
    // as long as the library.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(relcache_callback), pg_sys::Datum::from(0)) };
}

#[pg_guard]
unsafe extern "C-unwind" fn relcache_callback(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    if relid == pg_sys::InvalidOid || relid == QUEUES_OID.with(|o| o.get()) {
        STALE.with(|s| s.set(true));
        CHANGED.with(|c| c.set(true));
        GENERATION.with(|g| g.set(g.get() + 1));
    }
}

/// A transaction or subtransaction aborted: forget targets it may have created, and
/// what caches of queue and group settings read while it ran (`generation`).
pub fn on_abort() {
    STALE.with(|s| s.set(true));
    GENERATION.with(|g| g.set(g.get() + 1));
}

/// Tells every backend that queues or groups changed (options, a queue deleted, a group's
/// budget set or the group dropped): each drops its cached targets and settings
/// (`generation`) when it next pushes, pops or acks, once this one commits.
pub fn invalidate() {
    // SAFETY: the relation exists (queen's own table) and the invalidation is
    // transactional: it is sent if, and when, the current transaction commits.
    unsafe {
        let oid = queues_oid();
        if oid != pg_sys::InvalidOid {
            pg_sys::CacheInvalidateRelcacheByRelid(oid);
        }
    }
}

fn queues_oid() -> pg_sys::Oid {
    crate::catalog::queen_table(c"queues")
}

/// The target of (queue, partition): from this backend's cache, or `locate`d and cached.
pub fn target(queue: &str, partition: &str, locate: impl FnOnce() -> Target) -> Target {
    // Invalidations other transactions committed (a queue deleted, say) apply first.
    // SAFETY: processing pending invalidations is allowed at any point in a transaction.
    unsafe { pg_sys::AcceptInvalidationMessages() };
    track_queues_oid();
    if STALE.with(|s| s.replace(false)) {
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
    if !STALE.with(|s| s.get()) {
        TARGETS.with(|c| c.borrow_mut().insert(key, t));
    }
    t
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
    read(run(client, FIND, &[name.into()]))
        .unwrap_or_else(|| crate::errors::internal(format_args!("queue {name:?} vanished while being created")))
}

/// `ensure_queue`, then the queue lock in share mode (`locks::share_queue`): a queue that
/// a `delete_queue` removed while this waited is created again.
pub fn ensure_queue_locked(client: &mut SpiClient<'_>, name: &str) -> (i64, i32, bool) {
    loop {
        let found = ensure_queue(client, name);
        if crate::locks::share_queue(found.0) {
            return found;
        }
    }
}

/// Creates a partition and the lanes of every existing consumer group, all starting at 0:
/// everything in a partition newer than a group is new to it. Returns None when another
/// session created the partition first; the caller then looks it up.
pub fn create_partition(client: &mut SpiClient<'_>, queue_id: i64, name: &str) -> Option<pgrx::Uuid> {
    // On Citus the id routes back to this node, the queue's home (`citus::routed_id`).
    let pid = to_pg_uuid(crate::citus::routed_id(crate::ids::new_id));
    let inserted = run(
        client,
        "INSERT INTO queen.partitions (partition_id, queue_id, name) VALUES ($1, $2, $3)
         ON CONFLICT (queue_id, name) DO NOTHING RETURNING true",
        &[pid.into(), queue_id.into(), name.into()],
    );
    first_value::<bool>(inserted)?;
    crate::lane_rows::create_for_partition(client, pid, queue_id);
    Some(pid)
}

/// Before lanes are created from partition rows: the queue's lane-creation lock in share
/// mode (`locks::lanes_creation`), which a retention step takes exclusively. Either the
/// step sees the new lanes (their cursors hold segments back) or the lanes start at what
/// it deleted (`retain`). With `wait` false (a pop) it is not waited for: false when a
/// retention step holds it right now (the pop creates its lanes on a later call). Taken
/// before the INSERT, whose statement snapshot then sees the step's deletions.
fn lock_for_new_lanes(queue_id: i64, wait: bool) -> bool {
    crate::locks::lanes_creation(queue_id, false, wait)
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
    if !crate::locks::group_creation(queue_id, group, wait) {
        return None;
    }
    // The queue row before the group row: a pop that would wait for it returns nothing.
    if !lock_for_new_lanes(queue_id, wait) {
        return None;
    }
    let created = run(
        client,
        "INSERT INTO queen.groups (queue_id, consumer_group, subscription) VALUES ($1, $2, $3)
         ON CONFLICT DO NOTHING RETURNING 1",
        &[queue_id.into(), group.into(), subscription.into()],
    );
    if created.is_empty() {
        return Some(false);
    }
    CREATED_HERE.with(|c| c.set(true));
    crate::lane_rows::create_for_group(client, queue_id, group, subscription);
    Some(true)
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.create_group(text, text, text) IS
  'queen: create a consumer group (subscription all or new) before its consumers start; a no-op if it exists';
GRANT EXECUTE ON FUNCTION queen.create_group(text, text, text) TO queen_admin;
"#,
    name = "create_group_home",
    requires = [create_group]
);

/// `queen.create_group`: creates a consumer group (and its queue, as a push would) before
/// any consumer pops, for deploy scripts. `subscription` 'all' starts at the oldest
/// message kept, 'new' at each partition's readable end. A group that exists is left as
/// it is (`created` false, and its own subscription reported). Waits for a pop that is
/// creating the same group at this moment.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn create_group(
    queue: Option<&str>,
    consumer_group: Option<&str>,
    subscription: pgrx::default!(Option<&str>, "'all'"),
) -> pgrx::JsonB {
    use crate::errors::null_arg;
    use crate::names::{check_lane_name, check_queue_name};
    let queue = queue.unwrap_or_else(|| null_arg("queue"));
    let group = consumer_group.unwrap_or_else(|| null_arg("consumer_group"));
    let subscription = subscription.unwrap_or_else(|| null_arg("subscription"));
    check_queue_name("queue", queue);
    crate::citus::ensure_home(queue);
    check_lane_name("consumer_group", group);
    crate::privileges::require(Some(queue), crate::privileges::Privilege::Admin);
    let subscription = Subscription::parse(subscription).unwrap_or_else(|v| crate::errors::violation(v)).as_str();
    pgrx::Spi::connect_mut(|client| {
        let (queue_id, ..) = ensure_queue_locked(client, queue);
        let created = ensure_group(client, queue_id, group, subscription, true).unwrap_or(false);
        let row = run(
            client,
            "SELECT g.subscription, (SELECT count(*) FROM queen.lanes l
                                      WHERE l.queue_id = g.queue_id AND l.consumer_group = g.consumer_group)
               FROM queen.groups g WHERE g.queue_id = $1 AND g.consumer_group = $2",
            &[queue_id.into(), group.into()],
        );
        let row = row.first();
        pgrx::JsonB(serde_json::json!({
            "queue": queue,
            "consumerGroup": group,
            "created": created,
            "subscription": row.get::<String>(1).or_raise(),
            "lanes": row.get::<i64>(2).or_raise().unwrap_or(0),
        }))
    })
}

thread_local! {
    /// Set when this pop call created its group: until it commits, partitions created by
    /// others cannot see the group, so its repairs must not wait for the rate limit.
    pub static CREATED_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static LAST_REPAIR: std::cell::RefCell<std::collections::HashMap<(i64, String), std::time::Instant>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

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
            Some(t)
                if now.duration_since(*t) < std::time::Duration::from_secs(1) && !CREATED_HERE.with(|c| c.get()) =>
            {
                false
            }
            _ => {
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
    lock_for_new_lanes(queue_id, false) && crate::lane_rows::create_missing(client, queue_id, group)
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
    invalidate();
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, interval, bool, interval) IS
  'queen: create or update a queue; returns its options in camelCase';
GRANT EXECUTE ON FUNCTION queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, interval, bool, interval) TO queen_admin;
"#,
    name = "configure_home",
    requires = [configure_queue]
);

/// `queen.configure` (docs/functions.md#configure): creates or updates a queue; every
/// option not given takes its default (`QueueOptions::CONFIGURED`). No option is cached, so
/// the next pop in every session sees it.
#[allow(clippy::too_many_arguments)]
#[pgrx::pg_extern(name = "configure", security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn configure_queue(
    queue: Option<&str>,
    lease_time: pgrx::default!(Option<i32>, 300),
    retry_limit: pgrx::default!(Option<i32>, 3),
    dead_letter_queue: pgrx::default!(Option<bool>, true),
    dlq_after_max_retries: pgrx::default!(Option<bool>, true),
    dedup_window: pgrx::default!(Option<i32>, 3600),
    encryption: pgrx::default!(Option<bool>, "NULL"),
    retention: pgrx::default!(Option<i32>, 0),
    retry_backoff: pgrx::default!(Option<pgrx::datum::Interval>, "'0s'"),
    retry_backoff_max: pgrx::default!(Option<pgrx::datum::Interval>, "'600s'"),
    delay: pgrx::default!(Option<pgrx::datum::Interval>, "'0s'"),
    create_groups: pgrx::default!(Option<bool>, true),
    partition_idle_ttl: pgrx::default!(Option<pgrx::datum::Interval>, "'0s'"),
) -> pgrx::JsonB {
    use crate::errors::null_arg;
    use crate::names::check_queue_name;
    let queue = queue.unwrap_or_else(|| null_arg("queue"));
    check_queue_name("queue", queue);
    crate::citus::ensure_home(queue);
    crate::privileges::require(Some(queue), crate::privileges::Privilege::Admin);
    let lease_time = lease_time.unwrap_or_else(|| null_arg("lease_time"));
    let retry_limit = retry_limit.unwrap_or_else(|| null_arg("retry_limit"));
    let dead_letter_queue = dead_letter_queue.unwrap_or_else(|| null_arg("dead_letter_queue"));
    let dlq_after_max_retries = dlq_after_max_retries.unwrap_or_else(|| null_arg("dlq_after_max_retries"));
    let dedup_window = dedup_window.unwrap_or_else(|| null_arg("dedup_window"));
    let retention = retention.unwrap_or_else(|| null_arg("retention"));
    let retry_backoff = retry_backoff.unwrap_or_else(|| null_arg("retry_backoff"));
    let retry_backoff_max = retry_backoff_max.unwrap_or_else(|| null_arg("retry_backoff_max"));
    let delay = delay.unwrap_or_else(|| null_arg("delay"));
    let create_groups = create_groups.unwrap_or_else(|| null_arg("create_groups"));
    let partition_idle_ttl = partition_idle_ttl.unwrap_or_else(|| null_arg("partition_idle_ttl"));
    let options = QueueOptions {
        lease_time,
        retry_limit,
        dead_letter_queue,
        dlq_after_max_retries,
        dedup_window,
        encryption: encryption.unwrap_or(false),
        retention,
        retry_backoff: crate::clock::interval_micros("retry_backoff", retry_backoff),
        retry_backoff_max: crate::clock::interval_micros("retry_backoff_max", retry_backoff_max),
        delay: crate::clock::interval_micros("delay", delay),
        create_groups,
        partition_idle_ttl: crate::clock::interval_micros("partition_idle_ttl", partition_idle_ttl),
    };
    if let Err(v) = options.validate(crate::settings::max_lease()) {
        crate::errors::violation(v);
    }
    if encryption == Some(true) {
        crate::encryption::require_key(queue);
    }
    invalidate();
    let encryption = pgrx::Spi::connect_mut(|client| {
        // The queue lock before the queue row (`queen_core::lock_order`), if it exists.
        let found =
            first_value::<i64>(run(client, "SELECT queue_id FROM queen.queues WHERE name = $1", &[queue.into()]));
        if let Some(id) = found {
            crate::locks::share_queue(id);
        }
        // encryption not given: an encrypted queue stays encrypted only if asked to; turning
        // it off silently would store the next payloads in plaintext.
        let encryption = encryption.unwrap_or_else(|| {
            let stored = first_value::<bool>(run(
                client,
                "SELECT encryption FROM queen.queues WHERE name = $1",
                &[queue.into()],
            ));
            if stored == Some(true) {
                crate::errors::raise(
                    pgrx::PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                    format!(
                        "queen: queue {queue:?} is encrypted: pass encryption => true to keep it so, \
                         or encryption => false to store new payloads in plaintext"
                    ),
                );
            }
            false
        });
        run(
            client,
            "INSERT INTO queen.queues AS q (name, lease_time, retry_limit, dead_letter_queue,
                                           dlq_after_max_retries, dedup_window, encryption, retention,
                                           retry_backoff, retry_backoff_max, delay, create_groups,
                                           partition_idle_ttl)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
             ON CONFLICT (name) DO UPDATE SET
               lease_time = EXCLUDED.lease_time, retry_limit = EXCLUDED.retry_limit,
               dead_letter_queue = EXCLUDED.dead_letter_queue,
               dlq_after_max_retries = EXCLUDED.dlq_after_max_retries,
               dedup_window = EXCLUDED.dedup_window, encryption = EXCLUDED.encryption,
               retention = EXCLUDED.retention, retry_backoff = EXCLUDED.retry_backoff,
               retry_backoff_max = EXCLUDED.retry_backoff_max, delay = EXCLUDED.delay,
               create_groups = EXCLUDED.create_groups, partition_idle_ttl = EXCLUDED.partition_idle_ttl,
               updated_at = now()",
            &[
                queue.into(),
                lease_time.into(),
                retry_limit.into(),
                dead_letter_queue.into(),
                dlq_after_max_retries.into(),
                dedup_window.into(),
                encryption.into(),
                retention.into(),
                retry_backoff.into(),
                retry_backoff_max.into(),
                delay.into(),
                create_groups.into(),
                partition_idle_ttl.into(),
            ],
        );
        encryption
    });
    let secs = |m: i64| m as f64 / queen_core::lease::MICROS as f64;
    pgrx::JsonB(serde_json::json!({
        "leaseTime": lease_time,
        "retryLimit": retry_limit,
        "deadLetterQueue": dead_letter_queue,
        "dlqAfterMaxRetries": dlq_after_max_retries,
        "dedupWindow": dedup_window,
        "encryption": encryption,
        "retention": retention,
        "retryBackoff": secs(options.retry_backoff),
        "retryBackoffMax": secs(options.retry_backoff_max),
        "delay": secs(options.delay),
        "createGroups": create_groups,
        "partitionIdleTtl": secs(options.partition_idle_ttl),
    }))
}

crate::srf::function_info_v1!(pg_finfo_configure_wrapper);

/// The C symbol of `queen.configure` up to 0.3.0, whose SQL declared 11 arguments. A
/// database whose SQL is still that of 0.3.0 when this library is loaded (after an
/// upgrade's restart, before `ALTER EXTENSION queen UPDATE`) gets this error from a
/// configure instead of a call with the wrong arguments.
///
/// # Safety
/// Called by PostgreSQL only.
#[no_mangle]
#[pgrx::pg_guard]
pub unsafe extern "C-unwind" fn configure_wrapper(_fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    crate::errors::raise(
        pgrx::PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "queen: this database has the SQL of an older queen than the library installed; run ALTER EXTENSION queen UPDATE"
            .to_string(),
    )
}
