//! Compaction: the small segments of the fresh tier are merged into large segments of the
//! durable tier (`queen_core::compaction` decides which). One partition at a time, in one
//! transaction: the merged segment is inserted and the small ones deleted together, so a
//! reader sees one or the other, and every offset holds what it held.
//!
//! `queen.compact(queue)` does one pass; with `shared_preload_libraries = 'queen'` the
//! background worker (`worker`) runs one every `queen.compaction_interval` milliseconds.
//!
//! A pass locks the partition row (`FOR NO KEY UPDATE SKIP LOCKED`): two passes, or a pass
//! and a retention pass, never work on one partition at once, and a partition that is busy
//! otherwise is left for the next pass. Pushes and pops do not wait for it.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::JsonB;
use queen_core::compaction::{plan, Seg, LIMITS};
use queen_core::segment::{self, Entry, Frame, Segment};
use serde_json::json;

use crate::clock::clock_now;
use crate::errors::{self, SpiExt};
use crate::spi::run;

pub static COMPACTION_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// Called from `_PG_init`.
pub fn init() {
    GucRegistry::define_int_guc(
        c"queen.compaction_interval",
        c"Milliseconds between compaction passes of queen's background worker (0: none).",
        c"The worker merges the small segments of single-message pushes in queen.retention_database. \
          Needs shared_preload_libraries = 'queen'; without it, call queen.compact().",
        &COMPACTION_INTERVAL,
        0,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
}

/// What a pass did.
#[derive(Default, Clone, Copy)]
pub struct Done {
    pub partitions: i64,
    pub merged: i64,
    pub written: i64,
    pub messages: i64,
}

impl Done {
    fn add(&mut self, o: Done) {
        self.partitions += o.partitions;
        self.merged += o.merged;
        self.written += o.written;
        self.messages += o.messages;
    }
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.compact(text) IS
  'queen: one compaction pass: merge the small segments of small pushes into large ones';
GRANT EXECUTE ON FUNCTION queen.compact(text) TO queen_admin;
"#,
    name = "compact_home",
    requires = [compact]
);

/// `queen.compact(queue)`: one compaction pass over a queue, or over every queue.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn compact(queue: default!(Option<&str>, "NULL")) -> JsonB {
    if let Some(q) = queue {
        crate::names::check_queue_name("queue", q);
        crate::citus::ensure_home(q);
    }
    // A merge must see every fresh segment of its run. A fixed snapshot may miss one
    // committed since it was taken (or copied forward by a rotation of the segment
    // generations), and the merged segment would then hold a gap at its offsets.
    // SAFETY: a plain read of the transaction's isolation level.
    if unsafe { pgrx::pg_sys::XactIsoLevel } >= pgrx::pg_sys::XACT_REPEATABLE_READ as i32 {
        crate::errors::raise(
            pgrx::PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            "queen: compact needs READ COMMITTED: under REPEATABLE READ or SERIALIZABLE the transaction's \
             snapshot may miss segments committed since it was taken"
                .to_string(),
        );
    }
    let mut done = Done::default();
    Spi::connect_mut(|client| {
        for pid in partitions_to_compact(client, queue) {
            done.add(compact_partition(client, pid, 0).0);
        }
    });
    JsonB(json!({
        "partitions": done.partitions,
        "segmentsMerged": done.merged,
        "segmentsWritten": done.written,
        "messages": done.messages,
    }))
}

/// Partitions with segments in the fresh tier (of one queue, or of all): a skip scan of
/// the fresh tier's primary key, one probe per partition.
pub fn partitions_to_compact(client: &mut SpiClient<'_>, queue: Option<&str>) -> Vec<pgrx::Uuid> {
    run(
        client,
        "WITH RECURSIVE f(pid) AS (
           SELECT (SELECT partition_id FROM queen.fresh_segments ORDER BY partition_id LIMIT 1)
           UNION ALL
           SELECT (SELECT s.partition_id FROM queen.fresh_segments s WHERE s.partition_id > f.pid
                    ORDER BY s.partition_id LIMIT 1)
             FROM f WHERE f.pid IS NOT NULL)
         SELECT f.pid FROM f
          WHERE f.pid IS NOT NULL
            AND ($1::text IS NULL OR EXISTS (
                  SELECT 1 FROM queen.partitions p JOIN queen.queues q ON q.queue_id = p.queue_id
                   WHERE p.partition_id = f.pid AND q.name = $1))",
        &[queue.into()],
    )
    .map(|r| r.get::<pgrx::Uuid>(1).or_raise().unwrap())
    .collect()
}

/// One message of a run, owned (the run's rows are read before the merged one is built).
struct Owned {
    message_id: [u8; 16],
    transaction_id: String,
    payload: Vec<u8>,
    created_at: i64,
    headers: Option<Vec<u8>>,
    deliver_at: Option<i64>,
}

/// Most fresh segments a pass reads from one partition.
const READ_MAX: usize = 100_000;

