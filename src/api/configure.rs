//! `queen.configure`: create or update a queue (docs/functions.md#configure).
//!
//! Its arguments are written once, here: the SQL declaration is generated from this
//! signature, and its COMMENT and GRANT name the function without an argument list.

use pgrx::datum::Interval;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use queen_core::policy::QueueOptions;

use crate::pg::cache;
use crate::pg::clock::interval_micros;
use crate::pg::errors::null_arg;
use crate::pg::settings;
use crate::pg::spi::{first_value, run};
use crate::queue::citus;
use crate::queue::encryption;
use crate::queue::names::check_queue_name;
use crate::queue::privileges::{self, Privilege};

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.configure IS
  'queen: create or update a queue; returns its options in camelCase';
"#,
    name = "configure_home",
    requires = [configure_queue]
);

/// `queen.configure` (docs/functions.md#configure): creates or updates a queue; every
/// option not given takes its default (`QueueOptions::CONFIGURED`). No option is cached, so
/// the next pop in every session sees it.
#[allow(clippy::too_many_arguments)]
#[pgrx::pg_extern(name = "configure", security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn configure_queue(
    queue: Option<&str>,
    lease_time: pgrx::default!(Option<i32>, 300),
    retry_limit: pgrx::default!(Option<i32>, 3),
    dead_letter_queue: pgrx::default!(Option<bool>, true),
    dlq_after_max_retries: pgrx::default!(Option<bool>, true),
    dedup_window: pgrx::default!(Option<i32>, 3600),
    encryption: pgrx::default!(Option<bool>, "NULL"),
    retention: pgrx::default!(Option<i32>, 0),
    retry_backoff: pgrx::default!(Option<pgrx::datum::Interval>, "'0s'"),
    retry_backoff_max: pgrx::default!(Option<pgrx::datum::Interval>, "'600s'"),
    delay: pgrx::default!(Option<pgrx::datum::Interval>, "'0s'"),
    create_groups: pgrx::default!(Option<bool>, true),
    partition_idle_ttl: pgrx::default!(Option<pgrx::datum::Interval>, "'0s'"),
    ttl: pgrx::default!(Option<pgrx::datum::Interval>, "'0s'"),
    max_depth: pgrx::default!(Option<i64>, "NULL"),
    dlq_retention: pgrx::default!(Option<pgrx::datum::Interval>, "'0s'"),
) -> pgrx::JsonB {
    let queue = queue.unwrap_or_else(|| null_arg("queue"));
    check_queue_name("queue", queue);
    citus::ensure_home(queue);
    privileges::require(Some(queue), Privilege::Admin);
    // NULL checks in argument order (the first NULL argument is the one named).
    let lease_time = lease_time.unwrap_or_else(|| null_arg("lease_time"));
    let retry_limit = retry_limit.unwrap_or_else(|| null_arg("retry_limit"));
    let dead_letter_queue = dead_letter_queue.unwrap_or_else(|| null_arg("dead_letter_queue"));
    let dlq_after_max_retries = dlq_after_max_retries.unwrap_or_else(|| null_arg("dlq_after_max_retries"));
    let dedup_window = dedup_window.unwrap_or_else(|| null_arg("dedup_window"));
    let retention = retention.unwrap_or_else(|| null_arg("retention"));
    let retry_backoff = retry_backoff.unwrap_or_else(|| null_arg("retry_backoff"));
    let retry_backoff_max = retry_backoff_max.unwrap_or_else(|| null_arg("retry_backoff_max"));
    let delay = delay.unwrap_or_else(|| null_arg("delay"));
    let create_groups = create_groups.unwrap_or_else(|| null_arg("create_groups"));
    let partition_idle_ttl = partition_idle_ttl.unwrap_or_else(|| null_arg("partition_idle_ttl"));
    let ttl = ttl.unwrap_or_else(|| null_arg("ttl"));
    let dlq_retention = dlq_retention.unwrap_or_else(|| null_arg("dlq_retention"));
    let intervals = Intervals { retry_backoff, retry_backoff_max, delay, partition_idle_ttl, ttl, dlq_retention };
    let options = QueueOptions {
        lease_time,
        retry_limit,
        dead_letter_queue,
        dlq_after_max_retries,
        dedup_window,
        encryption: encryption.unwrap_or(false),
        retention,
        retry_backoff: interval_micros("retry_backoff", retry_backoff),
        retry_backoff_max: interval_micros("retry_backoff_max", retry_backoff_max),
        delay: interval_micros("delay", delay),
        create_groups,
        partition_idle_ttl: interval_micros("partition_idle_ttl", partition_idle_ttl),
        ttl: interval_micros("ttl", ttl),
        max_depth,
        dlq_retention: interval_micros("dlq_retention", dlq_retention),
    };
    if let Err(v) = options.validate(settings::max_lease()) {
        crate::pg::errors::violation(v);
    }
    if encryption == Some(true) {
        encryption::require_key(queue);
    }
    cache::invalidate();
    let encryption = pgrx::Spi::connect_mut(|client| store(client, queue, &options, &intervals, encryption));
    answer(&options, encryption)
}

