//! Reading segments: the only place that turns stored bytes back into frames.
//!
//! A partition's segments live in two tiers: `queen.segments` (large pushes and merged
//! runs) and `queen.fresh_segments` (small pushes, until compaction merges them). Their
//! offsets never overlap; a read looks at both.
//!
//! `queen.segments.data` is stored EXTERNAL (TOAST without compression: the codec
//! compresses), so PostgreSQL can fetch a byte range of it without reading the rest.
//! A read fetches the segment's header first, then only the bytes of the blocks that
//! hold the offsets it wants: a pop of 100 messages from a segment of 10,000 reads about
//! 1/100 of it, not all of it.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::spi::{SpiClient, SpiHeapTupleData};
use queen_core::compaction::FRESH_MAX;
use queen_core::segment::{CodecError, Directory, Entry, Frame, Place};

use crate::errors::{self, SpiExt};
use crate::spi::run;

/// First fetch of a segment: enough for the header of a segment of about 20,000 frames.
/// A longer header is fetched again, eight times longer each round.
const HEAD_BYTES: usize = 4096;

/// A `bytea` column value as it sits in the SPI result: possibly a TOAST pointer, not
/// fetched until `slice` asks for a range of it.
pub(crate) struct StoredBytea(pub(crate) pg_sys::Datum);

impl pgrx::FromDatum for StoredBytea {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _: pg_sys::Oid) -> Option<Self> {
        (!is_null).then_some(StoredBytea(datum))
    }
}

impl pgrx::IntoDatum for StoredBytea {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::BYTEAOID
    }
}

/// Bytes `[start, start + len)` of a bytea datum, fetched from TOAST without reading the
/// rest. The copy lives in the current (SPI) memory context, which lasts as long as the
/// SPI connection: the lifetime `'conn` of the row the datum came from says so.
fn slice<'conn>(_row: &SpiHeapTupleData<'conn>, datum: pg_sys::Datum, start: usize, len: usize) -> &'conn [u8] {
    // SAFETY: `datum` is a non-null bytea of `_row`, valid while that SPI result is;
    // detoast_attr_slice pallocs the copy in the current memory context, which lives as
    // long as the SPI connection that produced `_row` ('conn).
    unsafe {
        let v = pg_sys::detoast_attr_slice(datum.cast_mut_ptr::<pg_sys::varlena>(), start as i32, len as i32);
        pgrx::varlena::varlena_to_byte_slice(v)
    }
}

