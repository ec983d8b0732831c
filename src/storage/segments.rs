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
//!
//! It fetches those blocks a chunk at a time, in order, decoding each chunk before it
//! fetches the next and freeing it then: a chunk holds as many blocks as fit in the smaller
//! of `CHUNK_BYTES` and the caller's `Room` (what a pop's byte budget has left), and one
//! block at least, however large. A read stops fetching as soon as `emit` says stop or the
//! budget is spent. So it holds one chunk of stored bytes at a time: at most min(budget
//! left, 1 MiB), or one block when a block is larger (one message, when messages are large).

use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::spi::SpiClient;
use queen_core::compaction::FRESH_MAX;
use queen_core::segment::{CodecError, Directory, Entry, Frame, Place};

use crate::pg::errors::{self, SpiExt};
use crate::pg::spi::run;

/// First fetch of a segment: enough for the header of a segment of about 20,000 frames.
/// A longer header is fetched again, eight times longer each round.
const HEAD_BYTES: usize = 4096;

/// Most stored bytes a read fetches at once, unless one block is larger: what it holds
/// before decoding stays small whatever the budget.
const CHUNK_BYTES: usize = 1 << 20;

/// How much more a read may fetch, asked before each chunk of blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// No limit of the caller's (one offset, or a bounded range).
    Unlimited,
    /// A pop's byte budget: `left` bytes (zero or less once spent), and whether the pop
    /// took a message yet. Spent after taking one, the read stops.
    Budget { left: i64, any: bool },
}

impl Room {
    /// The stored bytes the next chunk may hold (one block in any case), or None: fetch
    /// no more.
    fn limit(self) -> Option<usize> {
        match self {
            Room::Unlimited => Some(CHUNK_BYTES),
            Room::Budget { left, any } if any && left <= 0 => None,
            Room::Budget { left, .. } => Some(usize::try_from(left).unwrap_or(0).min(CHUNK_BYTES)),
        }
    }
}

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

/// A memory context of a read's own for the stored bytes it fetches: emptied (`reset`)
/// before each fetch, deleted with the read. Without it every fetch would stay in the SPI
/// procedure's context (the current one while SPI is connected) until the pop's SPI
/// connection ends, across every segment and lane it reads.
struct Scratch(pg_sys::MemoryContext);

impl Scratch {
    fn new() -> Scratch {
        // SAFETY: a new child of the current memory context, which outlives this read (the
        // read ends before its caller's SPI connection does); the name is a static string,
        // as PostgreSQL requires.
        Scratch(unsafe {
            pg_sys::AllocSetContextCreateExtended(
                pg_sys::CurrentMemoryContext,
                c"queen segment read".as_ptr(),
                pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
            )
        })
    }

    /// Bytes `[start, start + len)` of the stored bytes of `segment`, fetched from TOAST
    /// without reading the rest, into this context: valid until the next `reset` (the
    /// borrow of `self` says so).
    fn slice(&self, segment: &Segment<'_>, start: usize, len: usize) -> &[u8] {
        let datum = segment.data;
        // SAFETY: `datum` is a non-null bytea of the segment's row, valid for the read's
        // SPI connection (an SPI result, or a copy of the row made in the connection's
        // memory context). detoast_attr_slice pallocs the copy, and whatever else it
        // allocates, in the current memory context: this one while it runs. An ERROR
        // leaves this context current; `drop` handles that.
        unsafe {
            let caller = pg_sys::CurrentMemoryContext;
            pg_sys::CurrentMemoryContext = self.0;
            let v = pg_sys::detoast_attr_slice(datum.cast_mut_ptr::<pg_sys::varlena>(), start as i32, len as i32);
            pg_sys::CurrentMemoryContext = caller;
            pgrx::varlena::varlena_to_byte_slice(v)
        }
    }

