//! The per-backend caches' clock: one generation number that moves whenever what they
//! cached may be stale. `queen.queues` is the one relation every change of a queue or a
//! group (options, a deletion, a group's budget, a grant) invalidates; a relcache
//! callback on it (registered by `hooks`), a transaction's abort, and the extension
//! dropped and created again each start a new generation. A cache keeps each entry with
//! the generation it was read under (`cached`), and a backend sees other transactions'
//! changes when it next asks (`generation` processes the pending invalidations first).

use pgrx::pg_sys;
use pgrx::prelude::*;

thread_local! {
    static QUEUES_OID: std::cell::Cell<pg_sys::Oid> = const { std::cell::Cell::new(pg_sys::InvalidOid) };
    /// Set with every new generation, for `locks::share_queue` (see `changed_since`).
    static CHANGED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Counts the generations (see `generation`).
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

/// The generation as last seen, without processing invalidations: to tell whether one
/// arrived while a cache entry was being read.
pub fn last_generation() -> u64 {
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
    !crate::pg::errors::fixed_snapshot()
}

/// Follows `queen.queues` to its current OID (the extension dropped and created again
/// gives it a new one): the invalidation callback compares against it. A new OID counts
/// as a change.
fn track_queues_oid() {
    let oid = queues_oid();
    if QUEUES_OID.with(|o| o.replace(oid)) != oid {
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

/// The relcache callback (registered by `hooks`): a new generation when `queen.queues` is
/// invalidated (or every relation is).
///
/// # Safety
/// Called by PostgreSQL only, as a relcache callback.
#[pg_guard]
pub unsafe extern "C-unwind" fn relcache_callback(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    if relid == pg_sys::InvalidOid || relid == QUEUES_OID.with(|o| o.get()) {
        CHANGED.with(|c| c.set(true));
        GENERATION.with(|g| g.set(g.get() + 1));
    }
}

/// A transaction or subtransaction aborted: forget what caches read while it ran (it may
/// have created queues or partitions that are gone now): a new generation.
pub fn on_abort() {
    GENERATION.with(|g| g.set(g.get() + 1));
}

/// Tells every backend that queues or groups changed (options, a queue deleted, a group's
/// budget set or the group dropped, a grant): each drops what it cached (`generation`)
/// when it next pushes, pops or acks, once this one commits.
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
    crate::pg::catalog::queen_table(c"queues")
}
