//! Shared-memory plumbing the registries share: the lock guard and this backend's owner
//! number. (The hooks that ask PostgreSQL for shared memory are in `hooks`.)

use pgrx::pg_sys;

/// Runs `f` holding `lock` in `mode` (exclusive or shared), for the shared-memory registries.
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
