//! Every setting (GUC) queen defines, in one place, each with a typed getter. The code that
//! reads a setting calls its getter; nothing else touches a `GucSetting`. docs/concepts.md,
//! "Settings", explains them for users.
//!
//! Settings that size shared memory (`Postmaster` context) and `queen.retention_database`
//! exist only when queen is preloaded (`shared_preload_libraries = 'queen'`); the others
//! exist in every backend that loads queen (the workers' intervals too, so that
//! `ALTER SYSTEM` and `SHOW` know them without preloading).

use std::ffi::{CStr, CString};

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use queen_core::generations::MIN_ROTATE_BYTES;
use queen_core::policy::limits::MAX_LEASE_DEFAULT;

type Text = GucSetting<Option<CString>>;

// Bounds on what callers may ask for.
static MAX_LEASE: GucSetting<i32> = GucSetting::<i32>::new(MAX_LEASE_DEFAULT);
static DURABLE_POP: GucSetting<bool> = GucSetting::<bool>::new(false);
// Encryption.
static KEY_FILE: Text = Text::new(None);
static ENCRYPTION_KEY: Text = Text::new(None);
static OLD_KEYS: Text = Text::new(None);
static DEAD_LETTER_MISSING_KEY: GucSetting<bool> = GucSetting::<bool>::new(false);
// Maintenance.
static COMPACTION_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(1000);
static RETENTION_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(60);
static ROTATION_MIN_SIZE: GucSetting<i32> = GucSetting::<i32>::new((MIN_ROTATE_BYTES / 1024) as i32);
static ONLY_DATABASE: Text = Text::new(None);
// Shared-memory sizes (server start only).
static TRACKED_PARTITIONS: GucSetting<i32> = GucSetting::<i32>::new(16_384);
static RESERVATIONS: GucSetting<i32> = GucSetting::<i32>::new(32_768);
static TRACKED_LANES: GucSetting<i32> = GucSetting::<i32>::new(16_384);
static MAX_LEASES: GucSetting<i32> = GucSetting::<i32>::new(8_192);
static MAX_DATABASES: GucSetting<i32> = GucSetting::<i32>::new(64);
// Tests only.
#[cfg(feature = "failpoints")]
static FAILPOINT: Text = Text::new(None);

/// `queen.max_lease`: the longest lease a pop may take and an extension may ask for, in
/// seconds (default 12 hours, as SQS's longest visibility timeout). Only a superuser sets
/// it: a consumer must not be able to pin lease slots for ever.
pub fn max_lease() -> i32 {
    MAX_LEASE.get()
}

/// `queen.durable_pop`: whether a leasing pop's commit waits for its WAL flush.
pub fn durable_pop() -> bool {
    DURABLE_POP.get()
}

/// `queen.encryption_key_file`, `queen.encryption_key` and `queen.encryption_old_keys`:
/// (key file, key, old keys), each empty when unset.
pub fn encryption_keys() -> (String, String, String) {
    (text(&KEY_FILE), text(&ENCRYPTION_KEY), text(&OLD_KEYS))
}

/// `queen.dead_letter_missing_key`: whether a message sealed with an unknown key is filed
/// as a dead letter rather than stopping the pop.
pub fn dead_letter_missing_key() -> bool {
    DEAD_LETTER_MISSING_KEY.get()
}

/// `queen.compaction_interval`, in milliseconds (0: none).
pub fn compaction_interval_ms() -> i32 {
    COMPACTION_INTERVAL.get()
}

/// `queen.retention_interval`, in seconds (0: none).
pub fn retention_interval_s() -> i32 {
    RETENTION_INTERVAL.get()
}

/// `queen.rotation_min_size` in bytes, or `None` when rotation is off (-1).
pub fn rotation_min_bytes() -> Option<i64> {
    let kb = ROTATION_MIN_SIZE.get();
    (kb >= 0).then(|| i64::from(kb).saturating_mul(1024))
}

/// `queen.retention_database`: the one database to serve, or `None` (the default) for
/// every database where queen is installed.
pub fn only_database() -> Option<String> {
    Some(text(&ONLY_DATABASE)).filter(|s| !s.is_empty())
}

/// `queen.tracked_partitions` and `queen.max_reservations`: the offset registry's sizes.
pub fn offset_registry_sizes() -> (usize, usize) {
    (TRACKED_PARTITIONS.get() as usize, RESERVATIONS.get() as usize)
}

/// `queen.tracked_lanes` and `queen.max_leases`: the lane registry's sizes.
pub fn lane_registry_sizes() -> (usize, usize) {
    (TRACKED_LANES.get() as usize, MAX_LEASES.get() as usize)
}

/// `queen.max_databases`: databases the per-database state has room for.
pub fn max_databases() -> usize {
    MAX_DATABASES.get() as usize
}

/// `queen.failpoint` (builds with the `failpoints` feature only): the fail point armed in
/// this process, as `name` or `name:count`.
#[cfg(feature = "failpoints")]
pub fn failpoint() -> String {
    text(&FAILPOINT)
}

fn text(g: &Text) -> String {
    g.get().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Called first from `_PG_init`: defines every setting.
pub fn init() {
    user_settings();
    encryption_settings();
    #[cfg(feature = "failpoints")]
    GucRegistry::define_string_guc(
        c"queen.failpoint",
        c"Tests only: the fail point that panics next in this process (name, or name:count).",
        c"Exists only in builds with the failpoints feature.",
        &FAILPOINT,
        GucContext::Suset,
        GucFlags::default(),
    );
    // SAFETY: a plain read of a flag the postmaster sets while preloading libraries.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        maintenance_settings();
        shared_memory_settings();
    }
}

