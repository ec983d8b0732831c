//! Offsets without a commit-long lock: the shared-memory side of
//! `queen_core::offsets` (the registry and its rules live there).
//!
//! With `shared_preload_libraries = 'queen'` a push reserves its offsets in the registry
//! and holds no row lock; concurrent pushes to one partition run and commit in parallel.
//! A pop reads only up to the partition's readable end (`readable`): everything up to it is
//! decided, so a pop never delivers offset k+1 while offset k may still commit. An aborted
//! push leaves a gap. The registry learns how a transaction ended from the transaction
//! callbacks below, which PostgreSQL runs after the transaction's rows became visible.
//!
//! A transaction that reserved offsets can be prepared (`PREPARE TRANSACTION`, as Citus
//! does to commit a transaction that wrote on two workers): its reservations then pass to
//! the prepared transaction (`Registry::prepare`) and stay in flight until `COMMIT
//! PREPARED` or `ROLLBACK PREPARED` ends them (`process_utility`), so readers stop before
//! them meanwhile. Should that hook miss one, the background worker ends it once its xid
//! is no longer in progress (`sweep_prepared`). A prepared transaction outlives a restart,
//! the registry does not: a partition loaded while a prepared transaction holds a lock on
//! queen's segment tables waits for that transaction first (`wait_for_prepared`), so that its
//! offsets are neither passed by readers nor reserved again.
//!
//! Without preloading there is no registry: a push reserves offsets by updating its
//! partition row and holds that row until it commits (pushes to one partition then commit
//! one at a time), and the readable end is the highest offset any committed segment holds.

use std::cell::{Cell, RefCell};
use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::PgSqlErrorCode;
use queen_core::fail;
use queen_core::offsets::{
    part_key, DropRefusal, Header, Layout, Load, PartKey, Record, Refusal, Registry, Seen, Slot, View, LAST_OFFSET,
};

use crate::pg::clock::clock_now;
use crate::pg::deferred;
use crate::pg::errors;
use crate::pg::locks::LoadLock;
use crate::pg::settings;
use crate::pg::shmem::{owner, subxact, Parts, Region};

pub const TRANCHE: &CStr = c"queen";

static mut SHARED: Option<Region<Layout>> = None;

thread_local! {
    /// This backend holds reservations in the current transaction.
    static HOLDS: Cell<bool> = const { Cell::new(false) };
    /// The partition this backend is loading into the registry, if a load is under way.
    static LOADING: Cell<Option<PartKey>> = const { Cell::new(None) };
    /// The xid whose reservations passed to a prepared-transaction owner at PRE_PREPARE,
    /// until the prepare is done (or fails, and they end as aborted).
    static PREPARING: Cell<Option<u32>> = const { Cell::new(None) };
    /// Partitions this transaction is dropping, with the subtransaction that began each.
    static DROPS: RefCell<Vec<(u32, PartKey)>> = const { RefCell::new(Vec::new()) };
}

fn layout() -> Layout {
    // SAFETY: MaxBackends is set before shared memory is sized (PostgreSQL 15's shmem
    // request hook exists for exactly that).
    let backends = unsafe { pg_sys::MaxBackends } as usize;
    let (partitions, reservations) = settings::offset_registry_sizes();
    Layout::new(partitions, reservations, backends + prepared_owners())
}