    /// Frees everything fetched so far (no slice of it is borrowed any more).
    fn reset(&mut self) {
        // SAFETY: a context this read created; `&mut self` proves no slice is borrowed.
        unsafe { pg_sys::MemoryContextReset(self.0) }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: a context this read created, deleted once. An ERROR inside `slice`
        // (turned into a panic that unwinds through here) leaves it current: its parent,
        // the caller's context, becomes current again first, as before the fetch.
        unsafe {
            if pg_sys::CurrentMemoryContext == self.0 {
                pg_sys::CurrentMemoryContext = pg_sys::MemoryContextGetParent(self.0);
            }
            pg_sys::MemoryContextDelete(self.0);
        }
    }
}

/// Calls `emit(offset, message)` for the offsets `start..=end` of a partition, in order,
/// decoding only the blocks that hold them: `Some((frame, created_at))` for a message,
/// `None` for an offset that holds none (a gap, or an offset no segment covers). `emit` returns false
/// to stop early. Segments of both tiers are read in one statement, so a compaction that
/// commits meanwhile is seen whole or not at all. A corrupt segment is an ERROR (XX001).
/// No byte budget: for reads of one offset or of a bounded range (they still fetch a
/// chunk at a time, and stop fetching when `emit` says stop).
pub fn read(
    client: &mut SpiClient<'_>,
    partition_id: pgrx::Uuid,
    start: i64,
    end: i64,
    emit: impl FnMut(i64, Option<(Frame<'_>, TimestampWithTimeZone)>) -> bool,
) {
    read_or_skip(client, partition_id, start, end, &|| Room::Unlimited, emit, None);
}

/// The first segment of either tier that ends at or after `offset`: the one that holds it,
/// else the next one. (Segments of a partition never overlap, so the one that starts last
/// at or before `offset` is the only one that may hold it.) The fresh tier's probe back is
/// bounded as `fetch_many_sql`'s is (`$3`: FRESH_MAX): a REPEATABLE READ reader holds the
/// xmin horizon back, and an unbounded probe would walk the index entries of every fresh
/// segment compaction merged meanwhile.
macro_rules! segment_at_or_after_sql {
    () => {
        "SELECT first_offset, last_offset FROM (
           (SELECT first_offset, last_offset FROM queen.segments
             WHERE partition_id = $1 AND first_offset <= $2 ORDER BY first_offset DESC LIMIT 1)
           UNION ALL
           (SELECT first_offset, last_offset FROM queen.fresh_segments
             WHERE partition_id = $1 AND first_offset <= $2 AND first_offset > $2 - $3
             ORDER BY first_offset DESC LIMIT 1)
           UNION ALL
           (SELECT first_offset, last_offset FROM queen.segments
             WHERE partition_id = $1 AND first_offset > $2 ORDER BY first_offset LIMIT 1)
           UNION ALL
           (SELECT first_offset, last_offset FROM queen.fresh_segments
             WHERE partition_id = $1 AND first_offset > $2 ORDER BY first_offset LIMIT 1)
         ) s WHERE last_offset >= $2 ORDER BY first_offset LIMIT 1"
    };
}

/// The first offset from `from` on that a segment this snapshot sees holds (a message or a
/// gap entry), None when none does: offsets before it that no segment holds are gaps, up
/// to the readable end (under READ COMMITTED; a fixed snapshot may miss segments committed
/// since, see `gaps_from`). A read that found only gaps goes on from there, not one span
/// at a time (a rolled-back push of a million leaves a gap of a million).
pub fn next_stored(client: &mut SpiClient<'_>, partition_id: pgrx::Uuid, from: i64) -> Option<i64> {
    let args = [partition_id.into(), from.into(), (FRESH_MAX as i64).into()];
    crate::pg::spi::run_map(client, segment_at_or_after_sql!(), &args, |r| r.get::<i64>(1).or_raise().unwrap())
        .into_iter()
        .next()
        .map(|first| first.max(from))
}

/// Under REPEATABLE READ or SERIALIZABLE, a read found no message at `offset` (at or below
/// the readable end `readable`), which may be a gap for good or a message its snapshot
/// cannot see. Returns `Some(through)` when every offset in `offset..=through` at which
/// this snapshot finds no message is a gap for good, so that a pop may step over them;
/// None when a segment that holds `offset` has committed since the snapshot (a push, a
/// compaction, or a rotation's copy), so that the pop stops before it, as for any message
/// it cannot see. A dead-lettering ack asks it too (`readable` = `offset`: a leased offset
/// is at or below the readable end) and fails on None.
///
/// - A segment this snapshot sees holds `offset`: the read, which fetched every segment the
///   snapshot sees that holds an offset of its span (`fetch_many`), found a gap entry in
///   it (a push that aborted before a compaction), and so is every offset of that segment
///   the read finds empty.
/// - Else, with the latest snapshot (`first_row_now`): no segment holds `offset` now, and
///   none ever will (every push that could write up to the readable end has ended): the
///   offsets up to the next segment, or to `readable`, are gaps.
pub fn gaps_from(client: &mut SpiClient<'_>, partition_id: pgrx::Uuid, offset: i64, readable: i64) -> Option<i64> {
    let args = || [partition_id.into(), offset.into(), (FRESH_MAX as i64).into()];
    let seen = crate::pg::spi::run_map(client, segment_at_or_after_sql!(), &args(), |r| {
        (r.get::<i64>(1).or_raise().unwrap(), r.get::<i64>(2).or_raise().unwrap())
    })
    .into_iter()
    .next();
    if let Some((first, last)) = seen.filter(|&(first, _)| first <= offset) {
        debug_assert!(first <= offset && offset <= last);
        return Some(last);
    }
    let now = crate::pg::spi::first_row_now(client, segment_at_or_after_sql!(), &args(), |r| r.get::<i64>(1)).flatten();
    match now {
        None => Some(readable),
        Some(first) if first > offset => Some(first - 1),
        Some(_) => None,
    }
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

/// `read` within `room` (asked before each fetch), except that a corrupt segment is
/// handed to `corrupt` (when given) and its offsets are passed over, instead of an ERROR:
/// a pop files it as a dead letter and goes on with the partition.
pub fn read_or_skip(
    client: &mut SpiClient<'_>,
    partition_id: pgrx::Uuid,
    start: i64,
    end: i64,
    room: &dyn Fn() -> Room,
    emit: impl FnMut(i64, Option<(Frame<'_>, TimestampWithTimeZone)>) -> bool,
    corrupt: Option<&mut dyn FnMut(Corrupt)>,
) {
    read_rows(fetch(client, partition_id, start, end), partition_id, start, end, room, emit, corrupt);
}

/// One segment row of a read: its offsets, its time, and its stored bytes (a TOAST
/// pointer, or the value itself when small), valid while the SPI connection of the read
/// lasts (`'conn`): a value of an SPI result, or of a copy of the row made in the
/// connection's memory context.
pub(crate) struct Segment<'conn> {
    first: i64,
    last: i64,
    created_at: TimestampWithTimeZone,
    data: pg_sys::Datum,
    _conn: std::marker::PhantomData<&'conn ()>,
}

/// The segment rows a read of offsets `lo..=hi` of one partition needs: the segment of each
/// tier that holds `lo`, and those that begin after it up to `hi`. `data` stays a TOAST
/// pointer until a read slices it.
pub struct Rows<'conn> {
    pub lo: i64,
    pub hi: i64,
    rows: Vec<Segment<'conn>>,
}

/// The rows of one partition's read (`fetch_many` of one span).
pub fn fetch<'conn>(client: &mut SpiClient<'conn>, partition_id: pgrx::Uuid, start: i64, end: i64) -> Rows<'conn> {
    fetch_many(client, &[(partition_id, start, end)]).pop().expect("one span, one result")
}

