//! Compaction: the small segments of the fresh tier are merged into large segments of the
//! durable tier (`queen_core::compaction` picks the runs, bounded in offsets and in bytes).
//! One partition at a time, in one transaction: the merged segments are inserted and the
//! small ones deleted together, so a reader sees one or the other, and every offset holds
//! what it held.
//!
//! A run is merged as a stream: its small segments are read one at a time (a cursor) into
//! a `segment::Encoder`, so a merge holds about one merged segment's compressed bytes, not
//! every message of the run (see `merge`).
//!
//! A small segment that cannot be decoded does not stop compaction and is not lost: it is
//! copied unchanged into the durable tier at its offsets, between the merged segments
//! before and after it, with a WARNING. A pop meets it there as it would have in the fresh
//! tier, and files it as a dead letter (`segments::read_or_skip`).
//!
//! `queen.compact(queue)` does one pass; with `shared_preload_libraries = 'queen'` the
//! background worker (`worker`) runs one every `queen.compaction_interval` milliseconds.
//!
//! A pass locks the partition row (`FOR NO KEY UPDATE SKIP LOCKED`): two passes, or a pass
//! and a retention pass, never work on one partition at once, and a partition that is busy
//! otherwise is left for the next pass. Pushes and pops do not wait for it.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::spi::SpiClient;
use queen_core::compaction::{plan, Seg, LIMITS};
use queen_core::segment::{Encoder, Entry, Frame, Segment};

use crate::pg::clock::clock_now;
use crate::pg::errors::{self, SpiExt};
use crate::pg::spi::{cursor, fetch_one, run, run_map};
use crate::storage::segments::StoredBytea;

/// What a pass did.
#[derive(Default, Clone, Copy)]
pub struct Done {
    pub partitions: i64,
    pub merged: i64,
    pub written: i64,
    pub messages: i64,
}

impl Done {
    pub fn add(&mut self, o: Done) {
        self.partitions += o.partitions;
        self.merged += o.merged;
        self.written += o.written;
        self.messages += o.messages;
    }
}

/// Partitions with segments in the fresh tier (of one queue, or of all): a skip scan of
/// the fresh tier's primary key, one probe per partition.
pub fn partitions_to_compact(client: &mut SpiClient<'_>, queue_id: Option<i64>) -> Vec<pgrx::Uuid> {
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
            AND ($1::int8 IS NULL OR EXISTS (
                  SELECT 1 FROM queen.partitions p WHERE p.partition_id = f.pid AND p.queue_id = $1))",
        &[queue_id.into()],
    )
    .map(|r| r.get::<pgrx::Uuid>(1).or_raise().unwrap())
    .collect()
}

/// Most fresh segments a pass reads from one partition.
const READ_MAX: usize = 100_000;