/// Owners for prepared transactions' reservations: one per prepared transaction the
/// server allows (`max_prepared_transactions`, fixed at server start).
fn prepared_owners() -> usize {
    // SAFETY: a lookup of a built-in setting by name; the string lives in the GUC system.
    let v = unsafe { pg_sys::GetConfigOption(c"max_prepared_transactions".as_ptr(), false, false) };
    // SAFETY: GetConfigOption returns a valid C string for a built-in setting.
    unsafe { CStr::from_ptr(v) }.to_str().ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Bytes of shared memory the registry takes.
pub fn shmem_size() -> usize {
    layout().size()
}

/// Formats the registry (or attaches to it): `hooks` calls this once per process.
///
/// # Safety
/// The block given points at `shmem_size()` bytes of shared memory named for this part, fresh when
/// `!found`; the caller holds AddinShmemInitLock while shared memory is set up, once per
/// process.
pub unsafe fn shmem_init((base, found): (*mut u8, bool)) {
    let layout = layout();
    // SAFETY: the tranche was requested in the shmem request hook.
    let lock = unsafe { &raw mut (*pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr())).lock };
    // SAFETY: `base` points at shmem_size() bytes laid out by `layout`, fresh when !found;
    // the caller holds AddinShmemInitLock, so nobody else touches them yet, and SHARED is
    // written here once per process, before any query runs.
    unsafe {
        let region = Region::new(lock, base, layout);
        if !found {
            let (h, slots, recs, owners) = region.parts_for_format();
            Registry::format(h, slots, recs, owners, settings::offset_registry_sizes().0, prepared_owners());
        }
        SHARED = Some(region);
    }
}

/// The registry's parts inside its block of shared memory: the header, the partition
/// slots, the reservation records and (for a writer) the owners.
impl Parts for Layout {
    type Mut<'a> = (&'a mut Header, &'a mut [Slot], &'a mut [Record], &'a mut [u32]);
    type Ref<'a> = (&'a Header, &'a [Slot], &'a [Record]);

    unsafe fn parts_mut<'a>(self, base: *mut u8) -> Self::Mut<'a> {
        let l = self;
        // SAFETY: as the trait requires of the caller; each part starts 8-byte aligned
        // (the block is MAXALIGNed and every size Layout computes is a multiple of 8),
        // lies inside the block, and the parts do not overlap.
        unsafe {
            (
                &mut *(base as *mut Header),
                std::slice::from_raw_parts_mut(base.add(l.slots_at()) as *mut Slot, l.slots),
                std::slice::from_raw_parts_mut(base.add(l.records_at()) as *mut Record, l.records),
                std::slice::from_raw_parts_mut(base.add(l.owners_at()) as *mut u32, l.owners),
            )
        }
    }

    unsafe fn parts_ref<'a>(self, base: *const u8) -> Self::Ref<'a> {
        let l = self;
        // SAFETY: as `parts_mut`; nothing here writes.
        unsafe {
            (
                &*(base as *const Header),
                std::slice::from_raw_parts(base.add(l.slots_at()) as *const Slot, l.slots),
                std::slice::from_raw_parts(base.add(l.records_at()) as *const Record, l.records),
            )
        }
    }
}

/// True when the registry is in use: the library was preloaded, and the server is not in
/// recovery.
pub fn enabled() -> bool {
    // SAFETY: SHARED is written once per process, before any query runs.
    let preloaded = unsafe { (*std::ptr::addr_of!(SHARED)).is_some() };
    // Not on a standby (`shmem::in_recovery`): its reads go to the tables.
    preloaded && !crate::pg::shmem::in_recovery()
}

fn shared() -> &'static Region<Layout> {
    // SAFETY: as in `enabled`; callers check `enabled` first.
    unsafe { (*std::ptr::addr_of!(SHARED)).as_ref().expect("queen offsets: shared memory not set up") }
}

