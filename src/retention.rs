//! Retention (docs/concepts.md, "Retention"): segments that every consumer group of a
//! queue has committed past, and that are older than the queue's `retention` seconds,
//! are deleted whole — one row per segment, never one per message. Dead letters are
//! never touched; a queue without consumer groups keeps everything.
//!
//! `queen.retain(queue)` does one pass; with `shared_preload_libraries = 'queen'` the
//! background worker (`worker`) runs one every `queen.retention_interval` seconds in the
//! database `queen.retention_database`.
//!
//! A partition remembers the highest offset deleted (`partitions.retained_through`), and
//! lanes created later (a new group subscribing to 'all', a repaired lane) start there:
//! they never ask for a segment that is gone. Retention locks the queue row FOR UPDATE
//! and lane creation FOR KEY SHARE, so a group being created is either seen by the pass
//! (its cursor holds segments back) or sees the pass's `retained_through`. A queue whose
//! row is locked (a group or partition being created, a configure) is skipped until the
//! next pass rather than waited for, and so is a partition whose row is locked (a
//! compaction pass, or a push without the offset registry).

use crate::generations::Rotated;
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::json;

use crate::errors::SpiExt;
use crate::spi::run;

pub static RETENTION_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(60);
pub static RETENTION_DATABASE: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(Some(c"postgres"));

/// Called from `_PG_init`: the settings, and the worker when preloading.
pub fn init() {
    GucRegistry::define_int_guc(
        c"queen.retention_interval",
        c"Seconds between retention passes of queen's background worker (0: none).",
        c"The worker runs queen.retain() in queen.retention_database. Needs shared_preload_libraries = 'queen'.",
        &RETENTION_INTERVAL,
        0,
        86_400,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    // Only the background worker reads it, and it only exists with preloading; a
    // server-start setting cannot be defined later anyway.
    // SAFETY: a plain read of a flag the postmaster sets while preloading libraries.
    if !unsafe { pgrx::pg_sys::process_shared_preload_libraries_in_progress } {
        return;
    }
    GucRegistry::define_string_guc(
        c"queen.retention_database",
        c"The database whose queen queues the background worker maintains (retention, compaction).",
        c"One database per cluster; other databases run queen.retain() and queen.compact() themselves (cron, pg_cron).",
        &RETENTION_DATABASE,
        GucContext::Postmaster,
        GucFlags::default(),
    );
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.retain(text) IS
  'queen: one retention pass: delete segments every group has committed past and older than the queue''s retention';
GRANT EXECUTE ON FUNCTION queen.retain(text) TO queen_admin;
"#,
    name = "retain_home",
    requires = [retain]
);

/// One retention pass over `queue`, or over every queue with `retention > 0`.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn retain(queue: default!(Option<&str>, "NULL")) -> JsonB {
    if let Some(q) = queue {
        crate::names::check_queue_name("queue", q);
        crate::citus::ensure_home(q);
    }
    let (queues, segments, bytes, rotated) = Spi::connect_mut(|client| {
        let (queues, segments, bytes) = retain_in(client, queue);
        // A pass over every queue also rotates the segment generations when that is due.
        let rotated = queue.is_none() && matches!(crate::generations::rotate(client), Rotated::Yes { .. });
        (queues, segments, bytes, rotated)
    });
    let mut out = json!({"queues": queues, "segmentsDeleted": segments, "bytesDeleted": bytes});
    if queue.is_none() {
        out["generationRotated"] = rotated.into();
    }
    JsonB(out)
}

pub fn retain_in(client: &mut pgrx::spi::SpiClient<'_>, queue: Option<&str>) -> (i64, i64, i64) {
    let queues: Vec<(i64, i32)> = run(
        client,
        "SELECT queue_id, retention FROM queen.queues
          WHERE retention > 0 AND ($1::text IS NULL OR name = $1)
          ORDER BY queue_id
            FOR UPDATE SKIP LOCKED",
        &[queue.into()],
    )
    .map(|r| (r.get(1).or_raise().unwrap(), r.get(2).or_raise().unwrap()))
    .collect();
    let (mut segments, mut bytes) = (0i64, 0i64);
    for &(queue_id, retention) in &queues {
        // The queue's partitions that nothing else holds (a compaction pass, a push without
        // the offset registry): the others wait for the next pass.
        let pids: Vec<pgrx::Uuid> = run(
            client,
            "SELECT partition_id FROM queen.partitions WHERE queue_id = $1
              ORDER BY partition_id FOR NO KEY UPDATE SKIP LOCKED",
            &[queue_id.into()],
        )
        .map(|r| r.get(1).or_raise().unwrap())
        .collect();
        // Per partition: the lowest cursor over the queue's groups (a group without a lane
        // there counts as 0); no group at all keeps everything. Both tiers.
        let row = run(
            client,
            "WITH floor AS (
               SELECT p.partition_id,
                      (SELECT coalesce(min(coalesce(queen._committed(l.partition_id, l.consumer_group, l.committed), 0)), 0)
                         FROM queen.groups g
                         LEFT JOIN queen.lanes l
                           ON l.partition_id = p.partition_id AND l.consumer_group = g.consumer_group
                        WHERE g.queue_id = $1) AS upto
                 FROM unnest($3::uuid[]) AS p(partition_id)
             ), gone AS (
               DELETE FROM queen.segments s
                USING floor f
                WHERE s.partition_id = f.partition_id AND s.last_offset <= f.upto
                  AND s.created_at < clock_timestamp() - make_interval(secs => $2)
               RETURNING s.partition_id, s.last_offset, octet_length(s.data) AS size
             ), gone_fresh AS (
               DELETE FROM queen.fresh_segments s
                USING floor f
                WHERE s.partition_id = f.partition_id AND s.last_offset <= f.upto
                  AND s.created_at < clock_timestamp() - make_interval(secs => $2)
               RETURNING s.partition_id, s.last_offset, octet_length(s.data) AS size
             ), all_gone AS (
               SELECT * FROM gone UNION ALL SELECT * FROM gone_fresh
             ), marked AS (
               UPDATE queen.partitions p SET retained_through = greatest(p.retained_through, m.last)
                 FROM (SELECT partition_id, max(last_offset) AS last FROM all_gone GROUP BY 1) m
                WHERE p.partition_id = m.partition_id
             )
             SELECT count(*)::int8, coalesce(sum(size), 0)::int8 FROM all_gone",
            &[queue_id.into(), f64::from(retention).into(), pids.into()],
        );
        let row = row.first();
        segments += row.get::<i64>(1).or_raise().unwrap_or(0);
        bytes += row.get::<i64>(2).or_raise().unwrap_or(0);
    }
    (queues.len() as i64, segments, bytes)
}