/// Merges the runs of one partition that `queen_core::compaction::plan` picks, among its
/// fresh segments from offset `from` on. Returns what it did and, unless the partition was
/// busy, the lowest offset a fresh segment of it may still start at once this commits:
/// where the next pass can start (`from` for it), so that it does not walk the index
/// entries of segments merged away, which a held snapshot keeps from being removed.
pub fn compact_partition(client: &mut SpiClient<'_>, pid: pgrx::Uuid, from: i64) -> (Done, Option<i64>) {
    // (Results are freed as soon as read, `run_map`: a pass over many partitions keeps
    // none of them.)
    let locked = run_map(
        client,
        "SELECT true FROM queen.partitions p WHERE p.partition_id = $1 FOR NO KEY UPDATE SKIP LOCKED",
        &[pid.into()],
        |_| (),
    );
    if locked.is_empty() {
        return (Done::default(), None); // busy (or gone): the next pass
    }
    queen_core::fail::point("compaction.partition");
    // Every fresh segment at or below the readable end is committed (its reservation has
    // ended), and any later one starts above it.
    let readable = crate::offsets::readable(pid);
    let fresh: Vec<Seg> = run_map(
        client,
        "SELECT first_offset, last_offset, created_at, octet_length(data)
           FROM queen.fresh_segments
          WHERE partition_id = $1 AND first_offset >= $3 AND first_offset <= $2
          ORDER BY first_offset LIMIT $4",
        &[pid.into(), readable.into(), from.into(), (READ_MAX as i64).into()],
        |r| Seg {
            fresh: true,
            first: r.get(1).or_raise().unwrap(),
            last: r.get(2).or_raise().unwrap(),
            created_at: r.get::<TimestampWithTimeZone>(3).or_raise().unwrap().into(),
            // (The stored size: a toasted value is not fetched for it.)
            bytes: r.get::<i32>(4).or_raise().unwrap().into(),
        },
    );
    let complete = fresh.len() < READ_MAX;
    let (Some(lo), Some(hi)) = (fresh.first().map(|s| s.first), fresh.last().map(|s| s.last)) else {
        return (Done::default(), Some(from.max(readable + 1)));
    };
    // Durable segments between them split runs (offsets of the two tiers never overlap).
    let mut segs: Vec<Seg> = run_map(
        client,
        "SELECT first_offset, last_offset FROM queen.segments
          WHERE partition_id = $1 AND first_offset BETWEEN $2 AND $3",
        &[pid.into(), lo.into(), hi.into()],
        |r| Seg {
            fresh: false,
            first: r.get(1).or_raise().unwrap(),
            last: r.get(2).or_raise().unwrap(),
            created_at: 0,
            bytes: 0,
        },
    );
    segs.extend(fresh);
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

/// Replaces the fresh segments in `first..=last` by durable segments with the same
/// entries: their messages at their offsets, and a gap at every offset none of them holds.
/// Usually one merged segment; a fresh segment that cannot be decoded is copied unchanged
/// into the durable tier at its own offsets instead, between a merged segment of what
/// comes before it and one of what comes after (each inserted if it holds anything).
///
/// The fresh segments are read one at a time in offset order (a cursor), each decoded
/// whole and then pushed into an `Encoder`. Then they are deleted with one statement, which
/// must delete exactly the rows read (else an ERROR: the transaction rolls back, nothing
/// is lost), and the merged segment is inserted. The partition row lock taken by
/// `compact_partition` keeps any other compaction, and retention, off these rows meanwhile.
///
/// Memory: about the merged segment's compressed bytes (at most about `LIMITS.max_bytes`,
/// or one fresh segment larger than that), plus one fresh segment (its detoasted bytes and
/// its decoded entries), plus one raw block. Each fetched row is freed once read
/// (`spi::fetch_one`) and its detoasted bytes with it (`Scratch`); the INSERT of a merged
/// segment copies its bytes once more, for that statement only.
fn merge(client: &mut SpiClient<'_>, pid: pgrx::Uuid, first: i64, last: i64) -> Done {
    let generation = crate::storage::generations::current(client);
    let scratch = Scratch::new();
    let mut done = Done::default();
    let mut out = Output::new(first);
    let mut read = 0i64;
    let mut rows = cursor(
        client,
        "SELECT first_offset, last_offset, created_at, data FROM queen.fresh_segments
          WHERE partition_id = $1 AND first_offset BETWEEN $2 AND $3
          ORDER BY first_offset",
        &[pid.into(), first.into(), last.into()],
    );
    while fetch_one(&mut rows, |row| {
        read += 1;
        let seg_first: i64 = row.get(1).or_raise().unwrap();
        let seg_last: i64 = row.get(2).or_raise().unwrap();
        let row_time: i64 = row.get::<TimestampWithTimeZone>(3).or_raise().unwrap().into();
        let StoredBytea(datum) = row.get(4).or_raise().unwrap();
        if seg_first < out.next || seg_last < seg_first || seg_last > last {
            errors::internal(format_args!(
                "fresh segment {seg_first}..{seg_last} of partition {pid} does not fit the run {first}..{last} \
                 after offset {}",
                out.next - 1
            ));
        }
        // Offsets that no fresh segment holds (pushes that aborted) are gaps.
        while out.next < seg_first {
            out.push(Entry::Gap);
        }
        // SAFETY: `datum` is this row's non-null bytea. A toasted value is detoasted into
        // `scratch`, which is reset only after the last use of `data` below; one that is
        // not is in the row itself, which `fetch_one` frees only after this closure.
        let data: &[u8] = scratch.within(|| unsafe {
            pgrx::varlena::varlena_to_byte_slice(pg_sys::pg_detoast_datum_packed(datum.cast_mut_ptr()))
        });
        match decode(data, seg_first, seg_last, row_time) {
            Ok(entries) => out.push_decoded(&entries, row_time),
            Err(error) => {
                // Kept as it is, where a pop files it as a dead letter (as it would have in
                // the fresh tier).
                pgrx::warning!(
                    "queen: compaction kept the fresh segment at offsets {seg_first}..{seg_last} of partition {pid} \
                     as it is, in the durable tier: it cannot be decoded: {error}"
                );
                crate::pg::stats::record_corrupt_segment();
                let before = std::mem::replace(&mut out, Output::new(seg_last + 1));
                done.add(before.write(client, &scratch, pid, generation, row_time));
                insert(client, &scratch, pid, seg_first, seg_last, row_time, data, generation);
                done.written += 1;
            }
        }
        scratch.reset();
    })
    .is_some()
    {}
    drop(rows); // closes the cursor
    delete_run(client, pid, first, last, read);
    done.add(out.write(client, &scratch, pid, generation, clock_now()));
    done.merged = read;
    done
}

/// Deletes the run's fresh segments, which must be exactly the `read` rows merged (else
/// an ERROR: the transaction rolls back and nothing is lost).
fn delete_run(client: &mut SpiClient<'_>, pid: pgrx::Uuid, first: i64, last: i64, read: i64) {
    let deleted = run(
        client,
        "DELETE FROM queen.fresh_segments WHERE partition_id = $1 AND first_offset BETWEEN $2 AND $3",
        &[pid.into(), first.into(), last.into()],
    )
    .len() as i64;
    if deleted != read {
        errors::internal(format_args!(
            "compaction of partition {pid} read {read} fresh segments in {first}..{last} but deleted {deleted}"
        ));
    }
}

/// One message of a fresh segment, decoded and owned: a segment is decoded whole before
/// any of it goes to the encoder, so one that fails half way adds nothing.
struct Message {
    message_id: [u8; 16],
    transaction_id: String,
    payload: Vec<u8>,
    created_at: i64,
    headers: Option<Vec<u8>>,
    deliver_at: Option<i64>,
}

/// The entries of the fresh segment `data` at offsets `first..=last` (None: a gap), or why
/// it cannot be decoded (the checks of `segments::read_or_skip`).
fn decode(data: &[u8], first: i64, last: i64, row_time: i64) -> Result<Vec<Option<Message>>, String> {
    let seg = Segment::parse(data).map_err(|e| format!("segment {first}..{last}: {e}"))?;
    if seg.frame_count() as i64 != last - first + 1 {
        return Err(format!("segment {first}..{last} holds {} entries", seg.frame_count()));
    }
    let mut entries = Vec::new();
    seg.for_each_in(0, usize::MAX, |_, entry| {
        entries.push(match entry {
            Entry::Message(f) => Some(Message {
                message_id: f.message_id,
                transaction_id: f.transaction_id.to_string(),
                payload: f.payload.to_vec(),
                // Version 1 segments keep no time per message: the row's applies.
                created_at: f.created_at.unwrap_or(row_time),
                headers: f.headers.map(<[u8]>::to_vec),
                deliver_at: f.deliver_at,
            }),
            Entry::Gap => None,
        })
    })
    .map_err(|e| format!("segment {first}..{last}: {e}"))?;
    Ok(entries)
}

/// A merged segment being written.
struct Output {
    encoder: Encoder,
    first: i64,
    /// The offset its next entry holds.
    next: i64,
    messages: i64,
    newest_message: Option<i64>,
    /// The newest time of the fresh segments merged into it.
    newest_row: Option<i64>,
}

impl Output {
    fn new(first: i64) -> Self {
        Output { encoder: Encoder::new(true), first, next: first, messages: 0, newest_message: None, newest_row: None }
    }

    /// A fresh segment's entries, decoded whole (`decode`), written at `row_time`.
    fn push_decoded(&mut self, entries: &[Option<Message>], row_time: i64) {
        self.newest_row = self.newest_row.max(Some(row_time));
        for m in entries {
            self.push(match m {
                Some(m) => Entry::Message(Frame {
                    message_id: m.message_id,
                    transaction_id: &m.transaction_id,
                    payload: &m.payload,
                    created_at: Some(m.created_at),
                    headers: m.headers.as_deref(),
                    deliver_at: m.deliver_at,
                }),
                None => Entry::Gap,
            });
        }
    }

    fn push(&mut self, entry: Entry<'_>) {
        if let Entry::Message(f) = &entry {
            self.messages += 1;
            self.newest_message = self.newest_message.max(f.created_at);
        }
        self.encoder.push(entry);
        self.next += 1;
    }

    /// Inserts the merged segment, if it holds any entry. Its time is its newest message's,
    /// else the newest of its fresh segments', else `fallback` (it holds only gaps, before
    /// a segment that could not be decoded: that one's time).
    fn write(
        self,
        client: &mut SpiClient<'_>,
        scratch: &Scratch,
        pid: pgrx::Uuid,
        generation: i16,
        fallback: i64,
    ) -> Done {
        if self.encoder.is_empty() {
            return Done::default();
        }
        let created_at = self.newest_message.or(self.newest_row).unwrap_or(fallback);
        let (first, last, messages) = (self.first, self.next - 1, self.messages);
        insert(client, scratch, pid, first, last, created_at, self.encoder.finish(), generation);
        Done { partitions: 0, merged: 0, written: 1, messages }
    }
}

/// Inserts a segment into the durable tier. Its bytes are copied into `scratch` for the
/// statement (an owned `Vec` is freed once copied); the caller resets it.
#[allow(clippy::too_many_arguments)]
fn insert(
    client: &mut SpiClient<'_>,
    scratch: &Scratch,
    pid: pgrx::Uuid,
    first: i64,
    last: i64,
    created_at: i64,
    data: impl pgrx::IntoDatum,
    generation: i16,
) {
    let args: [pgrx::datum::DatumWithOid<'_>; 6] = scratch.within(|| {
        [
            pid.into(),
            first.into(),
            last.into(),
            crate::pg::clock::timestamptz(created_at).into(),
            data.into(),
            generation.into(),
        ]
    });
    run(
        client,
        "INSERT INTO queen.segments (partition_id, first_offset, last_offset, created_at, data, generation)
         VALUES ($1, $2, $3, $4, $5, $6)",
        &args,
    );
}