/// Runs `f` on the registry under its lock, exclusively. A panic in `f` leaves the
/// registry as it was (`Registry` puts back what it wrote) and releases the lock. What an
/// earlier transaction end of this backend could not do is done first, in both
/// registries (`deferred::settle_all`).
fn with_registry<R>(f: impl FnOnce(&mut Registry<'_>) -> R) -> R {
    deferred::settle::<OffsetEnds>();
    deferred::settle_all();
    registry_op(f)
}

fn registry_op<R>(f: impl FnOnce(&mut Registry<'_>) -> R) -> R {
    // `f` is pure Rust that cannot raise an ERROR (a panic unwinds; the lock goes).
    shared().exclusive(|(h, slots, recs, owners)| f(&mut Registry::new(h, slots, recs, owners)))
}

/// Runs `f` on a read-only view under the lock in shared mode.
fn with_view<R>(f: impl FnOnce(&View<'_>) -> R) -> R {
    deferred::settle::<OffsetEnds>();
    shared().share(|(h, slots, recs)| f(&View::new(h, slots, recs)))
}

/// The registry's key of a partition of the current database.
fn key(partition_id: pgrx::Uuid) -> PartKey {
    part_key(crate::pg::dbs::my_database(), *partition_id.as_bytes())
}

/// This transaction's virtual transaction id.
fn my_vxid() -> (i32, u32) {
    // SAFETY: MyProc is this backend's PGPROC, set for every backend.
    unsafe { ((*pg_sys::MyProc).backendId, (*pg_sys::MyProc).lxid) }
}

/// Another backend is loading a partition: wait for its load (`LoadLock::wait`).
fn wait_for_load(partition_id: pgrx::Uuid) {
    LoadLock::partition(partition_id).wait();
}

/// Waits, in the lock manager (so that deadlocks are detected), for a virtual
/// transaction to end. `waited`: the one waited for last; waited for again (it ended, but
/// its end is deferred until its session's next call), it is a 10 ms sleep, not a spin.
fn wait_for(vxid: (i32, u32), waited: &mut Option<(i32, u32)>) {
    if *waited == Some(vxid) {
        // SAFETY: a plain sleep; interrupts are checked right after.
        unsafe { pg_sys::pg_usleep(10_000) };
        pgrx::check_for_interrupts!();
        return;
    }
    *waited = Some(vxid);
    let v = pg_sys::VirtualTransactionId { backendId: vxid.0, localTransactionId: vxid.1 };
    // SAFETY: waits for that virtual transaction to end; returns at once if it has.
    unsafe { pg_sys::VirtualXactLock(v, true) };
    pgrx::check_for_interrupts!();
}

fn full(what: &str) -> ! {
    errors::raise(
        PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        format!(
            "queen: {what}; raise it in postgresql.conf (takes a restart) or push to fewer partitions per transaction"
        ),
    )
}

/// Refuses (54000) a push of `n` that would pass a partition's last offset
/// (`queen_core::offsets::reservation_end`).
pub fn exhausted(n: i64) -> ! {
    errors::raise(
        PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        format!(
            "queen: a push of {n} would pass the partition's last offset ({}); push to another partition",
            LAST_OFFSET
        ),
    )
}

/// Reserves `n` offsets of a partition for the current transaction; returns the first, or
/// None when the partition is gone (`drop_partition`: the caller looks its target up
/// again). `writes_all`: every reserved offset will be written (else report them with
/// `wrote`); `fresh`: they go to the fresh tier; `pushed_at`: the time the messages carry
/// (their segments' `created_at`), by which a late release is told (`readable_after`).
pub fn reserve(
    client: &mut SpiClient<'_>,
    partition_id: pgrx::Uuid,
    n: i64,
    writes_all: bool,
    fresh: bool,
    pushed_at: i64,
) -> Option<i64> {
    let key = key(partition_id);
    let (me, sub) = (owner(), subxact());
    let mut waited = None;
    loop {
        match with_registry(|r| r.reserve(&key, n, me, sub, writes_all, fresh, pushed_at)) {
            Ok(first) => {
                HOLDS.with(|h| h.set(true));
                return Some(first);
            }
            Err(Refusal::Unknown) => {
                if !load(client, partition_id) {
                    return None;
                }
            }
            Err(Refusal::Loading) => wait_for_load(partition_id),
            // This transaction dropped it: it is gone for this push.
            Err(Refusal::Dropping(vxid)) if vxid == my_vxid() => return None,
            Err(Refusal::Dropping(vxid)) => wait_for(vxid, &mut waited),
            Err(Refusal::Full) => full("every offset reservation is in use (queen.max_reservations)"),
            Err(Refusal::Exhausted) => exhausted(n),
        }
    }
}

/// `queen_core::offsets::View::readable_after` for a partition of this database: a time
/// after which `offset` became readable, when that came late. None also without the
/// registry (no preloading, or a standby).
pub fn readable_after(partition_id: pgrx::Uuid, offset: i64) -> Option<i64> {
    if !enabled() {
        return None;
    }
    let key = key(partition_id);
    with_view(|v| v.readable_after(&key, offset))
}

/// False when no segment of the fresh tier can hold an offset from `start` on (a read
/// then skips that tier). Without the registry, or before it knows the partition: true.
pub fn may_be_fresh(partition_id: pgrx::Uuid, start: i64) -> bool {
    if !enabled() {
        return true;
    }
    let key = key(partition_id);
    with_view(|v| v.fresh_max(&key)).is_none_or(|max| start <= max)
}

/// The partitions of `database` the registry tracks that a push wrote to the fresh tier
/// of, each with the highest offset that may be there (empty without the registry).
pub fn fresh_partitions(database: u32) -> Vec<(pgrx::Uuid, i64)> {
    if !enabled() {
        return Vec::new();
    }
    with_view(|v| v.fresh_partitions(database)).into_iter().map(|(p, max)| (pgrx::Uuid::from_bytes(p), max)).collect()
}

/// Forgets the partitions of a database that nothing uses: none with a push in flight or a
/// load under way (`lane::forget_registries` says when). Returns how many.
pub fn forget_database(database: u32) -> usize {
    if enabled() {
        registry_op(|r| r.forget_database(database))
    } else {
        0
    }
}

/// How many partitions of a database the registry holds, in any state (after
/// `forget_database`: those with a push in flight or a load under way).
pub fn count_database(database: u32) -> usize {
    if enabled() {
        registry_op(|r| r.count_database(database))
    } else {
        0
    }
}

/// Records that the current transaction wrote offsets of a partition up to `last`.
pub fn wrote(partition_id: pgrx::Uuid, last: i64) {
    let key = key(partition_id);
    let me = owner();
    with_registry(|r| r.wrote(&key, me, last));
}

/// The readable end of a partition as this transaction sees it (see the module docs; its
/// own pushes count as committed for itself). Without the registry: the
/// highest offset a committed segment holds (pushes then commit in offset order, under
/// their partition row lock, so nothing below it is in flight). The partition row's head
/// is not used: a reserved head may end in a gap, and only stored segments count.
/// A partition that no longer exists reads as what the database still holds (nothing).
pub fn readable(partition_id: pgrx::Uuid) -> i64 {
    if !enabled() {
        return Spi::connect_mut(|client| stored_ends(client, partition_id).readable);
    }
    let key = key(partition_id);
    let me = owner();
    loop {
        match with_view(|v| v.readable_for(&key, me)) {
            Seen::Readable(end) => return end,
            Seen::Loading => wait_for_load(partition_id),
            Seen::Unknown => {
                if !Spi::connect_mut(|client| load(client, partition_id)) {
                    return Spi::connect_mut(|client| stored_ends(client, partition_id).readable);
                }
            }
        }
    }
}

/// Brings a partition into the registry: its head and readable end are the highest
/// offset the database holds for it, read with a snapshot taken after the slot was
/// claimed (nothing was in flight for it before: it had no slot), whatever the
/// transaction's isolation level (`spi::first_row_now`). False when the partition does
/// not exist (any more): nothing is loaded.
fn load(client: &mut SpiClient<'_>, partition_id: pgrx::Uuid) -> bool {
    let key = key(partition_id);
    let me = owner();
    LoadLock::partition(partition_id).holding(|| match with_registry(|r| r.begin_load(&key, me)) {
        Load::Ready => true,
        // A load another backend abandoned, its end deferred (`LoadLock::wait`).
        Load::Loading => {
            wait_for_load(partition_id);
            true
        }
        Load::Full => full("every tracked partition has pushes in flight (queen.tracked_partitions)"),
        Load::Mine => {
            LOADING.with(|l| l.set(Some(key)));
            wait_for_prepared(client);
            let e = stored_ends(client, partition_id);
            if e.exists {
                with_registry(|r| r.finish_load(&key, me, e.head, e.readable, e.fresh_max));
            } else {
                with_registry(|r| r.abandon_load(&key, me));
            }
            LOADING.with(|l| l.set(None));
            e.exists
        }
    })
}

/// Waits for the prepared transactions of this database that the registry does not know
/// (they were prepared before the server last started) and that wrote to queen's segment
/// tables (they pushed): their reservations are lost with the registry, and their rows
/// are invisible until they commit. The database's view of a partition is complete once
/// they are over. Prepared transactions the registry holds need no wait: their partitions
/// stay tracked until they end, and are never loaded meanwhile. Cheap when nothing is
/// prepared (one look at the prepared transactions; the lock table only when there are).
fn wait_for_prepared(client: &mut SpiClient<'_>) {
    loop {
        let known = with_registry(|r| r.prepared());
        let prepared: Vec<i64> = crate::pg::spi::run(
            client,
            "SELECT x.transaction::text::int8 FROM pg_catalog.pg_prepared_xacts x
              WHERE x.database = pg_catalog.current_database()",
            &[],
        )
        .filter_map(|row| row.get::<i64>(1).ok().flatten())
        .filter(|&x| !known.contains(&(x as u32)))
        .collect();
        if prepared.is_empty() {
            return;
        }
        let wrote: Vec<i64> = crate::pg::spi::run(
            client,
            "SELECT DISTINCT x FROM pg_catalog.unnest($1::int8[]) AS u(x)
              WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                             JOIN pg_catalog.pg_class c ON c.oid = l.relation
                            WHERE l.locktype = 'relation' AND l.pid IS NULL AND l.mode = 'RowExclusiveLock'
                              AND l.virtualtransaction = '-1/' || u.x::text
                              AND c.relnamespace = 'queen'::regnamespace
                              AND c.relname ~ '^(fresh_)?segments')",
            &[prepared.into()],
        )
        .filter_map(|row| row.get::<i64>(1).ok().flatten())
        .collect();
        if wrote.is_empty() {
            return;
        }
        for xid in wrote {
            // SAFETY: waits on the transaction lock that a prepared transaction holds until
            // it is committed or rolled back; interrupts are served while waiting.
            unsafe {
                pg_sys::XactLockTableWait(
                    pg_sys::TransactionId::from_inner(xid as u32),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    pg_sys::XLTW_Oper::XLTW_None,
                )
            };
        }
    }
}

/// What the database says of a partition.
struct Stored {
    /// The partition row exists.
    exists: bool,
    /// At least `readable`, and anything else that names an offset: the partition row's
    /// head (kept by pushes without the registry) and every lane's cursor.
    head: i64,
    /// The highest offset a segment of either tier holds (a segment ends on a message) or
    /// that retention deleted.
    readable: i64,
    /// The last offset of the fresh tier's last segment.
    fresh_max: i64,
}

fn stored_ends(client: &mut SpiClient<'_>, partition_id: pgrx::Uuid) -> Stored {
    let row = crate::pg::spi::first_row_now(
        client,
        "WITH t AS (
           SELECT (SELECT s.last_offset FROM queen.segments s WHERE s.partition_id = $1
                    ORDER BY s.first_offset DESC LIMIT 1) AS durable,
                  (SELECT f.last_offset FROM queen.fresh_segments f WHERE f.partition_id = $1
                    ORDER BY f.first_offset DESC LIMIT 1) AS fresh,
                  (SELECT p.retained_through FROM queen.partitions p WHERE p.partition_id = $1) AS retained
         ), r AS (
           SELECT greatest(t.durable, t.fresh, t.retained, 0) AS readable, coalesce(t.fresh, 0) AS fresh,
                  t.retained IS NOT NULL AS exists
             FROM t
         )
         SELECT greatest(r.readable,
                         (SELECT p.head FROM queen.partitions p WHERE p.partition_id = $1),
                         (SELECT max(l.committed) FROM queen.lanes l WHERE l.partition_id = $1)),
                r.readable, r.fresh, r.exists
           FROM r",
        &[partition_id.into()],
        |row| Stored {
            head: row.get::<i64>(1).unwrap_or(0),
            readable: row.get::<i64>(2).unwrap_or(0),
            fresh_max: row.get::<i64>(3).unwrap_or(0),
            exists: row.get::<bool>(4).unwrap_or(false),
        },
    );
    row.unwrap_or(Stored { exists: false, head: 0, readable: 0, fresh_max: 0 })
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._readable(uuid, bigint) IS
  'queen internal: a partition''s readable end (offsets below it are decided); not granted';
"#,
    name = "readable_sql_home",
    requires = [readable_sql]
);

/// `queen._readable(partition_id, head)`: the readable end of a partition, for queen's own
/// SQL (the claim query of pop, status, totals, group creation). Not granted. `head` is
/// ignored; it stays so that the installed SQL signature does not change.
#[pg_extern(name = "_readable", volatile, parallel_unsafe)]
fn readable_sql(partition_id: pgrx::Uuid, head: i64) -> i64 {
    let _ = head; // ignored (see above)
    readable(partition_id)
}

// ---- dropping a partition (`churn::drop_partition`) ----

/// Why a partition cannot be dropped now.
pub enum DropBusy {
    /// Pushes to it are in flight (or committed but not readable yet).
    InFlight,
}

/// Keeps every push out of a partition until this transaction ends: it is being dropped.
/// With the registry, a push that comes meanwhile waits for this transaction, and then,
/// if it committed, finds the partition gone and creates a new one. Refused while pushes
/// to it are in flight. Without the registry pushes hold the partition row, which the
/// caller locks.
pub fn begin_drop(client: &mut SpiClient<'_>, partition_id: pgrx::Uuid) -> Result<(), DropBusy> {
    if !enabled() {
        return Ok(());
    }
    let key = key(partition_id);
    let me = owner();
    let vxid = my_vxid();
    let mut waited = None;
    loop {
        match with_registry(|r| r.begin_drop(&key, me, vxid)) {
            Ok(()) => {
                let sub = subxact();
                DROPS.with(|d| d.borrow_mut().push((sub, key)));
                return Ok(());
            }
            Err(DropRefusal::Unknown) => {
                if !load(client, partition_id) {
                    return Ok(()); // gone already
                }
            }
            Err(DropRefusal::Loading) => wait_for_load(partition_id),
            Err(DropRefusal::Dropping(other)) => wait_for(other, &mut waited),
            Err(DropRefusal::InFlight) => return Err(DropBusy::InFlight),
        }
    }
}

// ---- two-phase commit ----

/// PRE_PREPARE: a transaction that reserved offsets hands them to a prepared-transaction
/// owner under its xid (`Registry::prepare`). May raise (before the prepare, an ERROR
/// aborts the transaction cleanly).
pub fn prepare() {
    if DROPS.with(|d| !d.borrow().is_empty()) {
        errors::raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            "queen: a transaction that dropped a partition cannot be prepared (PREPARE TRANSACTION)".to_string(),
        );
    }
    if !HOLDS.with(|h| h.get()) || !enabled() {
        return;
    }
    // SAFETY: a plain read of the current transaction's xid; a push assigned it.
    let xid = unsafe { pg_sys::GetTopTransactionIdIfAny() }.into_inner();
    if prepared_owners() == 0 {
        return; // PostgreSQL refuses the prepare itself: prepared transactions are disabled
    }
    let me = owner();
    if !with_registry(|r| r.prepare(me, xid)) {
        errors::raise(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            "queen: every slot for a prepared transaction's offsets is in use (one per max_prepared_transactions); \
             commit or roll back prepared transactions first"
                .to_string(),
        );
    }
    HOLDS.with(|h| h.set(false));
    PREPARING.with(|p| p.set(Some(xid)));
}

