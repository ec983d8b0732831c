//! Lane state without row versions: the shared-memory side of `queen_core::lanes`.
//!
//! With `shared_preload_libraries = 'queen'`, a lane's cursor, retry budget and lease live
//! in the registry (`queen_core::lanes`), so pops and acks write no row version that a
//! long transaction could pin:
//!
//! - a pop locks the lanes it claims in the registry and sets their lease: it writes
//!   nothing to the database;
//! - an ack changes the cursor in the registry and appends the new cursor and retry count
//!   to the lane journal (`queen.lane_journal_0` / `_1`), in its own transaction;
//! - every couple of seconds the background worker empties the journal table no ack
//!   writes to any more, with TRUNCATE (which a long transaction does not hold back),
//!   after copying into `queen.lanes` each lane's newest entry in it, unless the other
//!   table holds one at least as new (`rotate_journal`): a lane acked all the time gets
//!   no row version, one that goes quiet gets one;
//! - a clean stop of the worker copies the whole journal into `queen.lanes`.
//!
//! After a crash the registry is rebuilt, lane by lane on first use, from `queen.lanes`
//! and the newest journal entry: every committed ack is there. Leases are not: their
//! messages are delivered again (at-least-once delivery allows it).
//!
//! A transaction that changes a lane holds it until it ends, like a row lock, and an abort
//! (of the transaction, or of the subtransaction that changed it) puts back the state it
//! found. Another pop skips a held lane; another ack or extension waits for the holder's
//! transaction (PostgreSQL's deadlock detector sees that wait).
//!
//! Without preloading there is no registry and `queen.lanes` / `queen.leases` hold
//! everything, as before (see `pop`, `ack`, `leases`).

use std::cell::{Cell, RefCell};
use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::PgSqlErrorCode;
use queen_core::lanes::{
    group_digest, Busy, CursorSlot, Header, Holder, LaneKey, LaneSlot, Layout, LeaseInfo, LeaseSlot, Load, Registry,
    Seen, State, View,
};

use queen_core::fail;
use queen_core::lane::lease_live;

use crate::pg::deferred;
use crate::pg::errors::{self, SpiExt};
use crate::pg::locks::LoadLock;
use crate::pg::settings;
use crate::pg::shmem::{owner, subxact, Parts, Region};
use crate::pg::spi::run;

pub const TRANCHE: &CStr = c"queen lanes";

static mut SHARED: Option<Region<Layout>> = None;

/// One lane this transaction holds or changed, for the end of the transaction.
struct Held {
    key: LaneKey,
    /// The subtransaction that saved `found`.
    subxact: u32,
    /// The state before this subtransaction's first change: restored on abort.
    found: State,
    /// This entry took the lock (its abort releases it).
    locked: bool,
    /// The queue and group of `found`'s lease, to recreate it if an aborted ack ended it.
    lease: Option<(i64, String)>,
}

thread_local! {
    static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
    /// The journal table this transaction wrote to, if any.
    static WROTE: Cell<Option<usize>> = const { Cell::new(None) };
    static LOADING: Cell<Option<LaneKey>> = const { Cell::new(None) };
    /// (The worker) queen.leases holds nothing from a version without the registry.
    static OLD_LEASES_GONE: Cell<bool> = const { Cell::new(false) };
    /// Lanes this transaction removed (`drop_group`), with the subtransaction that did:
    /// the registry forgets them when it commits.
    static FORGET: RefCell<Vec<(u32, LaneKey)>> = const { RefCell::new(Vec::new()) };
    /// The groups this transaction dropped (queue id, name), with the subtransaction that did.
    static DROPPED: RefCell<Vec<(u32, (i64, String))>> = const { RefCell::new(Vec::new()) };
    /// Lanes this transaction created (their rows are its own inserts), with the
    /// subtransaction that did: the registry forgets them if it rolls back.
    static CREATED: RefCell<Vec<(u32, LaneKey)>> = const { RefCell::new(Vec::new()) };
}

/// The registry forgets these lanes if, and when, the current transaction commits (their
/// rows are deleted in it; until then the lanes stay, locked by it).
pub fn forget_on_commit(keys: Vec<LaneKey>) {
    if !enabled() {
        return;
    }
    let sub = subxact();
    FORGET.with(|f| f.borrow_mut().extend(keys.into_iter().map(|k| (sub, k))));
}

/// `drop_group` of group `group` of queue `queue_id`: its lanes are forgotten when the
/// transaction commits (`forget_on_commit`), and until then the group may not be created
/// again (`dropped_here`; without the registry too, so that both behave alike).
pub fn drop_group_on_commit(queue_id: i64, group: &str, partitions: &[pgrx::Uuid]) {
    DROPPED.with(|d| d.borrow_mut().push((subxact(), (queue_id, group.to_string()))));
    forget_on_commit(partitions.iter().map(|p| key(*p, group)).collect());
}

/// Whether this transaction dropped group `group` of queue `queue_id`: the registry keeps
/// the dropped lanes' state until the drop commits, so a group created again under the
/// name before that would start from the old cursors (`lookup::ensure_group` refuses).
pub fn dropped_here(queue_id: i64, group: &str) -> bool {
    DROPPED.with(|d| d.borrow().iter().any(|(_, (q, g))| *q == queue_id && g == group))
}

/// The registry forgets these lanes if the current transaction (or the subtransaction that
/// created them) rolls back: their rows are this transaction's inserts, and a lane loaded
/// from them meanwhile (a pop, a `status` in it) must not outlive them, or a group created
/// again under the name would start from their cursor rather than its own.
pub fn forget_on_abort(partitions: &[pgrx::Uuid], group: &str) {
    if !enabled() || partitions.is_empty() {
        return;
    }
    let sub = subxact();
    CREATED.with(|c| c.borrow_mut().extend(partitions.iter().map(|p| (sub, key(*p, group)))));
}

