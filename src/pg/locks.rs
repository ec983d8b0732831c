//! queen's heavyweight locks: the queue lock, the lane-creation lock and the
//! group-creation lock, in the order `queen_core::lock_order` sets; and the registries'
//! load locks, outside it. All are lock-manager locks on tags that only queen builds
//! (object locks whose class is one of queen's own tables, which no DDL and no SQL
//! function can take), so no other role can hold or block them, and the deadlock detector
//! sees every wait on them.

use pgrx::pg_sys;
use pgrx::prelude::*;
use queen_core::lock_order::{group_key, load_key, queue_key};

fn object_tag(class: pg_sys::Oid, objid: u32, sub: u16) -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        // SAFETY: a plain read of this backend's database.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: class.to_u32(),
        locktag_field3: objid,
        locktag_field4: sub,
        locktag_type: pg_sys::LockTagType::LOCKTAG_OBJECT as u8,
        locktag_lockmethodid: pg_sys::DEFAULT_LOCKMETHOD as u8,
    }
}

/// How a lock was taken.
#[derive(PartialEq)]
enum Took {
    /// This transaction held it already.
    Held,
    /// Taken now, at once.
    Now,
    /// Taken after waiting for another transaction.
    Waited,
    /// Not taken (without waiting).
    No,
}

/// Takes `tag` in `mode` until the transaction ends.
fn acquire(tag: &pg_sys::LOCKTAG, mode: u32, wait: bool) -> Took {
    use pg_sys::LockAcquireResult::{LOCKACQUIRE_ALREADY_CLEAR, LOCKACQUIRE_ALREADY_HELD, LOCKACQUIRE_NOT_AVAIL};
    let mode = mode as pg_sys::LOCKMODE;
    // SAFETY: a transaction-scoped lock on a fully initialized tag. pgrx wraps every
    // pg_sys call so that an ERROR it raises (deadlock, cancel) becomes a Rust panic and
    // then an ERROR again at the extension's boundary.
    unsafe {
        match pg_sys::LockAcquire(tag, mode, false, true) {
            LOCKACQUIRE_ALREADY_HELD | LOCKACQUIRE_ALREADY_CLEAR => return Took::Held,
            LOCKACQUIRE_NOT_AVAIL => {}
            _ => return Took::Now,
        }
        if !wait {
            return Took::No;
        }
        pg_sys::LockAcquire(tag, mode, false, false);
    }
    Took::Waited
}

fn queue_tag(queue_id: i64) -> pg_sys::LOCKTAG {
    object_tag(crate::pg::catalog::queen_table(c"queues"), queue_key(queue_id), 0)
}

/// The queue lock in share mode, for the rest of the transaction: every call that
/// touches a queue's rows takes it first. Waits only for a `delete_queue` of the queue.
/// Returns false when the queue was deleted while this call waited (read with a fresh
/// snapshot; under REPEATABLE READ or SERIALIZABLE that is a serialization failure).
///
/// A `delete_queue` that committed between the caller's lookup of the queue and this lock
/// made the caller wait, or (if it ended just before) sent an invalidation that arrives
/// here: either way the queue is looked up again. Otherwise the lookup stands, with no
/// extra query.
pub fn share_queue(queue_id: i64) -> bool {
    match acquire(&queue_tag(queue_id), pg_sys::AccessShareLock, true) {
        Took::Held => true,
        Took::Waited => {
            crate::pg::cache::changed_since();
            still_there(queue_id)
        }
        _ => !crate::pg::cache::changed_since() || still_there(queue_id),
    }
}

/// `share_queue` for a push, which stores into the queue. Under REPEATABLE READ or
/// SERIALIZABLE its lookup read the transaction's snapshot, which may predate a
/// `delete_queue` whose invalidation an earlier call of the transaction already took (a
/// push or a pop of another queue, or of this one, which then holds the lock already), so
/// there every push looks the queue up again, with a snapshot taken now (one query): a
/// reader may go on with its snapshot's view, a push would store a message in a deleted
/// queue. (`still_there` raises 40001 there when it is gone.)
pub fn share_queue_to_push(queue_id: i64) -> bool {
    share_queue(queue_id) && (!crate::pg::errors::fixed_snapshot() || still_there(queue_id))
}