/// Calls `emit(offset, message)` for the offsets `start..=end` of a partition, in order,
/// decoding only the blocks that hold them: `Some((frame, created_at))` for a message,
/// `None` for an offset that holds none (a gap, or an offset no segment covers). `emit` returns false
/// to stop early. Segments of both tiers are read in one statement, so a compaction that
/// commits meanwhile is seen whole or not at all. A corrupt segment is an ERROR (XX001).
pub fn read(
    client: &mut SpiClient<'_>,
    partition_id: pgrx::Uuid,
    start: i64,
    end: i64,
    emit: impl FnMut(i64, Option<(Frame<'_>, TimestampWithTimeZone)>) -> bool,
) {
    read_or_skip(client, partition_id, start, end, emit, None);
}

/// A segment that cannot be decoded: its offsets (`from..=last` were not handed out),
/// why, and its stored bytes.
pub struct Corrupt {
    pub segment_first: i64,
    pub from: i64,
    pub last: i64,
    pub error: String,
    pub bytes: Vec<u8>,
}

/// `read`, except that a corrupt segment is handed to `corrupt` (when given) and its
/// offsets are passed over, instead of an ERROR: a pop files it as a dead letter and
/// goes on with the partition.
pub fn read_or_skip(
    client: &mut SpiClient<'_>,
    partition_id: pgrx::Uuid,
    start: i64,
    end: i64,
    emit: impl FnMut(i64, Option<(Frame<'_>, TimestampWithTimeZone)>) -> bool,
    corrupt: Option<&mut dyn FnMut(Corrupt)>,
) {
    read_rows(fetch(client, partition_id, start, end), partition_id, start, end, emit, corrupt);
}

/// The segment rows a read of offsets `lo..=hi` of one partition needs: the segment of each
/// tier that holds `lo`, and those that begin after it up to `hi`. `data` stays a TOAST
/// pointer until a read slices it.
pub struct Rows<'conn> {
    pub lo: i64,
    pub hi: i64,
    rows: Vec<(i64, i64, SpiHeapTupleData<'conn>)>,
    /// Columns before `first_offset, last_offset, created_at, data` in each row.
    skip: usize,
}

/// The rows of one partition's read, in one statement. The fresh tier is skipped when no
/// push wrote there at or after `start` (`offsets`).
pub fn fetch<'conn>(client: &mut SpiClient<'conn>, partition_id: pgrx::Uuid, start: i64, end: i64) -> Rows<'conn> {
    // Per tier: the segment that holds `start`, then the ones that begin inside the span:
    // tight range scans of the primary keys.
    let rows = if crate::offsets::may_be_fresh(partition_id, start) {
        // A fresh segment holds fewer than FRESH_MAX offsets, so the one holding `start`
        // begins after `start - FRESH_MAX`. The bound keeps the probe off the index entries
        // of segments compaction has replaced: while a snapshot holds the xmin horizon
        // back they cannot be removed, and an unbounded probe would walk them all.
        let floor = start - FRESH_MAX as i64;
        run(
            client,
            "(SELECT first_offset, last_offset, created_at, data FROM queen.segments
               WHERE partition_id = $1 AND first_offset <= $2
               ORDER BY first_offset DESC LIMIT 1)
             UNION ALL
             (SELECT first_offset, last_offset, created_at, data FROM queen.segments
               WHERE partition_id = $1 AND first_offset > $2 AND first_offset <= $3)
             UNION ALL
             (SELECT first_offset, last_offset, created_at, data FROM queen.fresh_segments
               WHERE partition_id = $1 AND first_offset <= $2 AND first_offset > $4
               ORDER BY first_offset DESC LIMIT 1)
             UNION ALL
             (SELECT first_offset, last_offset, created_at, data FROM queen.fresh_segments
               WHERE partition_id = $1 AND first_offset > $2 AND first_offset <= $3)",
            &[partition_id.into(), start.into(), end.into(), floor.into()],
        )
    } else {
        run(
            client,
            "(SELECT first_offset, last_offset, created_at, data FROM queen.segments
               WHERE partition_id = $1 AND first_offset <= $2
               ORDER BY first_offset DESC LIMIT 1)
             UNION ALL
             (SELECT first_offset, last_offset, created_at, data FROM queen.segments
               WHERE partition_id = $1 AND first_offset > $2 AND first_offset <= $3)",
            &[partition_id.into(), start.into(), end.into()],
        )
    };
    let rows =
        rows.map(|row| (row.get::<i64>(1).or_raise().unwrap(), row.get::<i64>(2).or_raise().unwrap(), row)).collect();
    Rows { lo: start, hi: end, rows, skip: 0 }
}

/// `fetch` for several partitions at once (a pop's lanes), in one statement: each span
/// `(partition, lo, hi)` gets its rows, in the order given. One statement instead of one
/// per lane: starting an executor for a read of the two tiers over both segment
/// generations was most of the cost of a pop that reads many lanes. Like `fetch`, one
/// statement sees a compaction whole or not at all.
pub fn fetch_many<'conn>(client: &mut SpiClient<'conn>, spans: &[(pgrx::Uuid, i64, i64)]) -> Vec<Rows<'conn>> {
    let pids: Vec<pgrx::Uuid> = spans.iter().map(|s| s.0).collect();
    let los: Vec<i64> = spans.iter().map(|s| s.1).collect();
    let his: Vec<i64> = spans.iter().map(|s| s.2).collect();
    let fresh: Vec<bool> = spans.iter().map(|s| crate::offsets::may_be_fresh(s.0, s.1)).collect();
    let mut out: Vec<Rows<'conn>> =
        spans.iter().map(|&(_, lo, hi)| Rows { lo, hi, rows: Vec::new(), skip: 1 }).collect();
    for row in run(
        client,
        "SELECT l.i, s.first_offset, s.last_offset, s.created_at, s.data
           FROM unnest($1::uuid[], $2::int8[], $3::int8[], $4::bool[]) WITH ORDINALITY AS l(pid, lo, hi, fresh, i)
          CROSS JOIN LATERAL (
            (SELECT first_offset, last_offset, created_at, data FROM queen.segments
              WHERE partition_id = l.pid AND first_offset <= l.lo
              ORDER BY first_offset DESC LIMIT 1)
            UNION ALL
            (SELECT first_offset, last_offset, created_at, data FROM queen.segments
              WHERE partition_id = l.pid AND first_offset > l.lo AND first_offset <= l.hi)
            UNION ALL
            (SELECT first_offset, last_offset, created_at, data FROM queen.fresh_segments
              WHERE l.fresh AND partition_id = l.pid AND first_offset <= l.lo AND first_offset > l.lo - $5
              ORDER BY first_offset DESC LIMIT 1)
            UNION ALL
            (SELECT first_offset, last_offset, created_at, data FROM queen.fresh_segments
              WHERE l.fresh AND partition_id = l.pid AND first_offset > l.lo AND first_offset <= l.hi)
          ) s",
        &[pids.into(), los.into(), his.into(), fresh.into(), (FRESH_MAX as i64).into()],
    ) {
        let i = row.get::<i64>(1).or_raise().unwrap() as usize - 1;
        let first = row.get::<i64>(2).or_raise().unwrap();
        let last = row.get::<i64>(3).or_raise().unwrap();
        out[i].rows.push((first, last, row));
    }
    out
}

