//! Reading segments: the only place that turns stored bytes back into frames.
//!
//! `queen.segments.data` is stored EXTERNAL (TOAST without compression: the codec
//! compresses), so PostgreSQL can fetch a byte range of it without reading the rest.
//! A read fetches the segment's header first, then only the bytes of the blocks that
//! hold the offsets it wants: a pop of 100 messages from a segment of 10,000 reads about
//! 1/100 of it, not all of it.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::spi::SpiClient;
use queen_core::segment::{CodecError, Directory, Frame};

use crate::errors::{self, SpiExt};
use crate::spi::run;

/// First fetch of a segment: enough for the header of a segment of about 20,000 frames.
/// A longer header is fetched again, eight times longer each round.
const HEAD_BYTES: usize = 4096;

/// A `bytea` column value as it sits in the SPI result: possibly a TOAST pointer, not
/// fetched until `slice` asks for a range of it.
struct StoredBytea(pg_sys::Datum);

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
/// rest. The copy lives in the current (SPI) memory context: it is valid until the SPI
/// connection of `read` ends, which the `'static` here does not say — keep it inside.
fn slice(datum: pg_sys::Datum, start: usize, len: usize) -> &'static [u8] {
    unsafe {
        let v = pg_sys::detoast_attr_slice(datum.cast_mut_ptr::<pg_sys::varlena>(), start as i32, len as i32);
        pgrx::varlena::varlena_to_byte_slice(v)
    }
}

/// Calls `emit(offset, frame, created_at)` for every offset in `start..=end` of a
/// partition, in order, decoding only the blocks that hold them. A missing offset or a
/// corrupt segment is an ERROR (XX001), never a skipped or wrong message.
pub fn read(
    client: &mut SpiClient<'_>,
    partition_id: pgrx::Uuid,
    start: i64,
    end: i64,
    mut emit: impl FnMut(i64, Frame<'_>, TimestampWithTimeZone),
) {
    // The segment that holds `start`, then the ones that begin inside the span: two
    // tight range scans of the primary key. `data` comes back as a TOAST pointer.
    let rows = run(
        client,
        "(SELECT first_offset, created_at, data FROM queen.segments
           WHERE partition_id = $1 AND first_offset <= $2
           ORDER BY first_offset DESC LIMIT 1)
         UNION ALL
         (SELECT first_offset, created_at, data FROM queen.segments
           WHERE partition_id = $1 AND first_offset > $2 AND first_offset <= $3
           ORDER BY first_offset)",
        &[partition_id.into(), start.into(), end.into()],
    );
    let mut next = start;
    for row in rows {
        let first: i64 = row.get(1).or_raise().unwrap();
        if first > next {
            break; // a gap: reported below
        }
        let created_at: TimestampWithTimeZone = row.get(2).or_raise().unwrap();
        let StoredBytea(datum) = row.get(3).or_raise().unwrap();
        let total = unsafe { pg_sys::toast_raw_datum_size(datum) } - pg_sys::VARHDRSZ;
        let mut head = slice(datum, 0, HEAD_BYTES.min(total));
        let dir = loop {
            match Directory::parse(head, total) {
                Ok(dir) => break dir,
                Err(CodecError::Truncated(_)) if head.len() < total => {
                    head = slice(datum, 0, (head.len() * 8).min(total));
                }
                Err(e) => errors::corrupted(e),
            }
        };
        let from = (next - first) as usize;
        let to = (end - first + 1) as usize;
        let Some((s, e)) = dir.span(from, to) else { continue };
        // The header fetch may already hold the span (a small segment: all of it).
        let body = if e <= head.len() { &head[s..e] } else { slice(datum, s, e - s) };
        dir.for_each_in(body, s, from, to, |i, f| {
            let offset = first + i as i64;
            if offset == next {
                next += 1;
                emit(offset, f, created_at);
            }
        })
        .unwrap_or_else(|e| errors::corrupted(e));
    }
    if next != end + 1 {
        errors::corrupted(format_args!(
            "partition {partition_id} has no segment for offsets {next}..{end}"
        ));
    }
}
