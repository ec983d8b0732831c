//! What the background worker's retention passes did, kept in shared memory for
//! `queen.metrics()`: when the last pass ran, the bytes it freed, the bytes freed since the
//! server started, and how many passes ran. Without `shared_preload_libraries` there is no
//! worker and no counters: they read as none.

use std::sync::atomic::{AtomicI64, AtomicPtr, Ordering};

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

#[repr(C)]
struct Stats {
    /// Microseconds since 2000-01-01 of the last pass's end; 0 before the first.
    retention_last_at: AtomicI64,
    retention_last_bytes: AtomicI64,
    retention_bytes_total: AtomicI64,
    retention_runs: AtomicI64,
}

static STATS: AtomicPtr<Stats> = AtomicPtr::new(std::ptr::null_mut());

/// Bytes of shared memory the counters take (see `shmem`).
pub fn shmem_size() -> usize {
    std::mem::size_of::<Stats>()
}

/// Zeroes the counters (or attaches to them): `shmem` calls this once per process.
pub fn shmem_init((p, found): (*mut u8, bool)) {
    let stats = p as *mut Stats;
    if !found {
        // SAFETY: `p` is a block of shmem_size() bytes from ShmemInitStruct, MAXALIGNed,
        // and the caller holds AddinShmemInitLock, so nobody else initialises it.
        unsafe {
            stats.write(Stats {
                retention_last_at: AtomicI64::new(0),
                retention_last_bytes: AtomicI64::new(0),
                retention_bytes_total: AtomicI64::new(0),
                retention_runs: AtomicI64::new(0),
            })
        };
    }
    STATS.store(stats, Ordering::Release);
}

fn stats() -> Option<&'static Stats> {
    let p = STATS.load(Ordering::Acquire);
    // SAFETY: a non-null pointer is the shared block `shmem_init` set up, which lives as
    // long as the server; its fields are atomics, safe to share between processes.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Records a retention pass of the worker that freed `bytes`, ending at `now`.
pub fn record_retention(now: i64, bytes: i64) {
    if let Some(s) = stats() {
        s.retention_last_bytes.store(bytes, Ordering::Relaxed);
        s.retention_bytes_total.fetch_add(bytes, Ordering::Relaxed);
        s.retention_runs.fetch_add(1, Ordering::Relaxed);
        s.retention_last_at.store(now, Ordering::Release);
    }
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._retention_stats() IS
  'queen internal: the background worker''s retention counters (queen.metrics); not granted';
"#,
    name = "retention_stats_home",
    requires = [retention_stats]
);

/// `queen._retention_stats()`: the worker's last retention pass (NULL before the first, or
/// without preloading), the bytes it freed, the bytes freed since the server started, and
/// the number of passes.
#[pg_extern(name = "_retention_stats", volatile, parallel_unsafe)]
fn retention_stats() -> TableIterator<
    'static,
    (
        name!(last_run_at, Option<TimestampWithTimeZone>),
        name!(bytes_last, i64),
        name!(bytes_total, i64),
        name!(runs, i64),
    ),
> {
    let row = match stats() {
        Some(s) => {
            let at = s.retention_last_at.load(Ordering::Acquire);
            (
                (at != 0).then(|| crate::clock::timestamptz(at)),
                s.retention_last_bytes.load(Ordering::Relaxed),
                s.retention_bytes_total.load(Ordering::Relaxed),
                s.retention_runs.load(Ordering::Relaxed),
            )
        }
        None => (None, 0, 0, 0),
    };
    TableIterator::once(row)
}