/// The rows of several partitions' reads (a pop's lanes): each span `(partition, lo, hi)`
/// gets its rows, in the order given, all read under one snapshot, so that a compaction or
/// a generation move that commits meanwhile is seen whole or not at all. The fresh tier of
/// a partition is skipped when no push wrote there at or after `lo` (`offsets`), except
/// under REPEATABLE READ or SERIALIZABLE: what the registry knows is current, the snapshot
/// may be older (a fresh segment compacted since is still there for it), and `gaps_from`
/// relies on the read having fetched every segment its snapshot sees that holds an offset
/// of the span. By direct scans, the durable tier of a span whose fresh rows hold every
/// offset of it is not read (`compaction::covers`): under one snapshot it holds none of
/// those offsets.
///
/// Read by direct index scans of the tiers' tables (`pg::scan`); by one SQL statement when
/// those tables are not as this library knows them (a schema older or newer than it).
pub fn fetch_many<'conn>(client: &mut SpiClient<'conn>, spans: &[(pgrx::Uuid, i64, i64)]) -> Vec<Rows<'conn>> {
    let fixed = errors::fixed_snapshot();
    let fresh: Vec<bool> = spans.iter().map(|s| fixed || crate::offsets::may_be_fresh(s.0, s.1)).collect();
    direct::fetch_many(client, spans, &fresh).unwrap_or_else(|| fetch_many_sql(client, spans, &fresh))
}

