//! Long-poll wake-ups (spec §4 `wait_ms`).
//!
//! With `shared_preload_libraries = 'queen'`, shared memory holds a small array of
//! condition variables; a queue maps to one slot. A transaction that pushes to a queue,
//! or releases a lane of it, broadcasts that slot when it commits (after its rows are
//! visible), so a waiting pop retries at once instead of on a timer.
//!
//! Without preloading there is no shared memory: waiting pops poll every
//! `FALLBACK_POLL_MS` on their latch instead (documented in the README).

use std::cell::Cell;
use std::ptr;

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{register_xact_callback, PgXactCallbackEvent};

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
static mut PREV_REQUEST: Option<unsafe extern "C-unwind" fn()> = None;
static mut PREV_STARTUP: Option<unsafe extern "C-unwind" fn()> = None;

thread_local! {
    /// Slots to broadcast when the current transaction commits (a bit per slot).
    static PENDING: Cell<u64> = const { Cell::new(0) };
}

/// Called from `_PG_init`: asks for shared memory when loaded at server start.
pub fn init() {
    unsafe {
        if !pg_sys::process_shared_preload_libraries_in_progress {
            return;
        }
        PREV_REQUEST = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(shmem_request);
        PREV_STARTUP = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(shmem_startup);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn shmem_request() {
    unsafe {
        if let Some(prev) = PREV_REQUEST {
            prev();
        }
        pg_sys::RequestAddinShmemSpace(std::mem::size_of::<WakeShmem>());
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn shmem_startup() {
    unsafe {
        if let Some(prev) = PREV_STARTUP {
            prev();
        }
        let lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock; // AddinShmemInitLock
        pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let shm = pg_sys::ShmemInitStruct(
            c"queen wake-ups".as_ptr(),
            std::mem::size_of::<WakeShmem>(),
            &mut found,
        ) as *mut WakeShmem;
        if !found {
            for i in 0..SLOTS {
                pg_sys::ConditionVariableInit(&raw mut (*shm).slots[i]);
            }
        }
        WAKE = shm;
        pg_sys::LWLockRelease(lock);
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
    unsafe { !WAKE.is_null() }
}

/// Wakes waiters on `queue_id` once the current transaction commits.
pub fn notify_on_commit(queue: &str) {
    if !preloaded() {
        return;
    }
    let bit = 1u64 << slot(queue);
    let before = PENDING.with(|p| p.replace(p.get() | bit));
    if before == 0 {
        register_xact_callback(PgXactCallbackEvent::Commit, || {
            let mask = PENDING.with(|p| p.replace(0));
            for i in 0..SLOTS {
                if mask & (1u64 << i) != 0 {
                    unsafe { pg_sys::ConditionVariableBroadcast(&raw mut (*WAKE).slots[i]) };
                }
            }
        });
        register_xact_callback(PgXactCallbackEvent::Abort, || PENDING.with(|p| p.set(0)));
    }
}

/// Registers this backend as a waiter on `queue`. Call it before looking for messages:
/// a commit between the look and `sleep` then still wakes the sleep.
pub fn prepare(queue: &str) {
    if preloaded() {
        unsafe { pg_sys::ConditionVariablePrepareToSleep(&raw mut (*WAKE).slots[slot(queue)]) };
    }
}

/// Sleeps until a wake-up of `queue`, `timeout_ms`, or an interrupt (query cancel and
/// statement_timeout raise their ERROR here, as anywhere in PostgreSQL).
pub fn sleep(queue: &str, timeout_ms: i64) {
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
        unsafe { pg_sys::ConditionVariableCancelSleep() };
    }
}
