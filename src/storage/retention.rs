//! Retention (docs/concepts.md, "Retention"): segments that every consumer group of a
//! queue has committed past, and that are older than the queue's `retention` seconds,
//! are deleted whole — one row per segment, never one per message. Dead letters are
//! never touched; a queue without consumer groups keeps everything.
//!
//! `queen.retain(queue)` does one pass; with `shared_preload_libraries = 'queen'` each
//! database's maintenance worker (`worker`) runs one every `queen.retention_interval`
//! seconds, each queue in a transaction of its own.
//!
//! A partition remembers the highest offset deleted (`partitions.retained_through`), and
//! lanes created later (a new group subscribing to 'all', a repaired lane) start there:
//! they never ask for a segment that is gone. A retention step takes the queue's
//! lane-creation lock exclusively and lane creation takes it in share mode
//! (`locks::lanes_creation`), so a group being created is either seen by the step (its
//! cursor holds segments back) or sees the step's `retained_through`. A queue whose lock is
//! busy (a group being created, a seek, a delete_queue) is skipped until the next pass
//! rather than waited for, and so is a partition whose row is locked (a compaction pass,
//! a rotation's move, or a push without the offset registry). Retention reads each
//! lane's last committed cursor: an ack that has not committed never lets it delete what
//! the ack covered.

use pgrx::spi::SpiClient;

use crate::pg::errors::SpiExt;
use crate::pg::spi::run;

/// The queues a retention pass looks at: those with `retention > 0` (of one queue, by
/// name, when given).
pub fn queues_due(client: &mut SpiClient<'_>) -> Vec<(i64, i32)> {
    queues_named(client, None)
}

fn queues_named(client: &mut SpiClient<'_>, queue_id: Option<i64>) -> Vec<(i64, i32)> {
    run(
        client,
        "SELECT queue_id, retention FROM queen.queues
          WHERE retention > 0 AND ($1::int8 IS NULL OR queue_id = $1)
          ORDER BY queue_id",
        &[queue_id.into()],
    )
    .map(|r| (r.get(1).or_raise().unwrap(), r.get(2).or_raise().unwrap()))
    .collect()
}

/// One pass over the queue of id `queue_id`, or over every queue with `retention > 0`, in
/// the caller's transaction. Returns (queues, segments deleted, bytes freed).
pub fn retain_in(client: &mut SpiClient<'_>, queue_id: Option<i64>) -> (i64, i64, i64) {
    let queues = queues_named(client, queue_id);
    let (mut done, mut segments, mut bytes) = (0i64, 0i64, 0i64);
    for (queue_id, retention) in queues {
        if let Some((s, b)) = retain_queue(client, queue_id, retention) {
            done += 1;
            segments += s;
            bytes += b;
        }
    }
    (done, segments, bytes)
}

/// Retention of one queue: deletes, per partition, the segments (of both tiers) that every
/// consumer group has committed past and that are older than `retention` seconds. Returns
/// (segments, bytes), or None when the queue was busy (a group being created, a seek, a
/// delete_queue: it is skipped, never waited for) or is gone.
///
/// Locks, none of them waited for: the queue lock in share mode (a `delete_queue` holds it
/// exclusively), and the queue's lane-creation lock exclusively (`locks::lanes_creation`:
/// a new group's lanes are either seen here, their cursors holding segments back, or start
/// at what this step deleted; a seek's rewind is never undercut). No row lock of the queue
/// is taken: pushes, acks, configure and pops never wait for retention (a pop skips creating
/// a lane while a step runs). The partitions it works on are locked `FOR NO KEY UPDATE SKIP
/// LOCKED` (a compaction pass, a rotation's move, or a push without the offset registry
/// holds the others: they wait for the next pass).
pub fn retain_queue(client: &mut SpiClient<'_>, queue_id: i64, retention: i32) -> Option<(i64, i64)> {
    queen_core::fail::point("retention.queue");
    if !crate::pg::locks::try_share_queue(queue_id) {
        return None;
    }
    // Without the registry, after a crash: the cursors the journal holds first (a seek
    // back is only there; the row's newer cursor would let this delete what it rewinds
    // to). Without waiting, as for every lock here: a session saving it now makes this
    // queue wait for the next pass.
    if !crate::lane::settle_journal(client, false) {
        return None;
    }
    if !crate::pg::locks::lanes_creation(queue_id, true, false) {
        return None;
    }
    // The queue's partitions that nothing else holds.
    let pids: Vec<pgrx::Uuid> = run(
        client,
        "SELECT partition_id FROM queen.partitions WHERE queue_id = $1
          ORDER BY partition_id FOR NO KEY UPDATE SKIP LOCKED",
        &[queue_id.into()],
    )
    .map(|r| r.get(1).or_raise().unwrap())
    .collect();
    // Per partition: the lowest committed cursor over the queue's groups (a group without
    // a lane there counts as 0); no group at all keeps everything. Both tiers. A cursor an
    // ack in flight moved is not committed: `_committed` gives the last committed one.
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
         ), cutoff AS (
           SELECT clock_timestamp() - make_interval(secs => $2) AS at
         ), young AS (
           -- A segment below the floor that is not old enough yet stops the deletion at
           -- its start: what goes is a prefix of the partition, so that retained_through
           -- (the end of what went) never passes a message that is still kept. A segment's
           -- created_at is its push's transaction start, which does not grow with offsets.
           SELECT y.partition_id, min(y.first_offset) AS first
             FROM (SELECT s.partition_id, s.first_offset FROM queen.segments s, floor f, cutoff c
                    WHERE s.partition_id = f.partition_id AND s.first_offset <= f.upto AND s.created_at >= c.at
                   UNION ALL
                   SELECT s.partition_id, s.first_offset FROM queen.fresh_segments s, floor f, cutoff c
                    WHERE s.partition_id = f.partition_id AND s.first_offset <= f.upto AND s.created_at >= c.at) y
            GROUP BY 1
         ), bound AS (
           SELECT f.partition_id, least(f.upto, coalesce(y.first - 1, f.upto)) AS upto
             FROM floor f LEFT JOIN young y USING (partition_id)
         ), gone AS (
           DELETE FROM queen.segments s
            USING bound f, cutoff c
            WHERE s.partition_id = f.partition_id AND s.last_offset <= f.upto AND s.created_at < c.at
           RETURNING s.partition_id, s.last_offset, octet_length(s.data) AS size
         ), gone_fresh AS (
           DELETE FROM queen.fresh_segments s
            USING bound f, cutoff c
            WHERE s.partition_id = f.partition_id AND s.last_offset <= f.upto AND s.created_at < c.at
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
    Some((row.get::<i64>(1).or_raise().unwrap_or(0), row.get::<i64>(2).or_raise().unwrap_or(0)))
}