/// `fetch_many` in one statement: per span, tight range scans of each tier's primary key.
/// A fresh segment holds fewer than FRESH_MAX offsets, so the one holding `lo` begins after
/// `lo - FRESH_MAX`. The bound keeps the probe off the index entries of segments compaction
/// has replaced: while a snapshot holds the xmin horizon back they cannot be removed, and
/// an unbounded probe would walk them all.
pub(crate) fn fetch_many_sql<'conn>(
    client: &mut SpiClient<'conn>,
    spans: &[(pgrx::Uuid, i64, i64)],
    fresh: &[bool],
) -> Vec<Rows<'conn>> {
    let pids: Vec<pgrx::Uuid> = spans.iter().map(|s| s.0).collect();
    let los: Vec<i64> = spans.iter().map(|s| s.1).collect();
    let his: Vec<i64> = spans.iter().map(|s| s.2).collect();
    let mut out: Vec<Rows<'conn>> = spans.iter().map(|&(_, lo, hi)| Rows { lo, hi, rows: Vec::new() }).collect();
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
        &[pids.into(), los.into(), his.into(), fresh.to_vec().into(), (FRESH_MAX as i64).into()],
    ) {
        let i = row.get::<i64>(1).or_raise().unwrap() as usize - 1;
        let StoredBytea(data) = row.get(5).or_raise().unwrap();
        out[i].rows.push(Segment {
            first: row.get(2).or_raise().unwrap(),
            last: row.get(3).or_raise().unwrap(),
            created_at: row.get(4).or_raise().unwrap(),
            data,
            _conn: std::marker::PhantomData,
        });
    }
    out
}

/// `fetch_many` by direct index scans (`pg::scan`): the rows the statement reads, except
/// that a span whose fresh rows hold all of it gets no durable row (the statement's holds
/// none of its offsets there).
mod direct {
    use std::ffi::CStr;

    use pgrx::datum::TimestampWithTimeZone;
    use pgrx::pg_sys;
    use pgrx::spi::SpiClient;
    use pgrx::{FromDatum, IntoDatum};
    use queen_core::compaction::{covers, FRESH_MAX};

    use super::{Rows, Segment};
    use crate::pg::scan::{Key, StatementSnapshot, Table};

    /// One table of a tier (a generation's partition of `queen.segments` or
    /// `queen.fresh_segments`), open for scans of its primary key, and where its columns
    /// are.
    struct Part {
        table: Table,
        first: i16,
        last: i16,
        created_at: i16,
        data: i16,
    }

