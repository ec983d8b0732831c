//! What this database's maintenance worker did, for `queen.metrics()`: per pass, how
//! many runs and errors, when it last succeeded and when it last failed; what retention
//! freed; the fresh segments compaction kept because it could not decode them. The
//! counters live in the database's slot in shared memory (`dbs`) and start again when
//! the server does. Without `shared_preload_libraries` there is no worker and no
//! counters: they read as none.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

use crate::pg::dbs::{self, Pass, PASSES};

/// Records a retention pass that freed `bytes`, ending at `now`: every pass adds to the
/// total; one with every step done (`clean`) is also the last pass and a success.
pub fn record_retention(now: i64, bytes: i64, clean: bool) {
    if !dbs::enabled() {
        return;
    }
    dbs::mine(|s| {
        if clean {
            s.retention_bytes_last = bytes;
        }
        s.retention_bytes_total += bytes;
    });
    if clean {
        dbs::record_pass(Pass::Retention, true, now);
    }
}

/// Counts a fresh segment compaction could not decode (and kept as it was).
pub fn record_corrupt_segment() {
    if dbs::enabled() {
        dbs::mine(|s| s.corrupt_segments += 1);
    }
}

fn this_database() -> Option<dbs::Slot> {
    if !dbs::enabled() {
        return None;
    }
    dbs::with(dbs::my_database(), false, |s| *s)
}

fn timestamp(micros: i64) -> Option<TimestampWithTimeZone> {
    (micros != 0).then(|| crate::pg::clock::timestamptz(micros))
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._retention_stats() IS
  'queen internal: this database''s retention counters (queen.metrics); not granted';
"#,
    name = "retention_stats_home",
    requires = [retention_stats]
);

/// `queen._retention_stats()`: this database worker's last retention pass (NULL before the
/// first, or without preloading), the bytes it freed, the bytes freed since the server
/// started, and the number of passes.
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
    let row = match this_database() {
        Some(s) => {
            let p = s.passes[Pass::Retention as usize];
            (timestamp(p.last_ok), s.retention_bytes_last, s.retention_bytes_total, p.runs)
        }
        None => (None, 0, 0, 0),
    };
    TableIterator::once(row)
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._maintenance_stats() IS
  'queen internal: this database''s maintenance passes: runs, errors, first run, last success and last error (queen.metrics); not granted';
"#,
    name = "maintenance_stats_home",
    requires = [maintenance_stats]
);

/// `queen._maintenance_stats()`: one row per maintenance pass of this database's worker
/// (compaction, retention, rotation, journal, prepared, expiry): runs and errors since the
/// server started, the end of its first run, of its last successful run and of its last
/// failed one (NULL: none), and whether a worker runs here now. No rows without
/// preloading.
#[pg_extern(name = "_maintenance_stats", volatile, parallel_unsafe)]
#[allow(clippy::type_complexity)] // pgrx reads the columns from the signature
fn maintenance_stats() -> TableIterator<
    'static,
    (
        name!(pass, String),
        name!(runs, i64),
        name!(errors, i64),
        name!(first_at, Option<TimestampWithTimeZone>),
        name!(last_ok_at, Option<TimestampWithTimeZone>),
        name!(last_error_at, Option<TimestampWithTimeZone>),
        name!(worker_running, bool),
        name!(corrupt_segments, i64),
    ),
> {
    let rows: Vec<_> = match this_database() {
        Some(s) => PASSES
            .iter()
            .map(|&p| {
                let c = s.passes[p as usize];
                (
                    p.name().to_string(),
                    c.runs,
                    c.errors,
                    timestamp(c.first),
                    timestamp(c.last_ok),
                    timestamp(c.last_error),
                    s.worker == dbs::WORKER_RUNNING,
                    s.corrupt_segments,
                )
            })
            .collect(),
        None => Vec::new(),
    };
    TableIterator::new(rows)
}