fn layout() -> Layout {
    let (lanes, leases) = settings::lane_registry_sizes();
    Layout::new(lanes, leases)
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
    // SAFETY: the tranche was requested in the shmem request hook; `base` points at
    // shmem_size() bytes laid out by `layout`, fresh when !found; the caller holds
    // AddinShmemInitLock, and SHARED is written here once per process, before any query.
    unsafe {
        let lock = &raw mut (*pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr())).lock;
        let region = Region::new(lock, base, layout);
        if !found {
            let (h, lanes, leases, cursors) = region.parts_for_format();
            let (tracked, max_leases) = settings::lane_registry_sizes();
            Registry::format(h, lanes, leases, cursors, tracked, max_leases);
        }
        SHARED = Some(region);
    }
}

/// The registry's parts inside its block of shared memory: the header, the lane slots,
/// the lease slots and the round-robin cursors.
impl Parts for Layout {
    type Mut<'a> = (&'a mut Header, &'a mut [LaneSlot], &'a mut [LeaseSlot], &'a mut [CursorSlot]);
    type Ref<'a> = (&'a Header, &'a [LaneSlot], &'a [LeaseSlot], &'a [CursorSlot]);

    unsafe fn parts_mut<'a>(self, base: *mut u8) -> Self::Mut<'a> {
        let l = self;
        // SAFETY: as the trait requires of the caller; every part lies inside the block
        // Layout sized, 8-byte aligned, disjoint.
        unsafe {
            (
                &mut *(base as *mut Header),
                std::slice::from_raw_parts_mut(base.add(l.lanes_at()) as *mut LaneSlot, l.lanes),
                std::slice::from_raw_parts_mut(base.add(l.leases_at()) as *mut LeaseSlot, l.leases),
                std::slice::from_raw_parts_mut(base.add(l.cursors_at()) as *mut CursorSlot, l.cursors),
            )
        }
    }

