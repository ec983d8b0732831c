//! Shared memory: the one place that asks PostgreSQL for it.
//!
//! With `shared_preload_libraries = 'queen'`, queen keeps these in shared memory: the
//! long-poll wake-up slots (`wake`), the offset registry (`offsets`), the lane registry
//! (`lanes`), the per-database slots (`dbs`: maintenance workers, lane journals,
//! counters) and the fail points' state in test builds. Each module
//! says how much it needs and initialises its part; this module chains the hooks. Without
//! preloading none of it exists, and both modules fall back to what needs no shared memory.

use pgrx::pg_sys;
use pgrx::prelude::*;

static mut PREV_REQUEST: Option<unsafe extern "C-unwind" fn()> = None;
static mut PREV_STARTUP: Option<unsafe extern "C-unwind" fn()> = None;

/// Called from `_PG_init`, after every module has defined its settings.
pub fn init() {
    // SAFETY: _PG_init runs once, single-threaded, in the postmaster while it loads
    // shared_preload_libraries; chaining these hooks there is what PostgreSQL expects.
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
    // SAFETY: called by the postmaster in its shmem-request phase, the only time these
    // requests are allowed.
    unsafe {
        if let Some(prev) = PREV_REQUEST {
            prev();
        }
        pg_sys::RequestAddinShmemSpace(crate::wake::shmem_size());
        pg_sys::RequestAddinShmemSpace(crate::offsets::shmem_size());
        pg_sys::RequestNamedLWLockTranche(crate::offsets::TRANCHE.as_ptr(), 1);
        pg_sys::RequestAddinShmemSpace(crate::lanes::shmem_size());
        pg_sys::RequestNamedLWLockTranche(crate::lanes::TRANCHE.as_ptr(), 1);
        pg_sys::RequestAddinShmemSpace(crate::dbs::shmem_size());
        pg_sys::RequestNamedLWLockTranche(crate::dbs::TRANCHE.as_ptr(), 1);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn shmem_startup() {
    // SAFETY: called in the postmaster (and after a crash restart) while shared memory is
    // set up; ShmemInitStruct is serialised by AddinShmemInitLock as PostgreSQL requires.
    unsafe {
        if let Some(prev) = PREV_STARTUP {
            prev();
        }
        let lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock; // AddinShmemInitLock
        pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        crate::wake::shmem_init(alloc(c"queen wake-ups", crate::wake::shmem_size()));
        crate::offsets::shmem_init(alloc(c"queen offsets", crate::offsets::shmem_size()));
        crate::lanes::shmem_init(alloc(c"queen lanes", crate::lanes::shmem_size()));
        crate::dbs::shmem_init(alloc(c"queen databases", crate::dbs::shmem_size()));
        pg_sys::LWLockRelease(lock);
    }
}

/// A named block of shared memory, and whether it existed already (a backend attaching to
/// memory the postmaster initialised).
unsafe fn alloc(name: &std::ffi::CStr, size: usize) -> (*mut u8, bool) {
    let mut found = false;
    // SAFETY: the caller holds AddinShmemInitLock; the name is a static C string.
    let p = unsafe { pg_sys::ShmemInitStruct(name.as_ptr(), size, &mut found) } as *mut u8;
    (p, found)
}

/// Runs `f` holding `lock` in `mode` (exclusive or shared), for the registries kept here.
/// The lock is released when `f` returns and when it panics (a panic unwinds through
/// here, and the caller may catch it: a transaction callback must not raise).
///
/// # Safety
/// `lock` is one of queen's named LWLocks, and `f` is pure Rust that raises no ERROR
/// (a longjmp would skip the release; an ERROR elsewhere releases every LWLock anyway).
pub unsafe fn locked<R>(lock: *mut pg_sys::LWLock, mode: pg_sys::LWLockMode::Type, f: impl FnOnce() -> R) -> R {
    struct Release(*mut pg_sys::LWLock);
    impl Drop for Release {
        fn drop(&mut self) {
            // SAFETY: this process acquired the lock just below and has not released it.
            unsafe { pg_sys::LWLockRelease(self.0) };
        }
    }
    // SAFETY: as the caller promises.
    unsafe { pg_sys::LWLockAcquire(lock, mode) };
    let _release = Release(lock);
    f()
}

/// This backend's owner number in queen's registries (0-based).
pub fn owner() -> u32 {
    // SAFETY: MyBackendId is this backend's id (1..=MaxBackends) for every process that
    // runs queen's functions: client backends and background workers.
    (unsafe { pg_sys::MyBackendId } - 1) as u32
}

/// The current subtransaction's id.
pub fn subxact() -> u32 {
    // SAFETY: a plain read of the transaction state; queen's functions run in a transaction.
    unsafe { pg_sys::GetCurrentSubTransactionId() }
}