/// PREPARE: done; the reservations belong to the prepared transaction now.
pub fn prepared() {
    PREPARING.with(|p| p.set(None));
}

/// An abort after PRE_PREPARE handed the reservations over: the prepare failed, so they
/// end as aborted. Raises nothing.
pub fn prepare_failed() {
    if let Some(xid) = PREPARING.with(|p| p.take()) {
        finish_prepared(xid, false);
    }
}

/// A prepared transaction ended (`COMMIT PREPARED`, `ROLLBACK PREPARED`, or a prepare that
/// failed): its reservations end. Waiting pops look again: its messages, or those that
/// committed after it (a rollback frees them too), may be readable now. Returns whether
/// it held reservations.
pub fn finish_prepared(xid: u32, committed: bool) -> bool {
    if !enabled() {
        return false;
    }
    let now = clock_now();
    let ended = with_registry(|r| r.finish_prepared(xid, committed, now));
    if ended {
        crate::pg::wake::broadcast_all();
    }
    ended
}

/// Ends the reservations of prepared transactions that are over, should the
/// `ProcessUtility` hook have missed one (the background worker calls this). Returns how
/// many it ended.
pub fn sweep_prepared() -> usize {
    if !enabled() {
        return 0;
    }
    let mut ended = 0;
    for xid in with_registry(|r| r.prepared()) {
        // SAFETY: plain reads of the transaction status; `xid` is a normal xid that a
        // prepared transaction of this server held.
        let (running, committed) = unsafe {
            let x = pg_sys::TransactionId::from_inner(xid);
            (pg_sys::TransactionIdIsInProgress(x), pg_sys::TransactionIdDidCommit(x))
        };
        if !running && finish_prepared(xid, committed) {
            ended += 1;
        }
    }
    ended
}