    /// The tables of the tier `parent` (a partitioned table of queen's): its partitions,
    /// each with a primary key led by (partition_id, first_offset). None when the tier is
    /// not like that, or a partition lacks a column a read needs.
    fn tier(parent: &'static CStr) -> Option<Vec<Part>> {
        let relid = crate::pg::catalog::queen_table(parent);
        if relid == pg_sys::InvalidOid {
            return None;
        }
        // SAFETY: the parent is opened under AccessShareLock (kept to the end of the
        // transaction, as a statement keeps it) to read its partition descriptor, which
        // the relcache keeps while the relation is open; the OIDs are copied out first.
        let parts: Vec<pg_sys::Oid> = unsafe {
            let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            let desc = if (*(*rel).rd_rel).relkind == pg_sys::RELKIND_PARTITIONED_TABLE as std::ffi::c_char {
                pg_sys::RelationGetPartitionDesc(rel, true)
            } else {
                std::ptr::null_mut()
            };
            let oids = if desc.is_null() {
                None
            } else {
                Some(std::slice::from_raw_parts((*desc).oids, (*desc).nparts as usize).to_vec())
            };
            pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
            oids?
        };
        parts
            .into_iter()
            .map(|oid| {
                let table =
                    Table::open(oid, None, &[(c"partition_id", pg_sys::UUIDOID), (c"first_offset", pg_sys::INT8OID)])?;
                Some(Part {
                    first: table.column(c"first_offset", pg_sys::INT8OID)?,
                    last: table.column(c"last_offset", pg_sys::INT8OID)?,
                    created_at: table.column(c"created_at", pg_sys::TIMESTAMPTZOID)?,
                    data: table.column(c"data", pg_sys::BYTEAOID)?,
                    table,
                })
            })
            .collect()
    }