/// A memory context for the work on one fresh segment: emptied after each (`reset`), and
/// deleted with this value. pgrx converts values in longer-lived contexts (the SPI
/// connection's, or its parent, the transaction's), where every row's bytes would stay
/// until the connection or the transaction ends.
struct Scratch(pg_sys::MemoryContext);

impl Scratch {
    fn new() -> Self {
        // SAFETY: a new child of the current context (the SPI connection's): should an
        // ERROR cut the merge short, it is freed with its parent.
        Scratch(unsafe {
            pg_sys::AllocSetContextCreateExtended(
                pg_sys::CurrentMemoryContext,
                c"queen compaction".as_ptr(),
                pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
            )
        })
    }

    /// Runs `f` with this context current: what it pallocs lives until the next `reset`.
    /// `f` runs no statement (SPI switches contexts).
    fn within<R>(&self, f: impl FnOnce() -> R) -> R {
        // SAFETY: a live context of this backend; the previous one is current again after
        // `f` (an ERROR in `f` leaves the switch to error cleanup, and `drop`).
        let old = unsafe { pg_sys::MemoryContextSwitchTo(self.0) };
        let out = f();
        // SAFETY: as above.
        unsafe { pg_sys::MemoryContextSwitchTo(old) };
        out
    }

    /// Frees what was allocated in it: the caller holds nothing of it any more.
    fn reset(&self) {
        // SAFETY: a live context of this backend, not current (`within` switched back).
        unsafe { pg_sys::MemoryContextReset(self.0) };
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: the context is alive until here (its parent outlives this value); a panic
        // out of `within` may have left it current, and then its parent is made current.
        unsafe {
            if pg_sys::CurrentMemoryContext == self.0 {
                pg_sys::CurrentMemoryContext = pg_sys::MemoryContextGetParent(self.0);
            }
            pg_sys::MemoryContextDelete(self.0);
        }
    }
}