/// The xid of the prepared transaction that a `COMMIT PREPARED` / `ROLLBACK PREPARED` names,
/// when it holds reservations; with whether it commits. The lookup runs with queen's
/// search path (pg_catalog, pg_temp), not the caller's: this runs inside any session's
/// statement, and a schema on its path must not put an operator in the way.
///
/// # Safety
/// `stmt` points at a valid parse node: the utility statement `ProcessUtility` received.
pub unsafe fn resolving(stmt: *mut pg_sys::Node) -> Option<(u32, bool)> {
    if !enabled() {
        return None;
    }
    // SAFETY: `stmt` is a valid node, as the caller promises; a TransactionStmt is read only
    // after its tag says so.
    unsafe {
        if (*stmt).type_ != pg_sys::NodeTag::T_TransactionStmt {
            return None;
        }
        let t = stmt as *mut pg_sys::TransactionStmt;
        let commit = match (*t).kind {
            pg_sys::TransactionStmtKind::TRANS_STMT_COMMIT_PREPARED => true,
            pg_sys::TransactionStmtKind::TRANS_STMT_ROLLBACK_PREPARED => false,
            _ => return None,
        };
        if (*t).gid.is_null() || with_registry(|r| r.prepared().is_empty()) {
            return None;
        }
        let gid = CStr::from_ptr((*t).gid).to_string_lossy().into_owned();
        let xid = crate::pg::spi::with_pinned_search_path(|| {
            Spi::connect_mut(|client| {
                crate::pg::spi::first_value::<i64>(crate::pg::spi::run(
                    client,
                    "SELECT transaction::text::int8 FROM pg_catalog.pg_prepared_xacts WHERE gid = $1",
                    &[gid.into()],
                ))
            })
        })?;
        Some((xid as u32, commit))
    }
}