/// Merges the runs of one partition that `queen_core::compaction::plan` picks, among its
/// fresh segments from offset `from` on. Returns what it did and, unless the partition was
/// busy, the lowest offset a fresh segment of it may still start at once this commits:
/// where the next pass can start (`from` for it), so that it does not walk the index
/// entries of segments merged away, which a held snapshot keeps from being removed.
pub fn compact_partition(client: &mut SpiClient<'_>, pid: pgrx::Uuid, from: i64) -> (Done, Option<i64>) {
    let locked = run(
        client,
        "SELECT p.head FROM queen.partitions p WHERE p.partition_id = $1 FOR NO KEY UPDATE SKIP LOCKED",
        &[pid.into()],
    );
    let Some(head) = locked.into_iter().next().map(|r| r.get::<i64>(1).or_raise().unwrap()) else {
        return (Done::default(), None); // busy (or gone): the next pass
    };
    // Every fresh segment at or below the readable end is committed (its reservation has
    // ended), and any later one starts above it.
    let readable = crate::offsets::readable(pid, head);
    let fresh: Vec<Seg> = run(
        client,
        "SELECT first_offset, last_offset, created_at
           FROM queen.fresh_segments
          WHERE partition_id = $1 AND first_offset >= $3 AND first_offset <= $2
          ORDER BY first_offset LIMIT $4",
        &[pid.into(), readable.into(), from.into(), (READ_MAX as i64).into()],
    )
    .map(|r| Seg {
        fresh: true,
        first: r.get(1).or_raise().unwrap(),
        last: r.get(2).or_raise().unwrap(),
        created_at: r.get::<TimestampWithTimeZone>(3).or_raise().unwrap().into(),
    })
    .collect();
    let complete = fresh.len() < READ_MAX;
    let (Some(lo), Some(hi)) = (fresh.first().map(|s| s.first), fresh.last().map(|s| s.last)) else {
        return (Done::default(), Some(from.max(readable + 1)));
    };
    // Durable segments between them split runs (offsets of the two tiers never overlap).
    let mut segs: Vec<Seg> = run(
        client,
        "SELECT first_offset, last_offset FROM queen.segments
          WHERE partition_id = $1 AND first_offset BETWEEN $2 AND $3",
        &[pid.into(), lo.into(), hi.into()],
    )
    .map(|r| Seg {
        fresh: false,
        first: r.get(1).or_raise().unwrap(),
        last: r.get(2).or_raise().unwrap(),
        created_at: 0,
    })
    .chain(fresh)
    .collect();
    segs.sort_by_key(|s| s.first);
    let mut done = Done { partitions: 1, ..Done::default() };
    let mut merged = vec![false; segs.len()];
    for r in plan(&segs, readable, clock_now(), LIMITS) {
        let (first, last) = (segs[r.start].first, segs[r.end - 1].last);
        done.add(merge(client, pid, first, last));
        merged[r.start..r.end].fill(true);
    }
    // The first fresh segment left, else past everything read.
    let left = segs.iter().zip(&merged).find(|(s, m)| s.fresh && !**m).map(|(s, _)| s.first);
    let next = left.unwrap_or(if complete { readable + 1 } else { hi + 1 });
    (done, Some(next))
}

/// Replaces the fresh segments in `first..=last` by one durable segment with the same
/// entries: their messages at their offsets, and a gap at every offset none of them holds.
/// The small segments are deleted and read in one pass (`DELETE ... RETURNING`), and the
/// merged one inserted in the same transaction: readers see one or the other.
fn merge(client: &mut SpiClient<'_>, pid: pgrx::Uuid, first: i64, last: i64) -> Done {
    let mut slots: Vec<Option<Owned>> = (first..=last).map(|_| None).collect();
    let mut rows = 0i64;
    let mut newest = i64::MIN;
    let generation = crate::generations::current(client);
    for row in run(
        client,
        "DELETE FROM queen.fresh_segments WHERE partition_id = $1 AND first_offset BETWEEN $2 AND $3
         RETURNING first_offset, created_at, data",
        &[pid.into(), first.into(), last.into()],
    ) {
        rows += 1;
        let seg_first: i64 = row.get(1).or_raise().unwrap();
        let row_time: i64 = row.get::<TimestampWithTimeZone>(2).or_raise().unwrap().into();
        // Copied out per row (pgrx would copy a borrowed `&[u8]` into the transaction's
        // memory, where every run's bytes would stay until commit).
        let data: Vec<u8> = row.get(3).or_raise().unwrap();
        let seg = Segment::parse(&data).unwrap_or_else(|e| errors::corrupted(e));
        seg.for_each_in(0, usize::MAX, |i, entry| {
            if let Entry::Message(f) = entry {
                let offset = seg_first + i as i64;
                let created_at = f.created_at.unwrap_or(row_time);
                newest = newest.max(created_at);
                if let Some(slot) = slots.get_mut((offset - first) as usize) {
                    *slot = Some(Owned {
                        message_id: f.message_id,
                        transaction_id: f.transaction_id.to_string(),
                        payload: f.payload.to_vec(),
                        created_at,
                        headers: f.headers.map(<[u8]>::to_vec),
                        deliver_at: f.deliver_at,
                    });
                }
            }
        })
        .unwrap_or_else(|e| errors::corrupted(e));
    }
    let messages = slots.iter().flatten().count() as i64;
    let data = segment::encode(slots.iter().map(|s| match s {
        Some(m) => Entry::Message(Frame {
            message_id: m.message_id,
            transaction_id: &m.transaction_id,
            payload: &m.payload,
            created_at: Some(m.created_at),
            headers: m.headers.as_deref(),
            deliver_at: m.deliver_at,
        }),
        None => Entry::Gap,
    }));
    run(
        client,
        "INSERT INTO queen.segments (partition_id, first_offset, last_offset, created_at, data, generation)
         VALUES ($1, $2, $3, $4, $5, $6)",
        &[
            pid.into(),
            first.into(),
            last.into(),
            crate::clock::timestamptz(newest).into(),
            data.into(),
            generation.into(),
        ],
    );
    Done { partitions: 0, merged: rows, written: 1, messages }
}