/// Settings any backend reads, and the workers' intervals.
fn user_settings() {
    GucRegistry::define_int_guc(
        c"queen.max_lease",
        c"The longest lease a pop may take, and an extend_lease may ask for (seconds).",
        c"Longer lease_seconds, extend_lease seconds or configure lease_time are refused (22023); \
          a queue's lease_time or a group's budget beyond it is cut to it.",
        &MAX_LEASE,
        1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_bool_guc(
        c"queen.durable_pop",
        c"Whether a pop's commit waits for its WAL flush.",
        c"Off (the default): a transaction whose only writes are one leasing pop's commits \
          without waiting for the WAL flush; a server crash can forget that lease, and its \
          messages are delivered again. Auto-ack pops and pops that create their group always \
          wait. On: the configured synchronous_commit applies to every pop.",
        &DURABLE_POP,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"queen.compaction_interval",
        c"Milliseconds between compaction passes of queen's background worker (0: none).",
        c"Each database's maintenance worker merges the small segments of single-message pushes there. \
          Needs shared_preload_libraries = 'queen'; without it, call queen.compact().",
        &COMPACTION_INTERVAL,
        0,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"queen.retention_interval",
        c"Seconds between retention passes of queen's background worker (0: none).",
        c"Each database's maintenance worker runs a retention pass over its queues. Needs shared_preload_libraries = 'queen'.",
        &RETENTION_INTERVAL,
        0,
        86_400,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"queen.rotation_min_size",
        c"Size the current segment generation must reach before a retention pass rotates the generations (-1: never).",
        c"A rotation copies what is still live in the oldest generation forward and empties it with TRUNCATE, \
          which frees its space even while a snapshot holds the xmin horizon back.",
        &ROTATION_MIN_SIZE,
        -1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_KB,
    );
}

fn encryption_settings() {
    let hidden = GucFlags::SUPERUSER_ONLY | GucFlags::NO_SHOW_ALL;
    GucRegistry::define_string_guc(
        c"queen.encryption_key_file",
        c"File holding the encryption keys: the sealing key, then older keys, one per line (64 hex digits each).",
        c"Only superusers set it. The file must be readable by the server's OS user alone (chmod 600).",
        &KEY_FILE,
        GucContext::Suset,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_bool_guc(
        c"queen.dead_letter_missing_key",
        c"Whether a pop dead-letters a message sealed with a key that is not configured.",
        c"Off (the default): such a message stops the pop with SQLSTATE 55000 until the key is configured. \
          On: it is filed as a dead letter (its envelope kept, so it can be replayed once the key is back) \
          and the partition goes on.",
        &DEAD_LETTER_MISSING_KEY,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"queen.encryption_key",
        c"Key (64 hex digits) that seals the payloads of encrypted queues, when no key file is set.",
        c"Superuser-only and hidden, but readable by pg_read_all_settings: prefer queen.encryption_key_file.",
        &ENCRYPTION_KEY,
        GucContext::Suset,
        hidden,
    );
    GucRegistry::define_string_guc(
        c"queen.encryption_old_keys",
        c"Earlier keys (comma-separated, 64 hex digits each) that still open envelopes, when no key file is set.",
        c"Superuser-only and hidden. For key rotation: envelopes name the key that sealed them.",
        &OLD_KEYS,
        GucContext::Suset,
        hidden,
    );
}

fn maintenance_settings() {
    GucRegistry::define_string_guc(
        c"queen.retention_database",
        c"Serve only this database with background maintenance (empty: every database where queen is installed).",
        c"Kept from 0.3.0, which served one database. Leave it empty.",
        &ONLY_DATABASE,
        GucContext::Sighup,
        GucFlags::default(),
    );
}

fn shared_memory_settings() {
    type Size = (&'static CStr, &'static CStr, &'static CStr, &'static GucSetting<i32>, i32, i32);
    let sizes: [Size; 5] = [
        (
            c"queen.tracked_partitions",
            c"Partitions whose offsets queen tracks in shared memory at once.",
            c"A partition beyond this is tracked again, from the database, when next pushed to or read.",
            &TRACKED_PARTITIONS,
            16,
            1 << 22,
        ),
        (
            c"queen.max_reservations",
            c"Offset reservations (a transaction's pushes to one partition) in flight at once.",
            c"A push beyond it fails with SQLSTATE 53400 until reservations end.",
            &RESERVATIONS,
            64,
            1 << 24,
        ),
        (
            c"queen.tracked_lanes",
            c"Lanes (partition x consumer group) whose cursor and lease queen keeps in shared memory at once.",
            c"An idle lane beyond this is dropped and read back from the database when used again.",
            &TRACKED_LANES,
            16,
            1 << 22,
        ),
        (
            c"queen.max_leases",
            c"Live leases (one per pop that claimed something) queen keeps at once.",
            c"Past it, expired leases make room; a pop that finds no room fails with SQLSTATE 53400.",
            &MAX_LEASES,
            16,
            1 << 22,
        ),
        (
            c"queen.max_databases",
            c"Databases with queen installed that queen keeps maintenance state for (worker, lane journal, counters).",
            c"A database beyond this gets no background maintenance, and its acks fail with SQLSTATE 53400.",
            &MAX_DATABASES,
            1,
            4096,
        ),
    ];
    for (name, short, long, setting, min, max) in sizes {
        GucRegistry::define_int_guc(name, short, long, setting, min, max, GucContext::Postmaster, GucFlags::default());
    }
}