/// The interval options as given: the table keeps them as written ('1 day' stays so).
struct Intervals {
    retry_backoff: Interval,
    retry_backoff_max: Interval,
    delay: Interval,
    partition_idle_ttl: Interval,
    ttl: Interval,
    dlq_retention: Interval,
}

/// Creates or updates the queue's row, after the queue lock (`queen_core::lock_order`)
/// when it exists. `encryption` not given keeps a plaintext queue plaintext, and refuses
/// on an encrypted one: turning it off silently would store the next payloads in
/// plaintext. Returns whether the queue is encrypted now.
fn store(
    client: &mut SpiClient<'_>,
    queue: &str,
    o: &QueueOptions,
    intervals: &Intervals,
    encryption: Option<bool>,
) -> bool {
    // Checked again (privileges, module docs): on the queue locked, or by name when there
    // is none now, since the upsert below then creates it.
    let found = privileges::lock_queue(client, queue, Privilege::Admin);
    if found.is_none() {
        privileges::require(Some(queue), Privilege::Admin);
    }
    let encryption = encryption.unwrap_or_else(|| {
        let stored =
            first_value::<bool>(run(client, "SELECT encryption FROM queen.queues WHERE name = $1", &[queue.into()]));
        if stored == Some(true) {
            crate::pg::errors::raise(
                pgrx::PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!(
                    "queen: queue {queue:?} is encrypted: pass encryption => true to keep it so, \
                     or encryption => false to store new payloads in plaintext"
                ),
            );
        }
        false
    });
    let stored = first_value::<i64>(run(
        client,
        "INSERT INTO queen.queues AS q (name, lease_time, retry_limit, dead_letter_queue,
                                       dlq_after_max_retries, dedup_window, encryption, retention,
                                       retry_backoff, retry_backoff_max, delay, create_groups,
                                       partition_idle_ttl, ttl, max_depth, dlq_retention)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
         ON CONFLICT (name) DO UPDATE SET
           lease_time = EXCLUDED.lease_time, retry_limit = EXCLUDED.retry_limit,
           dead_letter_queue = EXCLUDED.dead_letter_queue,
           dlq_after_max_retries = EXCLUDED.dlq_after_max_retries,
           dedup_window = EXCLUDED.dedup_window, encryption = EXCLUDED.encryption,
           retention = EXCLUDED.retention, retry_backoff = EXCLUDED.retry_backoff,
           retry_backoff_max = EXCLUDED.retry_backoff_max, delay = EXCLUDED.delay,
           create_groups = EXCLUDED.create_groups, partition_idle_ttl = EXCLUDED.partition_idle_ttl,
           ttl = EXCLUDED.ttl, max_depth = EXCLUDED.max_depth, dlq_retention = EXCLUDED.dlq_retention,
           updated_at = clock_timestamp()
         RETURNING queue_id",
        &[
            queue.into(),
            o.lease_time.into(),
            o.retry_limit.into(),
            o.dead_letter_queue.into(),
            o.dlq_after_max_retries.into(),
            o.dedup_window.into(),
            encryption.into(),
            o.retention.into(),
            intervals.retry_backoff.into(),
            intervals.retry_backoff_max.into(),
            intervals.delay.into(),
            o.create_groups.into(),
            intervals.partition_idle_ttl.into(),
            intervals.ttl.into(),
            o.max_depth.into(),
            intervals.dlq_retention.into(),
        ],
    ));
    // A queue made by this upsert, or one found by name that another session created after
    // the check above: the privilege on the row written (a refusal rolls the write back).
    if let Some(id) = stored.filter(|_| found.is_none()) {
        privileges::require_id(client, id, Privilege::Admin);
    }
    if found.is_none() {
        // A queue created while `distribute()` ran waited for it at this insert.
        citus::recheck_created(queue);
    }
    encryption
}

/// configure's answer: the queue's options, in camelCase, intervals in seconds.
fn answer(o: &QueueOptions, encryption: bool) -> pgrx::JsonB {
    let secs = |m: i64| m as f64 / queen_core::lease::MICROS as f64;
    pgrx::JsonB(serde_json::json!({
        "leaseTime": o.lease_time,
        "retryLimit": o.retry_limit,
        "deadLetterQueue": o.dead_letter_queue,
        "dlqAfterMaxRetries": o.dlq_after_max_retries,
        "dedupWindow": o.dedup_window,
        "encryption": encryption,
        "retention": o.retention,
        "retryBackoff": secs(o.retry_backoff),
        "retryBackoffMax": secs(o.retry_backoff_max),
        "delay": secs(o.delay),
        "createGroups": o.create_groups,
        "partitionIdleTtl": secs(o.partition_idle_ttl),
        "ttl": secs(o.ttl),
        "maxDepth": o.max_depth,
        "dlqRetention": secs(o.dlq_retention),
    }))
}

crate::pg::srf::older_sql_symbol!(
    pg_finfo_configure_wrapper,
    configure_wrapper,
    "The C symbol of `queen.configure` up to 0.3.0, whose SQL declared 11 arguments."
);