    unsafe fn parts_ref<'a>(self, base: *const u8) -> Self::Ref<'a> {
        let l = self;
        // SAFETY: as `parts_mut`; nothing here writes.
        unsafe {
            (
                &*(base as *const Header),
                std::slice::from_raw_parts(base.add(l.lanes_at()) as *const LaneSlot, l.lanes),
                std::slice::from_raw_parts(base.add(l.leases_at()) as *const LeaseSlot, l.leases),
                std::slice::from_raw_parts(base.add(l.cursors_at()) as *const CursorSlot, l.cursors),
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
    unsafe { (*std::ptr::addr_of!(SHARED)).as_ref().expect("queen lanes: shared memory not set up") }
}

/// Runs `f` on the registry under its lock, held exclusively. A panic in `f` leaves the
/// registry as it was (`Registry` puts back what it wrote) and releases the lock. What an
/// earlier transaction end of this backend could not do is done first, in both
/// registries (`deferred::settle_all`): a session's next queen call, whatever
/// it is, does what it left.
fn with_registry<R>(f: impl FnOnce(&mut Registry<'_>) -> R) -> R {
    deferred::settle::<LaneEnds>();
    deferred::settle_all();
    registry_op(f)
}

fn registry_op<R>(f: impl FnOnce(&mut Registry<'_>) -> R) -> R {
    // `f` is pure Rust that raises no ERROR (a panic unwinds, and the lock goes).
    shared().exclusive(|(h, lanes, leases, cursors)| f(&mut Registry::new(h, lanes, leases, cursors)))
}

fn with_view<R>(f: impl FnOnce(&View<'_>) -> R) -> R {
    deferred::settle::<LaneEnds>();
    shared().share(|(h, lanes, leases, cursors)| f(&View::new(h, lanes, leases, cursors)))
}

fn me() -> Holder {
    // SAFETY: MyProc is this backend's PGPROC, set for every backend.
    let (backend, lxid) = unsafe { ((*pg_sys::MyProc).backendId, (*pg_sys::MyProc).lxid) };
    Holder { owner: owner(), vxid_backend: backend, vxid_local: lxid }
}

fn full(what: &str) -> ! {
    errors::raise(
        PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        format!("queen: {what}; raise it in postgresql.conf (takes a restart)"),
    )
}

/// The key of a lane of the current database.
pub fn key(partition_id: pgrx::Uuid, group: &str) -> LaneKey {
    LaneKey::new(crate::pg::dbs::my_database(), *partition_id.as_bytes(), group)
}

/// A lane's state as this transaction sees it (loading it first if needed), and whether
/// another transaction holds it. A lane that does not exist (no row: its group was
/// dropped) reads as held, with no lease: nothing may claim it.
pub fn view(partition_id: pgrx::Uuid, group: &str) -> (State, bool) {
    let k = key(partition_id, group);
    let mine = owner();
    loop {
        match with_view(|v| v.lane(&k)) {
            Seen::Ready(s, h) => return (s, h.is_some_and(|h| h.owner != mine)),
            Seen::Loading => wait_for_load(partition_id, group),
            Seen::Unknown => {
                if !load(partition_id, group) {
                    return (State::default(), true);
                }
            }
        }
    }
}

/// Whether lane `key` may be under a live lease at `now`, read without loading it and
/// without settling this backend's deferred ends (it runs under the rate-limit buckets'
/// lock, `lane::limits`): a live lease, a transaction holding its lock (a claim or an ack
/// in progress), or a load in progress. A lane not in the registry holds no lease: one
/// with a live lease is never evicted.
pub fn maybe_in_flight(key: &LaneKey, now: i64) -> bool {
    shared().share(|(h, lanes, leases, cursors)| match View::new(h, lanes, leases, cursors).lane(key) {
        Seen::Ready(s, holder) => s.live_lease(now) || holder.is_some(),
        Seen::Loading => true,
        Seen::Unknown => false,
    })
}

/// A lane's last committed state (or this transaction's own change), for a reader that
/// acts on it without locking the lane: retention's floor, `status`, `totals`, `metrics`.
/// A change another transaction has not committed is not seen (it may roll back). A lane
/// that does not exist reads as the default state.
pub fn lane_committed(partition_id: pgrx::Uuid, group: &str) -> State {
    let k = key(partition_id, group);
    let mine = owner();
    loop {
        match with_view(|v| v.committed(&k, mine)) {
            Seen::Ready(s, _) => return s,
            Seen::Loading => wait_for_load(partition_id, group),
            Seen::Unknown => {
                if !load(partition_id, group) {
                    return State::default();
                }
            }
        }
    }
}

/// A lease of the current database: its queue, group and lanes, if some lane still holds it
/// (or a transaction ended it on a lane without committing yet: `View::lease`).
pub fn lease(lease_id: pgrx::Uuid) -> Option<LeaseInfo> {
    let db = crate::pg::dbs::my_database();
    if let Some(info) = with_view(|v| v.lease(lease_id.as_bytes(), db)) {
        return Some(info);
    }
    // A lease taken by a version without the registry (before an upgrade) is in
    // queen.leases, and its lanes' rows carry it: loading them takes it over while live.
    let (group, pids) = Spi::connect_mut(|client| {
        let rows = run(
            client,
            "SELECT consumer_group, partition_ids FROM queen.leases WHERE lease_id = $1 AND expires_at > clock_timestamp()",
            &[lease_id.into()],
        );
        let r = rows.into_iter().next()?;
        let group: String = r.get(1).or_raise()?;
        let pids: Vec<pgrx::Uuid> = r.get(2).or_raise()?;
        Some((group, pids))
    })?;
    for pid in pids {
        view(pid, &group);
    }
    with_view(|v| v.lease(lease_id.as_bytes(), db))
}

/// Another backend is loading a lane: wait for its load (`LoadLock::wait`).
fn wait_for_load(partition_id: pgrx::Uuid, group: &str) {
    LoadLock::lane(partition_id, group).wait();
}

/// Brings a lane into the registry from the database: `queen.lanes`, and the newest
/// journal entry, if one is newer. False when the lane has no row (it never existed, or
/// its group was dropped): then nothing is loaded.
fn load(partition_id: pgrx::Uuid, group: &str) -> bool {
    let k = key(partition_id, group);
    let me = owner();
    LoadLock::lane(partition_id, group).holding(|| {
        match with_registry(|r| r.begin_load(&k, me, crate::pg::clock::clock_now())) {
            Load::Ready => true,
            // A load another backend abandoned, its end deferred (`LoadLock::wait`).
            Load::Loading => {
                wait_for_load(partition_id, group);
                true
            }
            Load::Full => full("every tracked lane is in use (queen.tracked_lanes)"),
            Load::Mine => {
                LOADING.with(|l| l.set(Some(k)));
                let Some((state, queue_id)) = Spi::connect_mut(|client| stored(client, partition_id, group)) else {
                    with_registry(|r| r.abandon_load(&k, me));
                    LOADING.with(|l| l.set(None));
                    return false;
                };
                let now = crate::pg::clock::clock_now();
                with_registry(|r| r.finish_load(&k, me, state, Some((queue_id, group)), now));
                LOADING.with(|l| l.set(None));
                true
            }
        }
    })
}

/// Without the registry, on a standby (`shmem::in_recovery`) of a primary that had it: the
/// lane's stored state with the journal's newest entry (`stored`), since the primary's acks
/// reach `queen.lanes` only when its worker saves the journal. None on a primary (its acks
/// without the registry update the row, which the caller has; a journal a crash left
/// behind goes into the rows first, `lane::settle_journal`) or for a lane with no row.
/// The journal tables' locks are taken without waiting: replay holds a TRUNCATE's lock
/// until its commit is replayed (for as long as `recovery_min_apply_delay`, or a paused
/// replay, says), and a read then shows the row's cursor rather than wait.
fn journaled(partition_id: pgrx::Uuid, group: &str) -> Option<State> {
    if !crate::pg::shmem::in_recovery() {
        return None;
    }
    let _journal = JournalLocks::try_take()?;
    Spi::connect_mut(|client| stored(client, partition_id, group)).map(|(state, _)| state)
}

/// A lane's stored state: its cursor, retry count and journal number (from `queen.lanes`,
/// or the newest journal entry when it is newer), the lease the row still carries from a
/// version without the registry (taken over if live), and the lane's queue.
fn stored(client: &mut SpiClient<'_>, partition_id: pgrx::Uuid, group: &str) -> Option<(State, i64)> {
    // The journal tables' locks are this read's only: they are released right after it
    // (`JournalLocks`), so a transaction that loaded a lane (any pop after a restart, a
    // `status`) and stays open does not keep the worker from emptying the journal.
    let _journal = JournalLocks::take();
    // With a snapshot taken now: a REPEATABLE READ transaction's own may predate acks.
    let row = crate::pg::spi::first_row_now(
        client,
        "SELECT l.queue_id, l.lease_id,
                (extract(epoch FROM l.lease_expires_at - '2000-01-01 UTC') * 1000000)::int8,
                l.batch_end, l.claim_start, l.attempt_count, j.committed, j.retry_count, j.seq
           FROM queen.lanes l
          CROSS JOIN LATERAL (
             SELECT x.committed, x.retry_count, x.seq FROM (
               SELECT l.committed, l.batch_retry_count AS retry_count, l.journal_seq AS seq, 0 AS src
               UNION ALL
               (SELECT committed, retry_count, seq, 1 FROM queen.lane_journal_0
                 WHERE partition_id = $1 AND consumer_group = $2 ORDER BY seq DESC LIMIT 1)
               UNION ALL
               (SELECT committed, retry_count, seq, 1 FROM queen.lane_journal_1
                 WHERE partition_id = $1 AND consumer_group = $2 ORDER BY seq DESC LIMIT 1)
             ) x ORDER BY x.seq DESC, x.src LIMIT 1) j
          WHERE l.partition_id = $1 AND l.consumer_group = $2",
        &[partition_id.into(), group.into()],
        |r| {
            let lease: Option<pgrx::Uuid> = r.get(2);
            let state = State {
                committed: r.get(7).unwrap_or(0),
                retry_count: r.get(8).unwrap_or(0),
                journal_seq: r.get(9).unwrap_or(0),
                lease_id: lease.map_or([0; 16], |l| *l.as_bytes()),
                lease_expires: r.get(3).unwrap_or(0),
                batch_end: r.get(4).unwrap_or(0),
                claim_start: r.get(5).unwrap_or(0),
                attempt_count: r.get(6).unwrap_or(0),
                last_claimed: 0,
            };
            (state, r.get(1).unwrap_or(0))
        },
    );
    row
}

/// The two journal tables and their indexes, share-locked for one read and released after
/// it, unless this transaction held them before (then it keeps them: a lock it took for
/// another reason is not this read's to drop).
///
/// Taken before the read, the locks make a rotation that empties a journal table (it
/// copies the table's entries into `queen.lanes`, then TRUNCATEs it, under an exclusive
/// lock) either finish before the read, which then sees its copies, or wait until the
/// read is over.
struct JournalLocks {
    tables: Vec<pg_sys::Oid>,
}

impl JournalLocks {
    fn take() -> JournalLocks {
        Self::lock(true).expect("a waiting lock is always taken")
    }

    /// As `take`, without waiting: None (and nothing held) when a lock is not free now.
    fn try_take() -> Option<JournalLocks> {
        Self::lock(false)
    }

    fn lock(wait: bool) -> Option<JournalLocks> {
        let mut locks = JournalLocks { tables: Vec::new() };
        // The tables and the primary-key indexes the read scans: a TRUNCATE needs both.
        for name in [c"lane_journal_0", c"lane_journal_1", c"lane_journal_0_pkey", c"lane_journal_1_pkey"] {
            let oid = crate::pg::catalog::queen_table(name);
            // SAFETY: lock-manager calls on an existing relation's OID, in a transaction.
            unsafe {
                if oid == pg_sys::InvalidOid
                    || pg_sys::CheckRelationOidLockedByMe(oid, pg_sys::AccessShareLock as i32, true)
                {
                    continue;
                }
                if wait {
                    pg_sys::LockRelationOid(oid, pg_sys::AccessShareLock as i32);
                } else if !pg_sys::ConditionalLockRelationOid(oid, pg_sys::AccessShareLock as i32) {
                    return None; // `locks` drops: what it took is released
                }
            }
            locks.tables.push(oid);
        }
        Some(locks)
    }
}

impl Drop for JournalLocks {
    fn drop(&mut self) {
        for &oid in &self.tables {
            // Every share lock this read took (the statement's own, and the one above),
            // all under this resource owner; bounded, in case one is not ours to release.
            for _ in 0..8 {
                // SAFETY: as in `take`; releasing AccessShareLock counts this transaction
                // took on the relation during the read.
                unsafe {
                    if !pg_sys::CheckRelationOidLockedByMe(oid, pg_sys::AccessShareLock as i32, false) {
                        break;
                    }
                    pg_sys::UnlockRelationOid(oid, pg_sys::AccessShareLock as i32);
                }
            }
        }
    }
}

/// Locks a lane for this transaction; `wait`: wait for another holder (else None when
/// held). Returns the state this transaction sees.
pub fn lock(partition_id: pgrx::Uuid, group: &str, wait: bool) -> Option<State> {
    let k = key(partition_id, group);
    let holder = me();
    let sub = subxact();
    // The holder last waited for: if it still holds the lane once its transaction has
    // ended (its end deferred until its session's next call), wait a little each round
    // instead of spinning.
    let mut waited: Option<(i32, u32)> = None;
    loop {
        let locked = with_registry(|r| {
            r.lock(&k, holder).map(|(s, took)| (s, took, s.has_lease().then(|| r.lease_queue(&s.lease_id)).flatten()))
        });
        match locked {
            Ok((s, took, queue)) => {
                remember(k, sub, s, took, queue.map(|q| (q, group.to_string())));
                return Some(s);
            }
            Err(Busy::Unknown) => {
                if !load(partition_id, group) {
                    return None; // no such lane (its group was dropped)
                }
            }
            Err(Busy::Loading) => wait_for_load(partition_id, group),
            Err(Busy::Held(_)) if !wait => return None,
            Err(Busy::Held(h)) if waited == Some((h.vxid_backend, h.vxid_local)) => {
                // SAFETY: a plain sleep (10 ms); interrupts are checked right after.
                unsafe { pg_sys::pg_usleep(10_000) };
                pgrx::check_for_interrupts!();
            }
            Err(Busy::Held(h)) => {
                waited = Some((h.vxid_backend, h.vxid_local));
                let vxid = pg_sys::VirtualTransactionId { backendId: h.vxid_backend, localTransactionId: h.vxid_local };
                // SAFETY: waits, in the lock manager (so deadlocks are detected), for that
                // virtual transaction to end; returns at once if it already has.
                unsafe { pg_sys::VirtualXactLock(vxid, true) };
                pgrx::check_for_interrupts!();
            }
        }
    }
}

/// Keeps what an abort of the current subtransaction must restore.
fn remember(k: LaneKey, sub: u32, found: State, locked: bool, lease: Option<(i64, String)>) {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if locked || !h.iter().any(|e| e.key == k && e.subxact == sub) {
            h.push(Held { key: k, subxact: sub, found, locked, lease });
        }
    });
}

impl Held {
    fn lease(&self) -> Option<(i64, &str)> {
        self.lease.as_ref().map(|(q, g)| (*q, g.as_str()))
    }
}

/// Sets the state of a lane this transaction holds. `lease`: the queue and group of a new
/// lease. A change of cursor or retry count takes `journal_seq + 1` (see `journal`).
pub fn set(partition_id: pgrx::Uuid, group: &str, state: State, lease: Option<(i64, &str)>) {
    let k = key(partition_id, group);
    let (mine, now) = (owner(), crate::pg::clock::clock_now());
    if !with_registry(|r| r.set(&k, mine, state, lease, now)) {
        full("every lease slot holds a live lease (queen.max_leases)");
    }
}

/// The journal table an ack of this transaction appends to (counted as a writer until the
/// transaction ends, so that the worker does not empty it under the ack).
pub fn journal_table() -> usize {
    if let Some(t) = WROTE.with(|w| w.get()) {
        return t;
    }
    let t = crate::pg::dbs::mine(|d| {
        let t = (d.journal.current % 2) as usize;
        d.journal.writers[t] += 1;
        t
    });
    WROTE.with(|w| w.set(Some(t)));
    t
}

/// Appends lanes' new cursors and retry counts to the journal (directly, or in one
/// statement when the table is not one `heap::insert_rows` can write).
pub fn journal(client: &mut SpiClient<'_>, group: &str, rows: &[(pgrx::Uuid, State)]) {
    if rows.is_empty() {
        return;
    }
    let table = journal_table();
    // Directly (`heap`): an INSERT through SPI cost a fifth of an ack of one message.
    let group_datum = group.into_datum().expect("text is never NULL");
    let direct = rows.iter().map(|(pid, s)| {
        [
            pid.into_datum().expect("a uuid is never NULL"),
            group_datum,
            pg_sys::Datum::from(s.journal_seq),
            pg_sys::Datum::from(s.committed),
            pg_sys::Datum::from(s.retry_count),
        ]
    });
    let relid = crate::pg::catalog::queen_table(if table == 0 { c"lane_journal_0" } else { c"lane_journal_1" });
    let types = [pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::INT8OID, pg_sys::INT8OID, pg_sys::INT4OID];
    if crate::pg::heap::insert_rows(relid, pg_sys::InvalidOid, types, direct) {
        return;
    }
    let pids: Vec<pgrx::Uuid> = rows.iter().map(|r| r.0).collect();
    let seqs: Vec<i64> = rows.iter().map(|r| r.1.journal_seq).collect();
    let committed: Vec<i64> = rows.iter().map(|r| r.1.committed).collect();
    let retries: Vec<i32> = rows.iter().map(|r| r.1.retry_count).collect();
    let args = [pids.into(), group.into(), seqs.into(), committed.into(), retries.into()];
    if table == 0 {
        run(
            client,
            "INSERT INTO queen.lane_journal_0 (partition_id, consumer_group, seq, committed, retry_count)
             SELECT u.p, $2, u.s, u.c, u.r FROM unnest($1::uuid[], $3::int8[], $4::int8[], $5::int4[]) AS u(p, s, c, r)",
            &args,
        );
    } else {
        run(
            client,
            "INSERT INTO queen.lane_journal_1 (partition_id, consumer_group, seq, committed, retry_count)
             SELECT u.p, $2, u.s, u.c, u.r FROM unnest($1::uuid[], $3::int8[], $4::int8[], $5::int4[]) AS u(p, s, c, r)",
            &args,
        );
    }
}

// ---- the end of a transaction ----

/// This transaction holds lanes in the registry or wrote to the journal: it cannot be
/// prepared (a prepared transaction has no backend left to release them).
pub fn in_use() -> bool {
    HELD.with(|h| !h.borrow().is_empty()) || WROTE.with(|w| w.get().is_some())
}

/// Work a transaction's end, or a subtransaction's abort, leaves to the registry.
enum Deferred {
    /// A transaction ended: its lanes are released (commit) or put back (abort), a load it
    /// did not finish is dropped, then `forget` goes: the lanes it deleted (commit), or
    /// those it created (abort).
    End { committed: bool, held: Vec<Held>, loading: Option<LaneKey>, forget: Vec<LaneKey> },
    /// A subtransaction aborted: what it changed is put back, the locks it took go, and
    /// the lanes it created are forgotten.
    SubAbort { undo: Vec<Held>, loading: Option<LaneKey>, forget: Vec<LaneKey> },
}

/// The registry's deferred ends (`deferred`): applied at once when they can be, else kept
/// and done before this backend's next use of a registry.
struct LaneEnds;

impl deferred::Registry for LaneEnds {
    type End = Deferred;
    const NAME: &'static str = "lane";
    const LOST_AT_EXIT: &'static str = "lanes this session held stay locked";
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
    let (mine, now) = (owner(), crate::pg::clock::clock_now());
    registry_op(|r| match d {
        Deferred::End { committed, held, loading, forget } => {
            fail::point(if *committed { "xact.commit.lanes" } else { "xact.abort.lanes" });
            // Newest first, so that an older save of the same lane is restored last.
            for e in held.iter().rev().filter(|e| e.locked) {
                if *committed {
                    r.unlock(&e.key, mine, None);
                } else {
                    r.unlock_restoring(&e.key, mine, e.found, e.lease(), now);
                }
            }
            if let Some(k) = loading {
                r.abandon_load(k, mine);
            }
            r.forget(forget);
        }
        Deferred::SubAbort { undo, loading, forget } => {
            fail::point("xact.subabort.lanes");
            if let Some(k) = loading {
                r.abandon_load(k, mine);
            }
            for e in undo.iter().rev() {
                if e.locked {
                    r.unlock_restoring(&e.key, mine, e.found, e.lease(), now);
                } else {
                    // Locked by the parent: put back what this subtransaction found, keep the lock.
                    r.restore(&e.key, mine, e.found, e.lease(), now);
                }
            }
            r.forget(forget);
        }
    });
}

/// Commit: releases every lane this transaction holds. Abort: puts back what it found.
/// Raises nothing (see `deferred::finish`).
pub fn end(committed: bool) {
    let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    let wrote = WROTE.with(|w| w.take());
    let loading = LOADING.with(|l| l.take());
    let deleted: Vec<LaneKey> =
        FORGET.with(|f| std::mem::take(&mut *f.borrow_mut())).into_iter().map(|e| e.1).collect();
    let created: Vec<LaneKey> =
        CREATED.with(|c| std::mem::take(&mut *c.borrow_mut())).into_iter().map(|e| e.1).collect();
    DROPPED.with(|d| d.borrow_mut().clear());
    if !enabled() {
        return;
    }
    let forget = if committed { deleted } else { created };
    if let Some(t) = wrote {
        let db = crate::pg::dbs::my_database();
        crate::pg::dbs::with(db, false, |d| d.journal.writers[t] = d.journal.writers[t].saturating_sub(1));
    }
    if held.is_empty() && loading.is_none() && forget.is_empty() {
        return;
    }
    deferred::finish::<LaneEnds>(Deferred::End { committed, held, loading, forget });
}

/// Hands the entries of subtransaction `sub` (and those inside it) to `parent`.
fn to_parent<T>(list: &mut [(u32, T)], sub: u32, parent: u32) {
    list.iter_mut().filter(|e| e.0 >= sub).for_each(|e| e.0 = parent);
}

/// The transaction was prepared (holding no lane: `in_use`). The lanes it created or
/// deleted are forgotten now, whichever way it ends later: a lane is loaded again from
/// what is committed, and one it loaded from its own rows must not outlive a rollback.
/// Raises nothing (see `deferred::finish`).
pub fn prepared() {
    let mut forget: Vec<LaneKey> =
        FORGET.with(|f| std::mem::take(&mut *f.borrow_mut())).into_iter().map(|e| e.1).collect();
    forget.extend(CREATED.with(|c| std::mem::take(&mut *c.borrow_mut())).into_iter().map(|e| e.1));
    DROPPED.with(|d| d.borrow_mut().clear());
    if !enabled() || forget.is_empty() {
        return;
    }
    deferred::finish::<LaneEnds>(Deferred::End { committed: false, held: Vec::new(), loading: None, forget });
}

/// A subtransaction ended: a commit hands what it holds to its parent; an abort puts back
/// what it changed and releases the locks it took. Raises nothing (see `deferred::finish`).
pub fn end_subxact(sub: u32, parent: u32, committed: bool) {
    DROPPED.with(|d| {
        let mut d = d.borrow_mut();
        if committed {
            to_parent(&mut d, sub, parent);
        } else {
            d.retain(|e| e.0 < sub);
        }
    });
    if !enabled() {
        return;
    }
    let loading = if committed { None } else { LOADING.with(|l| l.take()) };
    // A commit hands what the subtransaction did to its parent; an abort undoes it: the
    // lanes it deleted are not to be forgotten, those it created are, now.
    let forget: Vec<LaneKey> = if committed {
        FORGET.with(|f| to_parent(&mut f.borrow_mut(), sub, parent));
        CREATED.with(|c| to_parent(&mut c.borrow_mut(), sub, parent));
        Vec::new()
    } else {
        FORGET.with(|f| f.borrow_mut().retain(|e| e.0 < sub));
        CREATED.with(|c| {
            let (gone, keep) = std::mem::take(&mut *c.borrow_mut()).into_iter().partition(|e| e.0 >= sub);
            *c.borrow_mut() = keep;
            gone.into_iter().map(|e: (u32, LaneKey)| e.1).collect()
        })
    };
    let undo: Vec<Held> = HELD.with(|h| {
        let mut h = h.borrow_mut();
        if committed {
            for e in h.iter_mut().filter(|e| e.subxact >= sub) {
                e.subxact = parent;
            }
            Vec::new()
        } else {
            let (undo, keep): (Vec<Held>, Vec<Held>) =
                std::mem::take(&mut *h).into_iter().partition(|e| e.subxact >= sub);
            *h = keep;
            undo
        }
    });
    if undo.is_empty() && loading.is_none() && forget.is_empty() {
        return;
    }
    deferred::finish::<LaneEnds>(Deferred::SubAbort { undo, loading, forget });
}

// ---- emptying the journal (the background worker; a clean stop saves it whole with
// `rows::save_journal`) ----

/// What a round of the journal's rotation did, for `rotated` once its transaction commits.
#[derive(Default)]
pub struct Rotation {
    /// The retired table was emptied.
    emptied: bool,
}

/// One round of the journal's rotation (in the worker's transaction): when the idle table
/// is empty, make it current; once no ack writes to the retired one any more, empty it
/// (`queen._empty_journal`: it copies each lane's newest entry into `queen.lanes` first,
/// unless the current table holds one at least as new, then TRUNCATEs; without waiting for
/// a lock: else next round). Everything the journal held is thus in `queen.lanes` or in
/// the current table, whatever the registry knows (after a restart it knows nothing), so
/// a lane acked all the time never updates its row, and one that goes quiet does once.
pub fn rotate_journal(client: &mut SpiClient<'_>) -> Rotation {
    // Leases a version without the registry left in queen.leases: gone once expired (the
    // registry never writes there), then not looked at again.
    if !OLD_LEASES_GONE.with(|g| g.get()) {
        let left = run(
            client,
            "WITH d AS (DELETE FROM queen.leases WHERE expires_at <= clock_timestamp() RETURNING 1)
             SELECT (SELECT count(*) FROM queen.leases) - (SELECT count(*) FROM d)",
            &[],
        );
        OLD_LEASES_GONE.with(|g| g.set(crate::pg::spi::first_value::<i64>(left) == Some(0)));
    }
    // This database's journal: a fresh slot starts with table 0 current and 1 not emptied
    // (it may hold entries from before a restart), so the first round empties table 1.
    let (retired, writers, other_empty) = crate::pg::dbs::mine(|d| {
        let retired = ((d.journal.current + 1) % 2) as usize;
        (retired, d.journal.writers[retired], d.journal.other_empty)
    });
    if other_empty == 1 {
        crate::pg::dbs::mine(|d| {
            d.journal.current += 1;
            d.journal.other_empty = 0;
        });
        return Rotation::default(); // the table just retired may still have writers: next round
    }
    // Nor while a pg_dump reads the database: its snapshot could miss both the entries and
    // the rows they were saved into (cursors a few seconds old in the dump).
    if writers > 0 || crate::pg::dbs::dump_running(client) {
        return Rotation::default();
    }
    let emptied = run(client, "SELECT queen._empty_journal($1)", &[(retired as i32).into()]);
    Rotation { emptied: crate::pg::spi::first_value::<bool>(emptied).unwrap_or(false) }
}

/// After the rotation round's transaction committed: the emptied table may become current
/// next round.
pub fn rotated(done: Rotation) {
    if done.emptied {
        crate::pg::dbs::mine(|d| d.journal.other_empty = 1);
    }
}

// ---- SQL helpers (internal, not granted) ----

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._lane(uuid, text, bigint, uuid, timestamptz, bigint, int, int) IS
  'queen internal: a lane''s last committed state (status, totals, metrics); not granted';
"#,
    name = "lane_state_home",
    requires = [lane_state]
);

/// `queen._lane(...)`: a lane's state for `status`, `totals` and `metrics`: with the
/// registry its last committed state (a change another transaction has in flight is not
/// shown: it may roll back), or this transaction's own; without, the row's own columns
/// (passed in). A lease expiry without a lease is a retry backoff (`queen_core::lane`):
/// returned as `retry_at`. `leased` is `queen_core::lane::lease_live` at the clock: the
/// one test of a live lease that `status`, `totals` and `metrics` use.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
#[pg_extern(name = "_lane", volatile, parallel_unsafe)]
fn lane_state(
    partition_id: pgrx::Uuid,
    consumer_group: &str,
    committed: i64,
    lease_id: Option<pgrx::Uuid>,
    lease_expires_at: Option<pgrx::datum::TimestampWithTimeZone>,
    batch_end: Option<i64>,
    retry_count: i32,
    attempt_count: i32,
) -> TableIterator<
    'static,
    (
        name!(committed, i64),
        name!(lease_id, Option<pgrx::Uuid>),
        name!(lease_expires_at, Option<pgrx::datum::TimestampWithTimeZone>),
        name!(batch_end, Option<i64>),
        name!(retry_count, i32),
        name!(attempt_count, i32),
        name!(retry_at, Option<pgrx::datum::TimestampWithTimeZone>),
        name!(leased, bool),
    ),
> {
    let now = crate::pg::clock::clock_now();
    if !enabled() {
        let (committed, retry_count) = match journaled(partition_id, consumer_group) {
            Some(s) => (s.committed, s.retry_count),
            None => (committed, retry_count),
        };
        let (expires, retry_at) = if lease_id.is_some() { (lease_expires_at, None) } else { (None, lease_expires_at) };
        let leased = lease_live(expires.map(pg_sys::TimestampTz::from), now);
        return TableIterator::once((
            committed,
            lease_id,
            expires,
            batch_end,
            retry_count,
            attempt_count,
            retry_at,
            leased,
        ));
    }
    let s = lane_committed(partition_id, consumer_group);
    let lane = queen_core::lane::Lane::from_registry(&s);
    let lease = lane.lease.map(|_| pgrx::Uuid::from_bytes(s.lease_id));
    TableIterator::once((
        s.committed,
        lease,
        lane.lease.map(|(_, expires)| crate::pg::clock::timestamptz(expires)),
        lease.map(|_| s.batch_end),
        s.retry_count,
        s.attempt_count,
        lane.retry_at.map(crate::pg::clock::timestamptz),
        lease_live(lane.lease.map(|(_, expires)| expires), now),
    ))
}

crate::pg::srf::older_sql_symbol!(
    pg_finfo_lane_sql_wrapper,
    lane_sql_wrapper,
    "The C symbol of `queen._lane` in 0.3.0's SQL (under `status`, `totals` and `metrics`), which declared one column less."
);

// ---- round-robin cursors, shared by every backend ----

/// The partition the last pop of (queue, group) in this database claimed, whichever
/// backend it ran in (None: not remembered, or no registry).
pub fn shared_cursor(queue_id: i64, group: &str) -> Option<pgrx::Uuid> {
    if !enabled() {
        return None;
    }
    let (db, g) = (crate::pg::dbs::my_database(), group_digest(group));
    with_view(|v| v.cursor(db, queue_id, &g)).map(pgrx::Uuid::from_bytes)
}

/// Remembers the partition a pop of (queue, group) claimed last, for every backend's
/// next pop. A hint: taken when the pop runs, whether or not it commits.
pub fn set_shared_cursor(queue_id: i64, group: &str, partition_id: pgrx::Uuid) {
    if enabled() {
        let (db, g) = (crate::pg::dbs::my_database(), group_digest(group));
        with_registry(|r| r.set_cursor(db, queue_id, &g, *partition_id.as_bytes()));
    }
}

/// Forgets the lanes of a database that no transaction holds, and their leases
/// (`lane::forget_registries` says when). Returns how many.
pub fn forget_database(database: u32) -> usize {
    if enabled() {
        registry_op(|r| r.forget_database(database))
    } else {
        0
    }
}

/// How many lanes of a database the registry holds (after `forget_database`: those a
/// transaction holds).
pub fn count_database(database: u32) -> usize {
    if enabled() {
        registry_op(|r| r.count_database(database))
    } else {
        0
    }
}

/// Ends a lease for good, on each lane it holds: the lane is locked by this transaction
/// (waiting for another that holds it, as an ack does), keeps its cursor and claim counters
/// and is claimable again, as after an expiry; with `expire_only` the lease stays and only
/// its expiry moves to the past (tests). Returns how many lanes it held.
pub fn revoke(lease_id: pgrx::Uuid, expire_only: bool) -> i64 {
    let now = crate::pg::clock::clock_now();
    let Some(info) = lease(lease_id) else { return 0 };
    if !crate::pg::locks::share_queue(info.queue_id) {
        return 0;
    }
    let mut pids: Vec<pgrx::Uuid> = info.lanes.iter().map(|k| pgrx::Uuid::from_bytes(k.partition)).collect();
    pids.sort_by_key(|p| *p.as_bytes());
    let mut n = 0;
    for pid in pids {
        let Some(s) = lock(pid, &info.group, true) else { continue };
        if !s.held_by(lease_id.as_bytes(), now) {
            continue;
        }
        let next = if expire_only {
            State { lease_expires: now - 1, ..s }
        } else {
            queen_core::lane::release(&queen_core::lane::Lane::from_registry(&s)).to_registry(&s)
        };
        set(pid, &info.group, next, None);
        n += 1;
    }
    n
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._expire_lease(uuid) IS
  'queen internal: end a lease now, as if it had expired (tests); not granted';
"#,
    name = "expire_lease_sql_home",
    requires = [expire_lease_sql]
);

/// `queen._expire_lease(lease_id)`: ends a lease now, as if it had expired. Returns how
/// many lanes it held.
#[pg_extern(name = "_expire_lease", volatile)]
#[search_path(pg_catalog, pg_temp)]
fn expire_lease_sql(lease_id: pgrx::Uuid) -> i64 {
    let now = crate::pg::clock::clock_now();
    if !enabled() {
        return Spi::connect_mut(|client| crate::lane::rows::expire_lease(client, lease_id, now));
    }
    revoke(lease_id, true)
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._claimable(uuid, text, bigint) IS
  'queen internal: a lane''s readable end when a pop may claim it (pop''s scan); not granted';
"#,
    name = "claimable_sql_home",
    requires = [claimable_sql]
);

/// `queen._claimable(partition_id, consumer_group, head)`: for a pop's scan of its lanes,
/// the partition's readable end when the lane can be claimed now (no live lease, no retry
/// backoff running, no other transaction holding it, messages past its cursor), else NULL.
/// A backoff's end is noted for a waiting pop (`wake::due_at`). `head` is ignored; it stays
/// so that the installed SQL signature does not change.
#[pg_extern(name = "_claimable", volatile, parallel_unsafe)]
fn claimable_sql(partition_id: pgrx::Uuid, consumer_group: &str, head: i64) -> Option<i64> {
    let _ = head; // ignored (see above)
    claimable(partition_id, consumer_group)
}

/// `queen._claimable` (above); a pop's scan of its lanes (`lane::claimable`) asks it
/// directly.
pub fn claimable(partition_id: pgrx::Uuid, consumer_group: &str) -> Option<i64> {
    let (s, held) = view(partition_id, consumer_group);
    let now = crate::pg::clock::clock_now();
    if held || s.live_lease(now) {
        return None;
    }
    let readable = crate::offsets::readable(partition_id);
    let lane = queen_core::lane::Lane::from_registry(&s);
    match lane.claimability(readable, now) {
        c if c.claimable() => Some(readable),
        queen_core::lane::Claimability::Backoff => {
            crate::pg::wake::due_at(lane.retry_at.unwrap_or(now));
            None
        }
        _ => None,
    }
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._committed(uuid, text, bigint) IS
  'queen internal: a lane''s last committed cursor (retention); not granted';
"#,
    name = "committed_sql_home",
    requires = [committed_sql]
);

/// `queen._committed(partition_id, consumer_group, committed)`: a lane's last committed
/// cursor (with the registry; else the row's, passed in). For retention's floor: an ack
/// that has not committed (it may roll back) never lets retention delete what it covers.
#[pg_extern(name = "_committed", volatile, parallel_unsafe)]
fn committed_sql(partition_id: pgrx::Uuid, consumer_group: &str, committed: i64) -> i64 {
    if !enabled() {
        return journaled(partition_id, consumer_group).map_or(committed, |s| s.committed);
    }
    lane_committed(partition_id, consumer_group).committed
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._delete_lanes(bigint) IS
  'queen internal: remove a queue''s lanes, from the table and the lane registry (delete_queue); not granted';
"#,
    name = "delete_lanes_home",
    requires = [delete_lanes]
);

/// `queen._delete_lanes(queue_id)`: `delete_queue` removes the queue's lanes: their rows
/// now, their registry slots when the transaction commits. The caller holds the queue lock
/// exclusively. Returns how many.
#[pg_extern(name = "_delete_lanes", volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn delete_lanes(queue_id: i64) -> i64 {
    Spi::connect_mut(|client| {
        let gone: Vec<(pgrx::Uuid, String)> = run(
            client,
            "DELETE FROM queen.lanes WHERE queue_id = $1 RETURNING partition_id, consumer_group",
            &[queue_id.into()],
        )
        .map(|r| (r.get(1).or_raise().unwrap(), r.get(2).or_raise().unwrap()))
        .collect();
        // The registry forgets them when, and if, this commits (a rolled-back
        // delete_queue leaves every lane and live lease as it was).
        forget_on_commit(gone.iter().map(|(p, g)| key(*p, g)).collect());
        gone.len() as i64
    })
}