/// The queue lock in share mode, if it can be taken without waiting (a retention step:
/// a queue that a `delete_queue` holds is skipped). False when it cannot, or when the queue
/// is gone.
pub fn try_share_queue(queue_id: i64) -> bool {
    match acquire(&queue_tag(queue_id), pg_sys::AccessShareLock, false) {
        Took::No => false,
        Took::Held => true,
        _ => !crate::pg::cache::changed_since() || still_there(queue_id),
    }
}

/// The lane-creation lock of a queue: creating lanes from the partition rows (a new
/// group's, or the repair of missed ones) and moving cursors back (`seek`) take it in share
/// mode; a retention step takes it exclusively and without waiting, so that a new group's
/// lanes are either seen by the step (their cursors hold segments back) or start at what
/// it deleted, and a rewind never points at a segment the step deletes. With `wait` false,
/// false when it is busy (a pop then does not create lanes this time). It is not the queue
/// row's lock: a `configure` (an update of that row) never makes a pop wait or skip.
pub fn lanes_creation(queue_id: i64, exclusive: bool, wait: bool) -> bool {
    let tag = object_tag(crate::pg::catalog::queen_table(c"queues"), queue_key(queue_id), 1);
    let mode = if exclusive { pg_sys::AccessExclusiveLock } else { pg_sys::AccessShareLock };
    taken(acquire(&tag, mode, wait))
}

/// The queue lock in exclusive mode (`delete_queue`).
pub fn own_queue(queue_id: i64) {
    acquire(&queue_tag(queue_id), pg_sys::AccessExclusiveLock, true);
}

/// Whether the lock was taken (or already held).
fn taken(t: Took) -> bool {
    t != Took::No
}

fn still_there(queue_id: i64) -> bool {
    let there = Spi::connect_mut(|client| {
        crate::pg::spi::first_row_now(
            client,
            "SELECT true FROM queen.queues WHERE queue_id = $1",
            &[queue_id.into()],
            |_| true,
        )
    })
    .is_some();
    if !there && crate::pg::errors::fixed_snapshot() {
        crate::pg::errors::serialization_failure("the queue was deleted by a concurrent transaction");
    }
    there
}

/// The creation lock of one consumer group, until the transaction ends. Without `wait`,
/// false when another transaction is creating the same group right now.
pub fn group_creation(queue_id: i64, group: &str, wait: bool) -> bool {
    let (objid, sub) = group_key(queue_id, group);
    taken(acquire(
        &object_tag(crate::pg::catalog::queen_table(c"groups"), objid, sub),
        pg_sys::AccessExclusiveLock,
        wait,
    ))
}

/// A role's privileges lock (`queen_core::lock_order`, after every other lock of queen's):
/// held exclusively until the transaction ends by a `grant` to `role` while it makes the
/// role a member of `queen_grantee` (`privileges::make_grantee`), so that a second grant
/// of the same role, in any database of the cluster, sees the membership the first
/// committed instead of adding it again and failing on `pg_auth_members`' unique key. A
/// lock on the role as a shared object (database 0, `pg_authid`, the role's OID; sub-id 1,
/// which PostgreSQL's own locks on roles do not use), as the membership is the
/// cluster's. Pending invalidations are then taken in, so the catalog cache shows what
/// the transaction waited for.
pub fn privileges(role: pg_sys::Oid) {
    let tag = pg_sys::LOCKTAG {
        locktag_field1: 0,
        locktag_field2: pg_sys::AuthIdRelationId.to_u32(),
        locktag_field3: role.to_u32(),
        locktag_field4: 1,
        locktag_type: pg_sys::LockTagType::LOCKTAG_OBJECT as u8,
        locktag_lockmethodid: pg_sys::DEFAULT_LOCKMETHOD as u8,
    };
    acquire(&tag, pg_sys::ExclusiveLock, true);
    // SAFETY: processing invalidation messages is allowed anywhere in a transaction;
    // LockRelationOid does the same after a lock it waited for.
    unsafe { pg_sys::AcceptInvalidationMessages() };
}

