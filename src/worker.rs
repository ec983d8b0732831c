//! The background worker (with `shared_preload_libraries = 'queen'`): in the database
//! `queen.retention_database`, a compaction pass every `queen.compaction_interval`
//! milliseconds and a retention pass every `queen.retention_interval` seconds, each
//! partition's compaction in a transaction of its own; and every two seconds a round of
//! the lane journal (`lanes`): changed cursors saved into `queen.lanes`, and the journal
//! table no ack writes to any more emptied. After a compaction pass that merged
//! something, the worker vacuums the fresh tier at once: the index of a table whose rows
//! are all appended on one side and deleted on the other gives its pages back only to
//! VACUUM, and autovacuum (once a minute at best) would let it grow with every pass.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::prelude::*;

use crate::compaction::COMPACTION_INTERVAL;
use crate::retention::{RETENTION_DATABASE, RETENTION_INTERVAL};
use crate::spi::run;

/// Called from `_PG_init`, after the settings are defined.
pub fn init() {
    // SAFETY: a plain read of a flag the postmaster sets while preloading libraries.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        BackgroundWorkerBuilder::new("queen maintenance")
            .set_type("queen maintenance")
            .set_library("queen")
            .set_function("queen_maintenance_main")
            .enable_spi_access()
            .set_restart_time(Some(Duration::from_secs(5)))
            .load();
    }
}

/// How often the lane journal moves on (see `lanes::rotate_journal`: a table is emptied
/// within three rounds of its retirement).
const JOURNAL_ROUND: Duration = Duration::from_secs(2);

/// A setting as a period, None when 0 (off).
fn period(value: i32, unit: Duration) -> Option<Duration> {
    (value > 0).then(|| unit * value as u32)
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn queen_maintenance_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let db =
        RETENTION_DATABASE.get().map(|c| c.to_string_lossy().into_owned()).unwrap_or_else(|| "postgres".to_string());
    BackgroundWorker::connect_worker_to_spi(Some(&db), None);
    // Nothing the worker commits needs to wait for its WAL flush: a compaction or a
    // retention pass lost in a crash is undone whole (the small segments, or the old ones,
    // are still there) and simply runs again; and anything that reads its result and then
    // commits flushes that WAL first.
    // The worker runs as the bootstrap superuser: its search path is pinned to pg_catalog
    // (every queen name it uses is schema-qualified), so no schema a user can create in
    // (public, "$user") can put a function or operator in its way.
    // SAFETY: setting configuration options for this process at session level.
    unsafe {
        pg_sys::SetConfigOption(
            c"synchronous_commit".as_ptr(),
            c"off".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
        );
        // Compaction and rotation need statement snapshots: a database or role default
        // of REPEATABLE READ or SERIALIZABLE must not reach the worker.
        pg_sys::SetConfigOption(
            c"default_transaction_isolation".as_ptr(),
            c"read committed".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
        );
        pg_sys::SetConfigOption(
            c"search_path".as_ptr(),
            c"pg_catalog, pg_temp".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
        );
    }
    let start = Instant::now();
    let mut compactor = Compactor::default();
    let (mut next_compaction, mut next_retention, mut next_journal) = (start, start, start);
    loop {
        let now = Instant::now();
        let compaction = period(COMPACTION_INTERVAL.get(), Duration::from_millis(1));
        let retention = period(RETENTION_INTERVAL.get(), Duration::from_secs(1));
        // Sleep until the next pass that is on; with both off, wake now and then for a
        // reload that turns one on.
        let due = [compaction.map(|_| next_compaction), retention.map(|_| next_retention), Some(next_journal)];
        let wake_at = due.iter().flatten().min().copied().unwrap_or(now + Duration::from_secs(60));
        if !BackgroundWorker::wait_latch(Some(wake_at.saturating_duration_since(now))) {
            break; // SIGTERM
        }
        if BackgroundWorker::sighup_received() {
            // SAFETY: reloading the configuration file is what a worker does on SIGHUP.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        let now = Instant::now();
        if let Some(p) = compaction.filter(|_| now >= next_compaction) {
            compactor.pass();
            next_compaction = Instant::now() + p;
        }
        if crate::lanes::enabled() && now >= next_journal {
            let done = BackgroundWorker::transaction(|| {
                Spi::connect_mut(|client| {
                    if installed(client) {
                        crate::lanes::rotate_journal(client)
                    } else {
                        crate::lanes::Rotation::default()
                    }
                })
            });
            crate::lanes::rotated(done);
            // Reservations of prepared transactions that ended unseen (`offsets::sweep_prepared`).
            BackgroundWorker::transaction(crate::offsets::sweep_prepared);
            next_journal = Instant::now() + JOURNAL_ROUND;
        }
        if let Some(p) = retention.filter(|_| now >= next_retention) {
            BackgroundWorker::transaction(|| {
                Spi::connect_mut(|client| {
                    if installed(client) {
                        let (_, _, bytes) = crate::retention::retain_in(client, None);
                        crate::stats::record_retention(crate::clock::clock_now(), bytes);
                    }
                })
            });
            // In a transaction of its own: a rotation that waited in vain for its lock
            // leaves the pass's deletions committed.
            BackgroundWorker::transaction(|| {
                Spi::connect_mut(|client| {
                    if installed(client) {
                        crate::generations::rotate(client);
                    }
                })
            });
            next_retention = Instant::now() + p;
        }
    }
    // A clean stop saves every cursor into queen.lanes, so that a restart without the
    // library preloaded (no registry, no journal) finds them there.
    if crate::lanes::enabled() {
        BackgroundWorker::transaction(|| {
            Spi::connect_mut(|client| {
                if installed(client) {
                    crate::lane_rows::save_journal(client);
                }
            })
        });
    }
    // Exit code 1: the postmaster starts the worker again after its restart time, unless
    // the server is shutting down. (With 0 it would not: a pg_terminate_backend of the
    // worker would end retention, compaction and journal rotation until a restart.)
    // SAFETY: ending the process the way PostgreSQL's own workers do.
    unsafe { pg_sys::proc_exit(1) };
}

/// The extension is installed in this database at this library's version. Between a
/// restart on a new library and `ALTER EXTENSION queen UPDATE` the worker waits: the old
/// schema may lack what the new library uses.
fn installed(client: &mut pgrx::spi::SpiClient<'_>) -> bool {
    crate::spi::first_value::<bool>(run(
        client,
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'queen' AND extversion = $1)",
        &[env!("CARGO_PKG_VERSION").into()],
    ))
    .unwrap_or(false)
}