// ---- the end of a transaction ----

/// Work a transaction's end, or a subtransaction's abort, leaves to the registry.
enum Deferred {
    /// A transaction ended: its reservations commit or leave gaps, a load it did not
    /// finish is dropped, and the partitions it dropped go (commit) or come back (abort).
    End { committed: bool, holds: bool, loading: Option<PartKey>, drops: Vec<PartKey> },
    /// A subtransaction aborted: its reservations and drops end, its load is dropped.
    SubAbort { sub: u32, holds: bool, loading: Option<PartKey>, drops: Vec<PartKey> },
}

/// The registry's deferred ends (`deferred`): applied at once when they can be, else kept
/// and done before this backend's next use of a registry.
struct OffsetEnds;

impl deferred::Registry for OffsetEnds {
    type End = Deferred;
    const NAME: &'static str = "offset";
    const LOST_AT_EXIT: &'static str = "offsets this session reserved stay in flight";
    fn pending() -> &'static std::thread::LocalKey<RefCell<Vec<Deferred>>> {
        thread_local! {
            static PENDING: RefCell<Vec<Deferred>> = const { RefCell::new(Vec::new()) };
        }
        &PENDING
    }
    fn apply(end: &Deferred) {
        apply_end(end)
    }
}

fn apply_end(d: &Deferred) {
    let me = owner();
    // Readers see what this end releases from now on (a late release is noted with it).
    let now = clock_now();
    registry_op(|r| match d {
        Deferred::End { committed, holds, loading, drops } => {
            fail::point(if *committed { "xact.commit.offsets" } else { "xact.abort.offsets" });
            if *holds {
                r.finish(me, *committed, now);
            }
            if let Some(key) = loading {
                r.abandon_load(key, me);
            }
            for key in drops {
                r.end_drop(key, me, *committed);
            }
        }
        Deferred::SubAbort { sub, holds, loading, drops } => {
            fail::point("xact.subabort.offsets");
            if let Some(key) = loading {
                r.abandon_load(key, me);
            }
            if *holds {
                r.abort_subxact(me, *sub, now);
            }
            for key in drops {
                r.end_drop(key, me, false);
            }
        }
    });
}