/// The function rights lock (after a role's privileges lock): held exclusively until the
/// transaction ends by a `grant` that takes back EXECUTE on queen's functions given to its
/// role directly (`privileges::make_grantee`). Such a REVOKE rewrites the functions'
/// catalog rows, and two at once (grants of two roles) would fail with `tuple
/// concurrently updated`. Pending invalidations are taken in after it, so the rows are
/// read as the transaction waited for them.
pub fn function_rights() {
    acquire(&object_tag(crate::pg::catalog::queen_table(c"queue_grants"), 0, 0), pg_sys::ExclusiveLock, true);
    // SAFETY: as in `privileges`.
    unsafe { pg_sys::AcceptInvalidationMessages() };
}

/// The load lock of a registry entry (`queen_core::lock_order`, after the list): held
/// exclusively by the backend that loads the entry, waited for in share mode by one that
/// finds it loading. Both waits are in the lock manager, where the deadlock detector sees
/// them.
pub struct LoadLock(pg_sys::LOCKTAG);

impl LoadLock {
    /// A partition's entry in the offset registry.
    pub fn partition(partition_id: pgrx::Uuid) -> Self {
        let (objid, sub) = load_key(&[partition_id.as_bytes()]);
        LoadLock(object_tag(crate::pg::catalog::queen_table(c"partitions"), objid, sub))
    }

    /// A lane's entry in the lane registry.
    pub fn lane(partition_id: pgrx::Uuid, group: &str) -> Self {
        let (objid, sub) = load_key(&[partition_id.as_bytes(), group.as_bytes()]);
        LoadLock(object_tag(crate::pg::catalog::queen_table(c"lanes"), objid, sub))
    }

    /// Runs `load` holding the lock exclusively: after another backend's load of the
    /// entry (or of one sharing its key) ends. An ERROR in `load` lets it go with the
    /// (sub)transaction.
    pub fn holding<R>(&self, load: impl FnOnce() -> R) -> R {
        // A standby takes no object lock this strong; nor does it load registries (they are
        // off there), but a caller that forgot that still gets its load.
        if crate::pg::shmem::in_recovery() {
            return load();
        }
        acquire(&self.0, pg_sys::ExclusiveLock, true);
        let out = load();
        self.release(pg_sys::ExclusiveLock);
        out
    }

    /// Waits for the backend that loads the entry. When nobody holds the lock (the load
    /// has just ended, or its end is deferred: `pg::deferred` keeps a failed load's
    /// abandon until that backend's next queen call, and the entry reads as loading until
    /// then), naps 100 µs instead: the caller looks at the entry again either way.
    pub fn wait(&self) {
        let waited = !crate::pg::shmem::in_recovery() && {
            let took = acquire(&self.0, pg_sys::ShareLock, true);
            self.release(pg_sys::ShareLock);
            took == Took::Waited
        };
        if !waited {
            // SAFETY: a plain sleep; interrupts are checked right after.
            unsafe { pg_sys::pg_usleep(100) };
            pgrx::check_for_interrupts!();
        }
    }

    fn release(&self, mode: u32) {
        // SAFETY: releases one hold of a lock `acquire` took in this (sub)transaction in
        // `mode` (LockRelease counts holds, so an earlier hold of the same lock stays).
        unsafe { pg_sys::LockRelease(&self.0, mode as pg_sys::LOCKMODE, false) };
    }
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._own_queue(bigint) IS
  'queen internal: the queue lock in exclusive mode (delete_queue); not granted';
"#,
    name = "own_queue_sql_home",
    requires = [own_queue_sql]
);

/// `queen._own_queue(queue_id)`: the queue lock in exclusive mode, for `delete_queue`
/// (PL/pgSQL). Not granted.
#[pg_extern(name = "_own_queue", volatile, parallel_unsafe)]
fn own_queue_sql(queue_id: i64) {
    own_queue(queue_id);
}