/// `VACUUM (INDEX_CLEANUP on, TRUNCATE off, SKIP_LOCKED) queen.fresh_segments`, as the
/// command does it (and as autovacuum calls it): outside any transaction block, with a
/// portal memory context for VACUUM's cross-transaction state.
fn vacuum_fresh_tier() {
    // SAFETY: this follows autovacuum's call of vacuum(): a transaction is started, the
    // relation list is built in it (vacuum copies it before its first commit), the params
    // live on this stack for the whole call, PortalContext points at a context that lives
    // across vacuum's own transactions and is reset after, and vacuum leaves a transaction
    // open for the final commit. An ERROR ends the worker, which the postmaster restarts.
    unsafe {
        let cx = pgrx::PgMemoryContexts::new("queen vacuum");
        let portal = cx.value();
        pg_sys::PortalContext = portal;
        pg_sys::StartTransactionCommand();
        let relation =
            pg_sys::makeRangeVar(pg_sys::pstrdup(c"queen".as_ptr()), pg_sys::pstrdup(c"fresh_segments".as_ptr()), -1);
        let list = pg_sys::lappend(
            std::ptr::null_mut(),
            pg_sys::makeVacuumRelation(relation, pg_sys::InvalidOid, std::ptr::null_mut()).cast(),
        );
        let mut params = pg_sys::VacuumParams {
            options: pg_sys::VACOPT_VACUUM | pg_sys::VACOPT_SKIP_LOCKED | pg_sys::VACOPT_PROCESS_TOAST,
            freeze_min_age: -1,
            freeze_table_age: -1,
            multixact_freeze_min_age: -1,
            multixact_freeze_table_age: -1,
            is_wraparound: false,
            log_min_duration: -1,
            // The index is the point: always clean it.
            index_cleanup: pg_sys::VacOptValue::VACOPTVALUE_ENABLED,
            // Truncating the heap needs an exclusive lock that pushes hold off: VACUUM
            // would retry for up to 5 s, and the pass with it. Free pages are reused.
            truncate: pg_sys::VacOptValue::VACOPTVALUE_DISABLED,
            nworkers: 0,
        };
        pg_sys::vacuum(list, &mut params, std::ptr::null_mut(), true);
        pg_sys::CommitTransactionCommand();
        pg_sys::PortalContext = std::ptr::null_mut();
        drop(cx);
    }
}