/// Ends this backend's part in the registry for the current transaction. Raises nothing.
pub fn end(committed: bool) {
    let holds = HOLDS.with(|h| h.replace(false));
    let loading = LOADING.with(|l| l.take());
    let drops: Vec<PartKey> = DROPS.with(|d| std::mem::take(&mut *d.borrow_mut())).into_iter().map(|e| e.1).collect();
    if !(holds || loading.is_some() || !drops.is_empty()) || !enabled() {
        return;
    }
    deferred::finish::<OffsetEnds>(Deferred::End { committed, holds, loading, drops });
}

/// A subtransaction ended: an abort ends what it reserved, loaded or dropped; a commit
/// hands it to the parent. Raises nothing on abort.
pub fn end_subxact(sub: u32, parent: u32, committed: bool) {
    if !enabled() {
        return;
    }
    let me = owner();
    if committed {
        DROPS.with(|d| d.borrow_mut().iter_mut().filter(|e| e.0 >= sub).for_each(|e| e.0 = parent));
        // Hands the reservations to the parent. Raises nothing (this runs inside
        // PostgreSQL's subtransaction commit, past the point where an ERROR is clean), and
        // may be skipped: reservations are aborted by subtransaction id order
        // (`abort_subxact` ends every one made at or after a subtransaction), so a
        // reservation left with its child's id still ends with the right ancestor.
        if HOLDS.with(|h| h.get()) {
            let _ = std::panic::catch_unwind(|| registry_op(|r| r.commit_subxact(me, sub, parent)));
        }
        return;
    }
    let loading = LOADING.with(|l| l.take());
    let drops: Vec<PartKey> = DROPS.with(|d| {
        let mut d = d.borrow_mut();
        let (gone, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut *d).into_iter().partition(|e| e.0 >= sub);
        *d = keep;
        gone.into_iter().map(|e| e.1).collect()
    });
    let holds = HOLDS.with(|h| h.get());
    if holds || loading.is_some() || !drops.is_empty() {
        deferred::finish::<OffsetEnds>(Deferred::SubAbort { sub, holds, loading, drops });
    }
}
