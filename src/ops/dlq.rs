//! Dead-letter queue: filing a dead letter (`file`), from the ack that gives up on a
//! message and from the pop that meets one it cannot open or that expired; a span a purge
//! passed (`file_span`); a span a skip group passed (`file_skipped`). Listing is plain SQL
//! (`queen.dlq`, sql/api.sql); replay and delete are entry points (`api/dlq.rs`).

use pgrx::spi::SpiClient;
use queen_core::addresses::{span_address, SpanKind};

use crate::pg::errors::SpiExt;
use crate::pg::spi::run;

/// One message to file as a dead letter.
pub struct Filing<'a> {
    pub queue_id: i64,
    pub partition_id: pgrx::Uuid,
    pub group: &'a str,
    pub offset: i64,
    pub message_id: pgrx::Uuid,
    pub transaction_id: &'a str,
    /// The payload as stored: jsonb, or an envelope of an encrypted queue.
    pub stored: Vec<u8>,
    /// The headers as stored, likewise (kept as bytes in `log_dlq.headers`).
    pub headers: Option<Vec<u8>>,
    pub error: &'a str,
    pub retry_count: i32,
    /// `stored` is not a message (a corrupt segment's bytes): kept as bytes, in `envelope`.
    pub raw: bool,
    /// Why (`queen.log_dlq.reason`): 'failed', 'unreadable' or 'expired'.
    pub reason: &'static str,
}

/// Files a dead letter, unless the group already filed this offset and transaction id (a
/// message that could not be opened is filed once, however often a pop meets it). Returns
/// whether it filed.
///
/// "Already filed" is the unique index `log_dlq_message` (partition, group, offset and
/// transaction id of a message: a damaged segment's row has its own), not a look under the
/// snapshot. A pop or ack under REPEATABLE READ whose snapshot predates another
/// transaction's filing of the same offset cannot see that row, and a look would file it
/// a second time. The index finds it: PostgreSQL then raises 40001 (`ON CONFLICT DO
/// NOTHING` at REPEATABLE READ or SERIALIZABLE, for a row the snapshot does not see), and
/// the retry, in a new transaction, sees the row and passes the offset.
pub fn file(client: &mut SpiClient<'_>, f: Filing<'_>) -> bool {
    // Before `ALTER EXTENSION queen UPDATE`, the dead-letter table has no reason column.
    if !crate::pg::catalog::queen_column(c"log_dlq", c"reason") {
        crate::pg::errors::older_sql();
    }
    // An encrypted payload is filed as its envelope (`envelope`), a plain one as jsonb.
    let (data, envelope) = if f.raw || queen_core::envelope::is_envelope(&f.stored) {
        (None, Some(f.stored))
    } else {
        (Some(crate::pg::jsonb::RawJsonb(f.stored)), None)
    };
    !run(
        client,
        "INSERT INTO queen.log_dlq (id, queue_id, partition_id, consumer_group, msg_offset,
                                    message_id, transaction_id, data, error_message, retry_count, envelope,
                                    headers, reason)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
         ON CONFLICT (partition_id, consumer_group, msg_offset, transaction_id) WHERE last_offset IS NULL DO NOTHING
         RETURNING 1",
        &[
            crate::pg::ids::to_pg_uuid(crate::pg::ids::new_id()).into(),
            f.queue_id.into(),
            f.partition_id.into(),
            f.group.into(),
            f.offset.into(),
            f.message_id.into(),
            f.transaction_id.into(),
            data.into(),
            f.error.into(),
            f.retry_count.into(),
            envelope.into(),
            f.headers.into(),
            f.reason.into(),
        ],
    )
    .is_empty()
}

/// Files the span a `skip` group's cursor passed in a lane (`overflow::skip_lanes`). It
/// extends the lane's newest `skipped` row when that row ends right before the span,
/// rather than adding a row: an abandoned skip group passes over its oldest messages at
/// every retention round, and one row per lane per round would grow the dead-letter table
/// without bound. The row's address, error and time become the merged span's.
pub fn file_skipped(
    client: &mut SpiClient<'_>,
    queue_id: i64,
    partition_id: pgrx::Uuid,
    group: &str,
    span: (i64, i64),
    max_lag: i64,
) {
    let (from, to) = span;
    let error = |first: i64| {
        format!("skipped: offsets {first}..{to} passed over by group {group:?}, whose lag passed its max_lag {max_lag}")
    };
    // The lanes are locked (skip_lanes), so no other pass files this lane's spans now. A
    // row that a dlq_delete, a dlq_replay or the expiry holds (or deleted meanwhile) is not
    // waited for: the next older row is looked at instead, and extended only if it too
    // ends right before the span; else the span gets a row of its own.
    let newest = crate::pg::spi::run_map(
        client,
        "SELECT id, msg_offset, last_offset FROM queen.log_dlq
          WHERE partition_id = $1 AND consumer_group = $2 AND reason = 'skipped'
          ORDER BY last_offset DESC LIMIT 1 FOR UPDATE SKIP LOCKED",
        &[partition_id.into(), group.into()],
        |r| {
            let id: pgrx::Uuid = r.get(1).or_raise().unwrap();
            let (first, last): (i64, i64) = (r.get(2).or_raise().unwrap(), r.get(3).or_raise().unwrap());
            (id, first, last)
        },
    );
    match newest.first() {
        Some(&(id, first, last)) if last == from - 1 => {
            run(
                client,
                "UPDATE queen.log_dlq SET last_offset = $2, transaction_id = $3, error_message = $4,
                                          failed_at = clock_timestamp()
                  WHERE id = $1",
                &[id.into(), to.into(), span_address(SpanKind::Skipped, first, to).into(), error(first).into()],
            );
        }
        _ => file_span(client, queue_id, partition_id, group, span, SpanKind::Skipped, &error(from)),
    }
}

/// Files a span of offsets that a group's cursor passed without delivering them
/// (`queen.purge`, a skip group past its `max_lag`): one row with no payload, `msg_offset`
/// its first offset and `last_offset` its last, addressed by `addresses::span_address`.
pub fn file_span(
    client: &mut SpiClient<'_>,
    queue_id: i64,
    partition_id: pgrx::Uuid,
    group: &str,
    span: (i64, i64),
    kind: SpanKind,
    error: &str,
) {
    let (from, to) = span;
    run(
        client,
        "INSERT INTO queen.log_dlq (id, queue_id, partition_id, consumer_group, msg_offset, last_offset,
                                    message_id, transaction_id, error_message, retry_count, reason)
         VALUES ($1, $2, $3, $4, $5, $6, '00000000-0000-0000-0000-000000000000', $7, $8, 0, $9)",
        &[
            crate::pg::ids::to_pg_uuid(crate::pg::ids::new_id()).into(),
            queue_id.into(),
            partition_id.into(),
            group.into(),
            from.into(),
            to.into(),
            span_address(kind, from, to).into(),
            error.into(),
            kind.reason().into(),
        ],
    );
}
