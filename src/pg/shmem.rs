//! Shared-memory plumbing the registries share: the lock guard and this backend's owner
//! number. (The hooks that ask PostgreSQL for shared memory are in `hooks`.)

use pgrx::pg_sys;

/// True on a server in recovery (a hot standby, or a primary before its startup ends).
/// The registries are not used there (`offsets::enabled`, `lane::registry::enabled`): a
/// standby's reads answer from the tables, as without preloading, so that nothing it
/// caches goes stale while WAL is replayed or outlives a promotion; and the calls that
/// change state refuse (`errors::refuse_read_only`).
pub fn in_recovery() -> bool {
    // PostgreSQL keeps the answer too, but each call into it through pgrx costs a guard (a
    // `sigsetjmp`, about 100 instructions), and a pop with its ack asked 13 times. A
    // recovery never starts again for a running process: once this process has seen it
    // over, it is over for good. The answer is kept with the process id that saw it: a
    // process forked later (from the postmaster, which may have seen it before a crash
    // restart's recovery) inherits a different id, and asks again.
    thread_local! {
        static RECOVERY_OVER_IN_PID: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
    }
    // SAFETY: a plain read of this process's id, set when it starts (0 before).
    let me = unsafe { pg_sys::MyProcPid };
    if me != 0 && RECOVERY_OVER_IN_PID.with(std::cell::Cell::get) == me {
        return false;
    }
    // SAFETY: a plain read of whether this server is in recovery.
    let recovering = unsafe { pg_sys::RecoveryInProgress() };
    if !recovering {
        RECOVERY_OVER_IN_PID.with(|o| o.set(me));
    }
    recovering
}

/// How a registry's block of shared memory divides into its parts (a header and slot
/// arrays): writable parts for a writer, shared references only for a reader.
pub trait Parts: Copy + 'static {
    /// What a writer gets (under the lock held exclusively).
    type Mut<'a>;
    /// What a reader gets (under the lock held in shared mode): nothing it can write.
    type Ref<'a>;
    /// # Safety
    /// `base` is a block laid out by `self` (every part 8-byte aligned, inside the block,
    /// disjoint), and nothing else reads or writes it for `'a`.
    unsafe fn parts_mut<'a>(self, base: *mut u8) -> Self::Mut<'a>;
    /// # Safety
    /// As `parts_mut`, except that others may read the block at the same time; nobody
    /// writes it for `'a`.
    unsafe fn parts_ref<'a>(self, base: *const u8) -> Self::Ref<'a>;
}

/// One registry's block of shared memory and the LWLock that guards it: the region type
/// both registries use. A writer gets `&mut` parts with the lock held exclusively
/// (`exclusive`), a reader shared parts with it held in shared mode (`share`), as pgrx's
/// `PgLwLock` does; the parts cannot outlive the call, and the lock is released when the
/// closure returns or panics.
pub struct Region<P: Parts> {
    lock: *mut pg_sys::LWLock,
    base: *mut u8,
    parts: P,
}

impl<P: Parts> Region<P> {
    /// # Safety
    /// `lock` is one of queen's named LWLocks, `base` a block of shared memory laid out by
    /// `parts`, and every process uses that block only through a `Region` on that lock.
    pub unsafe fn new(lock: *mut pg_sys::LWLock, base: *mut u8, parts: P) -> Self {
        Region { lock, base, parts }
    }

    /// Runs `f` on the writable parts with the lock held exclusively. `f` must raise no
    /// ERROR (pure Rust: a panic unwinds and releases the lock).
    pub fn exclusive<R>(&self, f: impl FnOnce(P::Mut<'_>) -> R) -> R {
        // SAFETY: as `new` promised; the lock is held exclusively for the whole call, so
        // nothing else reads or writes the block meanwhile.
        unsafe { locked(self.lock, pg_sys::LWLockMode::LW_EXCLUSIVE, || f(self.parts.parts_mut(self.base))) }
    }

    /// Runs `f` on the read-only parts with the lock held in shared mode.
    pub fn share<R>(&self, f: impl FnOnce(P::Ref<'_>) -> R) -> R {
        // SAFETY: as `new` promised; the lock is held in shared mode for the whole call, so
        // nobody writes the block meanwhile.
        unsafe { locked(self.lock, pg_sys::LWLockMode::LW_SHARED, || f(self.parts.parts_ref(self.base))) }
    }

    /// The writable parts without the lock, to format a fresh block.
    ///
    /// # Safety
    /// The caller holds AddinShmemInitLock while shared memory is being set up, and the
    /// block is fresh: no other process can use it yet.
    pub unsafe fn parts_for_format(&self) -> P::Mut<'_> {
        // SAFETY: as the caller promises.
        unsafe { self.parts.parts_mut(self.base) }
    }
}

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