    impl Part {
        /// Appends to `out` the rows of this table a read of `lo..=hi` of `partition_id`
        /// needs: those that begin in `(lo, hi]` and the one holding `lo` (the last that
        /// begins at or before it), above `floor` when given. One backward scan, from `hi`
        /// down to the row holding `lo`.
        fn read<'conn>(
            &self,
            snapshot: &StatementSnapshot,
            partition_id: pgrx::Uuid,
            (lo, hi): (i64, i64),
            floor: Option<i64>,
            out: &mut Vec<Segment<'conn>>,
        ) {
            // The third key (the floor) is left off when there is none.
            let keys = [
                Key::new(1, pg_sys::BTEqualStrategyNumber, pg_sys::F_UUID_EQ, partition_id.into_datum().unwrap()),
                Key::new(2, pg_sys::BTLessEqualStrategyNumber, pg_sys::F_INT8LE, pg_sys::Datum::from(hi)),
                Key::new(2, pg_sys::BTGreaterStrategyNumber, pg_sys::F_INT8GT, pg_sys::Datum::from(floor.unwrap_or(0))),
            ];
            let keys = if floor.is_some() { &keys[..] } else { &keys[..2] };
            let mut scan = self.table.scan(snapshot, keys, true);
            let int8 = |d: Option<pg_sys::Datum>| d.map_or(0, |d| d.value() as i64);
            while let Some(row) = scan.next() {
                let first = int8(row.get(self.first));
                let created_at = row
                    .get(self.created_at)
                    // SAFETY: a non-null datum of a timestamptz column.
                    .and_then(|d| unsafe { TimestampWithTimeZone::from_datum(d, false) })
                    .expect("created_at is not null");
                out.push(Segment {
                    first,
                    last: int8(row.get(self.last)),
                    created_at,
                    // A copy in the current memory context: the SPI connection's.
                    data: row.copy_varlena(self.data).expect("data is not null"),
                    _conn: std::marker::PhantomData,
                });
                if first <= lo {
                    break; // the segment holding `lo`: nothing below it is read
                }
            }
        }
    }

    /// The rows of every span, or None when the tiers are not as this library knows them
    /// (the caller then reads by SQL; copies made before that stay in the memory context
    /// until it ends). The copies of the rows are made in the current memory context, the
    /// procedure context of `_client`'s SPI connection, so they live as long as an SPI
    /// result of it would (`'conn`).
    ///
    /// When every span may be fresh, the fresh tier is read alone first (`fresh_only`): on
    /// a live queue its rows hold every span whole, and the durable tier is then neither
    /// opened nor locked (five relations: its parent, two tables, two indexes). Otherwise
    /// (a span that is not fresh, or fresh rows that miss part of one) every span is read
    /// here, both tiers under one snapshot taken after both tiers' locks, so that the rows
    /// of one span never come from two snapshots (a compaction between them would show a
    /// segment in both tiers, or in neither). Each read takes its locks before its
    /// snapshot, as a statement does. The durable tier's locks come after the fresh
    /// tier's, the opposite of a rotation's swap (`queen._rotate_segments`); if the two
    /// wait for each other, the swap gives up (at its `deadlock_timeout`, 50 ms, when it
    /// finds the cycle; at its `lock_timeout`, 150 ms, at the latest), and this read goes
    /// on (docs/concepts.md, "Snapshots").
    pub(crate) fn fetch_many<'conn>(
        _client: &SpiClient<'conn>,
        spans: &[(pgrx::Uuid, i64, i64)],
        fresh: &[bool],
    ) -> Option<Vec<Rows<'conn>>> {
        let fresh_parts = if fresh.iter().any(|&f| f) { tier(c"fresh_segments")? } else { Vec::new() };
        if fresh.iter().all(|&f| f) {
            if let Some(out) = fresh_only(&fresh_parts, spans) {
                return Some(out);
            }
        }
        let plain = tier(c"segments")?;
        let snapshot = StatementSnapshot::take();
        let mut out = Vec::with_capacity(spans.len());
        for (&(pid, lo, hi), &fresh) in spans.iter().zip(fresh) {
            let mut rows = Vec::new();
            // The fresh tier first: when it holds the whole span, the durable tier has
            // nothing of it under this snapshot (`compaction::covers`).
            let covered = fresh && read_fresh(&fresh_parts, &snapshot, (pid, lo, hi), &mut rows);
            if !covered {
                let from = rows.len();
                for part in &plain {
                    part.read(&snapshot, pid, (lo, hi), None, &mut rows);
                }
                holder_once(&mut rows, from, lo);
            }
            out.push(Rows { lo, hi, rows });
        }
        Some(out)
    }

    /// The rows of every span from the fresh tier alone (its tables `parts`, open), under
    /// a snapshot of its own; None as soon as one span is not held whole by them.
    fn fresh_only<'conn>(parts: &[Part], spans: &[(pgrx::Uuid, i64, i64)]) -> Option<Vec<Rows<'conn>>> {
        let snapshot = StatementSnapshot::take();
        spans
            .iter()
            .map(|&(pid, lo, hi)| {
                let mut rows = Vec::new();
                read_fresh(parts, &snapshot, (pid, lo, hi), &mut rows).then_some(Rows { lo, hi, rows })
            })
            .collect()
    }

    /// Appends to `rows` (empty) the fresh tier's rows of the span `(pid, lo, hi)`; true
    /// when they hold every offset of it.
    ///
    /// A pop's span begins where its lane's last read ended, at a segment's start unless
    /// that read took part of a segment; so each table is read first for the rows that
    /// begin in `[lo, hi]` only. The btree reads every entry of a page between a scan's
    /// bounds, and the wide floor (`lo - FRESH_MAX`, below which no segment holding `lo`
    /// begins) made that about 50 entries a read on a live queue. When no row begins at
    /// `lo`, the segment holding it may have begun earlier (or be durable, or gone), and
    /// the tables are read again down to the wide floor. The rows kept are the same either
    /// way: every row beginning in `(lo - FRESH_MAX, hi]` at or after the last one
    /// beginning at or before `lo`.
    fn read_fresh<'conn>(
        parts: &[Part],
        snapshot: &StatementSnapshot,
        (pid, lo, hi): (pgrx::Uuid, i64, i64),
        rows: &mut Vec<Segment<'conn>>,
    ) -> bool {
        debug_assert!(rows.is_empty(), "read_fresh fills an empty list");
        for part in parts {
            part.read(snapshot, pid, (lo, hi), Some(lo - 1), rows);
        }
        if !rows.iter().any(|r| r.first == lo) {
            rows.clear();
            for part in parts {
                part.read(snapshot, pid, (lo, hi), Some(lo - FRESH_MAX as i64), rows);
            }
        }
        holder_once(rows, 0, lo);
        let mut held: Vec<(i64, i64)> = rows.iter().map(|r| (r.first, r.last)).collect();
        covers(&mut held, lo, hi)
    }

    /// Of the rows `rows[from..]` of one tier (read from each of its tables), keeps one
    /// segment beginning at or before `lo`, the last: each generation's table gave its own,
    /// and the statement's `ORDER BY first_offset DESC LIMIT 1` keeps one per tier.
    fn holder_once(rows: &mut Vec<Segment<'_>>, from: usize, lo: i64) {
        let holder = rows[from..].iter().filter(|r| r.first <= lo).map(|r| r.first).max();
        let mut i = from;
        while i < rows.len() {
            if rows[i].first <= lo && Some(rows[i].first) != holder {
                rows.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }
}

/// `read_or_skip` over rows fetched before (`fetch`, `fetch_many`) for a span that holds
/// `start..=end`: `rows.lo == start` and `end <= rows.hi`.
///
/// The bound: before each fetch it asks `room`. When that is a spent budget (`Room::Budget`
/// with nothing left after a message was taken) it fetches nothing more and returns, as
/// when `emit` returns false. Otherwise it fetches the next blocks of the span, in order,
/// as many as min(room left, `CHUNK_BYTES`) stored bytes hold but one at least, frees what
/// it fetched before, and decodes them. So it holds one chunk at a time, and fetches at
/// most one block past the point where the budget ran out. The exception is a corrupt
/// segment handed to `corrupt`: its stored bytes, whole.
pub fn read_rows(
    rows: Rows<'_>,
    partition_id: pgrx::Uuid,
    start: i64,
    end: i64,
    room: &dyn Fn() -> Room,
    mut emit: impl FnMut(i64, Option<(Frame<'_>, TimestampWithTimeZone)>) -> bool,
    mut corrupt: Option<&mut dyn FnMut(Corrupt)>,
) {
    debug_assert!(rows.lo == start && end <= rows.hi);
    // In offset order (sorted here: a Sort node in the statement costs more than these
    // few rows do).
    let mut rows = rows.rows;
    rows.sort_unstable_by_key(|r| r.first);
    let mut scratch = Scratch::new();
    let mut next = start;
    for row in &rows {
        let (first, last) = (row.first, row.last);
        if last < next {
            continue; // ends before the span (the segment before `start`)
        }
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
        let segment = Stored { row, partition_id };
        match segment.read(&mut scratch, room, end, &mut next, &mut emit) {
            Read::Done => {}
            Read::Stopped => return,
            // A corrupt segment: an ERROR, or handed over and passed.
            Read::Corrupt(error) => {
                let Some(handler) = corrupt.as_mut() else {
                    errors::corrupted(format_args!("{error} (partition {partition_id})"))
                };
                scratch.reset();
                let bytes = scratch.slice(row, 0, row.total()).to_vec();
                scratch.reset();
                handler(Corrupt { segment_first: first, from: next, last, error, bytes });
                next = last + 1;
            }
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

/// One segment row of a read, of a partition.
struct Stored<'a, 'conn> {
    row: &'a Segment<'conn>,
    partition_id: pgrx::Uuid,
}

/// How a read of one segment ended.
enum Read {
    /// Every offset asked for was handed to `emit`.
    Done,
    /// `emit` said stop, or the room was spent.
    Stopped,
    /// It cannot be decoded: why. The offsets before `next` were handed out.
    Corrupt(String),
}

impl Segment<'_> {
    /// Its stored size.
    fn total(&self) -> usize {
        // SAFETY: `data` is a non-null bytea of this row.
        unsafe { pg_sys::toast_raw_datum_size(self.data) - pg_sys::VARHDRSZ }
    }
}

impl Stored<'_, '_> {
    /// Its directory, parsed from a prefix of its bytes (fetched into `scratch`, longer
    /// until the header fits), and that prefix; Err (why) when the header is corrupt or
    /// counts other offsets than the segment row's.
    fn directory<'s>(&self, scratch: &'s mut Scratch) -> Result<(Directory, &'s [u8]), String> {
        let (first, last) = (self.row.first, self.row.last);
        let total = self.row.total();
        scratch.reset();
        let mut head = scratch.slice(self.row, 0, HEAD_BYTES.min(total));
        let dir = loop {
            match Directory::parse(head, total) {
                Ok(dir) => break dir,
                Err(CodecError::Truncated(_)) if head.len() < total => {
                    head = scratch.slice(self.row, 0, (head.len() * 8).min(total));
                }
                Err(e) => return Err(format!("segment {first}..{last}: {e}")),
            }
        };
        if dir.frame_count() as i64 != last - first + 1 {
            return Err(format!("segment {first}..{last} holds {} entries", dir.frame_count()));
        }
        Ok((dir, head))
    }

    /// Hands its offsets from `*next` (inside the segment) up to `end` to `emit`, fetching
    /// a chunk of blocks at a time within `room`; `*next` ends past the last one handed.
    fn read(
        &self,
        scratch: &mut Scratch,
        room: &dyn Fn() -> Room,
        end: i64,
        next: &mut i64,
        emit: &mut impl FnMut(i64, Option<(Frame<'_>, TimestampWithTimeZone)>) -> bool,
    ) -> Read {
        let (first, last) = (self.row.first, self.row.last);
        if room().limit().is_none() {
            return Read::Stopped;
        }
        let (dir, head) = match self.directory(scratch) {
            Ok(found) => found,
            Err(corrupt) => return Read::Corrupt(corrupt),
        };
        // The header fetch may already hold a chunk (a small segment: all of it); once a
        // chunk needs a fetch, the header's bytes are freed.
        let mut head = Some(head);
        // Decompressed blocks are kept per backend by place (`segment::Place`): the next
        // pop of a lane usually reads on in the same block.
        let place = Place { partition: *self.partition_id.as_bytes(), first, last };
        let to = (end.min(last) - first + 1) as usize;
        let mut at = (*next - first) as usize;
        loop {
            let Some(limit) = room().limit() else { return Read::Stopped };
            let Some(chunk) = dir.chunk(at, to, limit) else { return Read::Done };
            let body = match head {
                Some(h) if chunk.end <= h.len() => &h[chunk.start..chunk.end],
                _ => {
                    head = None;
                    scratch.reset();
                    scratch.slice(self.row, chunk.start, chunk.end - chunk.start)
                }
            };
            let mut go_on = true;
            let decoded = dir.for_each_in_at(Some(place), body, chunk.start, chunk.from, chunk.to, |i, entry| {
                if !go_on {
                    return;
                }
                let offset = first + i as i64;
                *next = offset + 1;
                go_on = match entry {
                    Entry::Message(f) => {
                        // Version 1 segments keep no time per message: the row's applies.
                        let at = f.created_at.map(crate::pg::clock::timestamptz).unwrap_or(self.row.created_at);
                        emit(offset, Some((f, at)))
                    }
                    Entry::Gap => emit(offset, None),
                };
            });
            if !go_on {
                return Read::Stopped;
            }
            // A block that fails its checks: the entries before it were handed out; the
            // rest of the segment is corrupt.
            if let Err(e) = decoded {
                return Read::Corrupt(format!("segment {first}..{last}: {e}"));
            }
            at = chunk.to;
        }
    }
}

/// A row as `both_ways` gives it: first, last, created_at, its stored bytes.
#[cfg(any(test, feature = "pg_test"))]
pub type ReadRow = (i64, i64, String, Vec<u8>);

/// For the in-server tests: the rows of `spans` (every span reading the fresh tier too)
/// read both ways, by direct scans and by the statement, each row as (first, last,
/// created_at, its stored bytes), in offset order.
#[cfg(any(test, feature = "pg_test"))]
pub fn both_ways(spans: &[(pgrx::Uuid, i64, i64)]) -> [Vec<Vec<ReadRow>>; 2] {
    let fresh = vec![true; spans.len()];
    let flat = |all: Vec<Rows<'_>>| -> Vec<Vec<ReadRow>> {
        let scratch = Scratch::new();
        all.into_iter()
            .map(|rows| {
                let mut v: Vec<_> = rows
                    .rows
                    .iter()
                    .map(|r| {
                        let total = r.total();
                        (r.first, r.last, r.created_at.to_string(), scratch.slice(r, 0, total).to_vec())
                    })
                    .collect();
                v.sort();
                v
            })
            .collect()
    };
    pgrx::Spi::connect_mut(|client| {
        let direct = flat(direct::fetch_many(client, spans, &fresh).expect("queen's tables read directly"));
        let sql = flat(fetch_many_sql(client, spans, &fresh));
        [direct, sql]
    })
}
