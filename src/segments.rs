//! Reading segments: the only place that turns stored bytes back into frames.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::spi::SpiClient;
use queen_core::segment::{Frame, Segment};

use crate::errors::{self, SpiExt};
use crate::spi::run;

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
    // tight range scans of the primary key.
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
        let data: &[u8] = row.get(3).or_raise().unwrap();
        let seg = Segment::parse(data).unwrap_or_else(|e| errors::corrupted(e));
        let from = (next - first) as usize;
        let to = (end - first + 1) as usize;
        seg.for_each_in(from, to, |i, f| {
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
