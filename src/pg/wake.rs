//! Long-poll wake-ups (`wait_ms`, docs/concepts.md "Long-poll").
//!
//! With `shared_preload_libraries = 'queen'`, shared memory (set up by `hooks`) holds a small array
//! of condition variables; a queue maps to one slot. A transaction that pushes to a queue,
//! or releases a lane of it, broadcasts that slot when it commits (after its rows are
//! visible and its offsets readable), so a waiting pop retries at once instead of on a
//! timer.
//!
//! Without preloading there is no shared memory: waiting pops poll every
//! `FALLBACK_POLL_MS` on their latch instead (documented in the README).

use std::cell::Cell;
use std::ptr;

use pgrx::pg_sys;

/// Condition-variable slots; queues share a slot when their ids collide.
const SLOTS: usize = 64;
/// A waiting pop re-checks at least this often even without a wake-up, so that a lease
/// expiring (which nobody signals) frees its lane for a waiter in bounded time.
pub const RECHECK_MS: i64 = 200;
/// Poll interval when the library is not preloaded.
pub const FALLBACK_POLL_MS: i64 = 20;

#[repr(C)]
struct WakeShmem {
    slots: [pg_sys::ConditionVariable; SLOTS],
}

static mut WAKE: *mut WakeShmem = ptr::null_mut();

thread_local! {
    /// Slots to broadcast when the current transaction commits (a bit per slot).
    static PENDING: Cell<u64> = const { Cell::new(0) };
    /// The earliest time a lane this backend's pop passed over becomes claimable without
    /// anybody signalling it (a retry backoff ending, or a delayed message becoming due):
    /// a waiting pop sleeps no longer.
    static DUE: Cell<Option<i64>> = const { Cell::new(None) };
}

/// Notes that a lane the current pop could not claim (or read past) becomes claimable at `at`
/// (microseconds, `clock::clock_now`'s clock).
pub fn due_at(at: i64) {
    DUE.with(|d| d.set(Some(d.get().map_or(at, |t| t.min(at)))));
}

/// Takes the earliest time noted by `due_at` since the last call.
pub fn take_due() -> Option<i64> {
    DUE.with(|d| d.take())
}

/// Bytes of shared memory the wake-up slots take (see `hooks`).
pub fn shmem_size() -> usize {
    std::mem::size_of::<WakeShmem>()
}

/// Initialises the slots (or attaches to them): `hooks` calls this once per process.
///
/// # Safety
/// The block given points at `shmem_size()` bytes of shared memory named for this part, fresh when
/// `!found`; the caller holds AddinShmemInitLock while shared memory is set up, once per
/// process.
pub unsafe fn shmem_init((p, found): (*mut u8, bool)) {
    let shm = p as *mut WakeShmem;
    // SAFETY: `p` is a block of shmem_size() bytes from ShmemInitStruct, MAXALIGNed, and
    // the caller holds AddinShmemInitLock, so nobody else initialises it concurrently.
    unsafe {
        if !found {
            for i in 0..SLOTS {
                pg_sys::ConditionVariableInit(&raw mut (*shm).slots[i]);
            }
        }
        WAKE = shm;
    }
}

/// The slot of a queue, by name: a pop may wait on a queue before its first push.
fn slot(queue: &str) -> usize {
    // FNV-1a: stable across backends, no allocation.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in queue.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    (h % SLOTS as u64) as usize
}

/// True when wake-ups go through shared memory.
pub fn preloaded() -> bool {
    // SAFETY: WAKE is written once per process, before any query runs.
    unsafe { !WAKE.is_null() }
}

/// Wakes waiters on `queue` once the current transaction commits (`on_commit`).
pub fn notify_on_commit(queue: &str) {
    if preloaded() {
        PENDING.with(|p| p.set(p.get() | 1u64 << slot(queue)));
    }
}

/// At commit, after the transaction's rows are visible and its offsets readable
/// (`offsets::xact_callback` calls this last): wake the pops waiting on its queues.
pub fn on_commit() {
    let mask = PENDING.with(|p| p.replace(0));
    for i in 0..SLOTS {
        if mask & (1u64 << i) != 0 {
            // SAFETY: a bit is only set when preloaded(), so WAKE points at the slots.
            unsafe { pg_sys::ConditionVariableBroadcast(&raw mut (*WAKE).slots[i]) };
        }
    }
}

/// Wakes every waiting pop, whatever its queue (a prepared transaction's commit, whose
/// queues this backend does not know).
pub fn broadcast_all() {
    if !preloaded() {
        return;
    }
    for i in 0..SLOTS {
        // SAFETY: preloaded(), so WAKE points at the initialised slots.
        unsafe { pg_sys::ConditionVariableBroadcast(&raw mut (*WAKE).slots[i]) };
    }
}

/// At abort: nothing to announce.
pub fn on_abort() {
    PENDING.with(|p| p.set(0));
}

/// Registers this backend as a waiter on `queue`. Call it before looking for messages:
/// a commit between the look and `sleep` then still wakes the sleep.
pub fn prepare(queue: &str) {
    if preloaded() {
        // SAFETY: WAKE points at the initialised slots (preloaded).
        unsafe { pg_sys::ConditionVariablePrepareToSleep(&raw mut (*WAKE).slots[slot(queue)]) };
    }
}

/// Sleeps until a wake-up of `queue`, `timeout_ms`, or an interrupt (query cancel and
/// statement_timeout raise their ERROR here, as anywhere in PostgreSQL). The caller
/// shortens `timeout_ms` to the next `due_at` time.
pub fn sleep(queue: &str, timeout_ms: i64) {
    // SAFETY: with preloading WAKE points at the initialised slots; MyLatch is this
    // backend's own latch.
    unsafe {
        if preloaded() {
            pg_sys::ConditionVariableTimedSleep(
                &raw mut (*WAKE).slots[slot(queue)],
                timeout_ms.clamp(1, RECHECK_MS) as _,
                pg_sys::PG_WAIT_EXTENSION,
            );
        } else {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                timeout_ms.clamp(1, FALLBACK_POLL_MS) as _,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
    }
    pgrx::check_for_interrupts!();
}

pub fn cancel() {
    if preloaded() {
        // SAFETY: ends the sleep `prepare` started on this backend's condition variable.
        unsafe { pg_sys::ConditionVariableCancelSleep() };
    }
}