/// `read_or_skip` over rows fetched before (`fetch`, `fetch_many`) for a span that holds
/// `start..=end`: `rows.lo == start` and `end <= rows.hi`.
pub fn read_rows(
    rows: Rows<'_>,
    partition_id: pgrx::Uuid,
    start: i64,
    end: i64,
    mut emit: impl FnMut(i64, Option<(Frame<'_>, TimestampWithTimeZone)>) -> bool,
    mut corrupt: Option<&mut dyn FnMut(Corrupt)>,
) {
    debug_assert!(rows.lo == start && end <= rows.hi);
    // In offset order (sorted here: a Sort node in the statement costs more than these
    // few rows do).
    let skip = rows.skip;
    let mut rows = rows.rows;
    rows.sort_unstable_by_key(|r| r.0);
    let mut next = start;
    for (first, last, row) in rows {
        if last < next {
            continue; // ends before the span (the segment before `start`)
        }
        let created_at: TimestampWithTimeZone = row.get(3 + skip).or_raise().unwrap();
        // Offsets no segment covers, up to this one.
        while next < first && next <= end {
            if !emit(next, None) {
                return;
            }
            next += 1;
        }
        if next > end {
            break;
        }
        let StoredBytea(datum) = row.get(4 + skip).or_raise().unwrap();
        // SAFETY: `datum` is a non-null bytea of this row.
        let total = unsafe { pg_sys::toast_raw_datum_size(datum) } - pg_sys::VARHDRSZ;
        // A corrupt segment: an ERROR, or handed over and passed.
        let mut skip = |from: i64, error: String| {
            let Some(handler) = corrupt.as_mut() else {
                errors::corrupted(format_args!("{error} (partition {partition_id})"))
            };
            handler(Corrupt { segment_first: first, from, last, error, bytes: slice(&row, datum, 0, total).to_vec() });
        };
        let mut head = slice(&row, datum, 0, HEAD_BYTES.min(total));
        let parsed = loop {
            match Directory::parse(head, total) {
                Ok(dir) => break Ok(dir),
                Err(CodecError::Truncated(_)) if head.len() < total => {
                    head = slice(&row, datum, 0, (head.len() * 8).min(total));
                }
                Err(e) => break Err(e.to_string()),
            }
        };
        let dir = match parsed {
            Ok(dir) if dir.frame_count() as i64 == last - first + 1 => dir,
            Ok(dir) => {
                skip(next, format!("segment {first}..{last} holds {} entries", dir.frame_count()));
                next = last + 1;
                continue;
            }
            Err(e) => {
                skip(next, format!("segment {first}..{last}: {e}"));
                next = last + 1;
                continue;
            }
        };
        let from = (next - first) as usize;
        let to = (end.min(last) - first + 1) as usize;
        let Some((s, e)) = dir.span(from, to) else { continue };
        // The header fetch may already hold the span (a small segment: all of it).
        let body = if e <= head.len() { &head[s..e] } else { slice(&row, datum, s, e - s) };
        let mut go_on = true;
        // Decompressed blocks are kept per backend by place (`segment::Place`): the next
        // pop of a lane usually reads on in the same block.
        let place = Place { partition: *partition_id.as_bytes(), first, last };
        let decoded = dir.for_each_in_at(Some(place), body, s, from, to, |i, entry| {
            if !go_on {
                return;
            }
            let offset = first + i as i64;
            next = offset + 1;
            go_on = match entry {
                Entry::Message(f) => {
                    // Version 1 segments keep no time per message: the row's applies.
                    let at = f.created_at.map(crate::clock::timestamptz).unwrap_or(created_at);
                    emit(offset, Some((f, at)))
                }
                Entry::Gap => emit(offset, None),
            };
        });
        // A block that fails its checks: the entries before it were handed out; the rest
        // of the segment is corrupt.
        if !go_on {
            return;
        }
        if let Err(e) = decoded {
            skip(next, format!("segment {first}..{last}: {e}"));
            next = last + 1;
            continue;
        }
    }
    // Offsets past the last segment.
    while next <= end {
        if !emit(next, None) {
            return;
        }
        next += 1;
    }
}