/// How often a compaction pass lists every partition of the fresh tier from the table (a
/// skip scan of its primary key) rather than from the offsets registry: at the start, and
/// then for partitions the registry has evicted or that another database's pushes did not
/// make it load.
const FULL_LIST_EVERY: Duration = Duration::from_secs(60);

/// The worker's compaction state: where each partition's fresh segments may start (see
/// `compaction::compact_partition`), and when the table was last listed whole.
#[derive(Default)]
struct Compactor {
    from: HashMap<pgrx::Uuid, i64>,
    listed: Option<Instant>,
    /// The oldest transaction horizon at the last VACUUM of the fresh tier.
    vacuumed_at: Option<String>,
}

impl Compactor {
    /// Every partition with small segments, each compacted in a transaction of its own, so
    /// a pass holds no lock for long; then, if anything was merged and the xmin horizon has
    /// moved since the last one, a VACUUM of the fresh tier.
    fn pass(&mut self) {
        let full = self.listed.is_none_or(|t| t.elapsed() >= FULL_LIST_EVERY);
        let pids: Vec<pgrx::Uuid> = if full {
            let pids = BackgroundWorker::transaction(|| {
                Spi::connect_mut(|client| {
                    if installed(client) {
                        crate::compaction::partitions_to_compact(client, None)
                    } else {
                        Vec::new()
                    }
                })
            });
            self.listed = Some(Instant::now());
            // Forget the marks of partitions with nothing fresh left.
            let listed: HashSet<pgrx::Uuid> = pids.iter().copied().collect();
            self.from.retain(|p, _| listed.contains(p));
            pids
        } else {
            // Partitions with something fresh at or above where they may start. (One the
            // registry has evicted meanwhile waits for the next full listing.)
            crate::offsets::fresh_partitions()
                .into_iter()
                .filter(|(p, max)| self.from.get(p).is_none_or(|from| from <= max))
                .map(|(p, _)| p)
                .collect()
        };
        let mut merged = 0;
        for pid in pids {
            let from = self.from.get(&pid).copied().unwrap_or(0);
            let (done, next) = BackgroundWorker::transaction(|| {
                Spi::connect_mut(|client| crate::compaction::compact_partition(client, pid, from))
            });
            // (Committed: the marks move only now.)
            if let Some(next) = next {
                self.from.insert(pid, next);
            }
            merged += done.merged;
        }
        if merged > 0 {
            let horizon = BackgroundWorker::transaction(|| Spi::connect_mut(xmin_horizon));
            if horizon.is_none() || horizon != self.vacuumed_at {
                vacuum_fresh_tier();
                self.vacuumed_at = horizon;
            }
        }
    }
}

/// The oldest transaction that holds back what VACUUM may remove (the xmin horizon): of
/// every backend's snapshot and transaction id, replication slot and prepared transaction.
/// While it stays the same, a VACUUM can remove nothing that the last one could not, and
/// only scans: a long transaction makes a pass skip it instead.
fn xmin_horizon(client: &mut pgrx::spi::SpiClient<'_>) -> Option<String> {
    crate::spi::first_value::<String>(run(
        client,
        "SELECT x::text FROM (
           SELECT backend_xmin AS x FROM pg_catalog.pg_stat_activity
            WHERE backend_xmin IS NOT NULL AND pid <> pg_catalog.pg_backend_pid()
           UNION ALL
           SELECT backend_xid FROM pg_catalog.pg_stat_activity
            WHERE backend_xid IS NOT NULL AND pid <> pg_catalog.pg_backend_pid()
           UNION ALL
           SELECT xmin FROM pg_catalog.pg_replication_slots WHERE xmin IS NOT NULL
           UNION ALL
           SELECT catalog_xmin FROM pg_catalog.pg_replication_slots WHERE catalog_xmin IS NOT NULL
           UNION ALL
           SELECT transaction FROM pg_catalog.pg_prepared_xacts) h
         ORDER BY pg_catalog.age(x) DESC LIMIT 1",
        &[],
    ))
}
