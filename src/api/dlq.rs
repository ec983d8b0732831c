//! `queen.dlq_replay` and `queen.dlq_delete` (docs/functions.md#dlq_replay): replay and
//! delete one dead letter by its address (partition_id, transaction_id). Filing dead
//! letters is `dlq`'s; listing is `queen.dlq` (sql/api.sql).

use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::{JsonB, PgSqlErrorCode};
use serde_json::json;

use crate::ops::push::{push_items, PushItem};
use crate::pg::errors::{self, SpiExt};
use crate::pg::ids::from_pg_uuid;
use crate::pg::spi::run;

/// The oldest dead-letter row at an address, locked; P0002 when there is none. Two
/// consumer groups can dead-letter the same message: each call takes one row. Returns
/// (row id, queue, partition); the payload is read apart (`payload`), so that deleting a
/// row never needs to open it.
fn lock_row(
    client: &mut SpiClient<'_>,
    partition_id: pgrx::Uuid,
    transaction_id: &str,
) -> (pgrx::Uuid, String, String) {
    const LOCK: &str = "SELECT d.id, q.name, p.name
           FROM queen.log_dlq d
           JOIN queen.queues q ON q.queue_id = d.queue_id
           JOIN queen.partitions p ON p.partition_id = d.partition_id
          WHERE d.partition_id = $1 AND d.transaction_id = $2
          ORDER BY d.failed_at, d.id
          LIMIT 1
            FOR UPDATE OF d";
    // The queue lock before the row lock (`queen_core::lock_order`).
    let queue_id = crate::pg::spi::first_value::<i64>(run(
        client,
        "SELECT queue_id FROM queen.log_dlq WHERE partition_id = $1 AND transaction_id = $2 LIMIT 1",
        &[partition_id.into(), transaction_id.into()],
    ));
    if let Some(q) = queue_id {
        crate::queue::privileges::require_id(client, q, crate::queue::privileges::Privilege::Admin);
    }
    let locked = queue_id.is_none_or(crate::pg::locks::share_queue);
    let row = if locked { run(client, LOCK, &[partition_id.into(), transaction_id.into()]).next() } else { None };
    let Some(row) = row else {
        errors::raise(
            PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
            format!(
                "queen: no dead-letter row for partition_id {} and transaction_id {transaction_id:?}",
                from_pg_uuid(&partition_id)
            ),
        );
    };
    (row.get(1).or_raise().unwrap(), row.get(2).or_raise().unwrap(), row.get(3).or_raise().unwrap())
}

/// A span row (`queen.purge`) holds no message to push again: 55000, with the way to get
/// its messages back.
fn refuse_span(client: &mut SpiClient<'_>, id: pgrx::Uuid) {
    let span = crate::pg::spi::first_value::<String>(run(
        client,
        "SELECT msg_offset || '..' || last_offset FROM queen.log_dlq WHERE id = $1 AND last_offset IS NOT NULL",
        &[id.into()],
    ));
    if let Some(span) = span {
        errors::raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "queen: this dead-letter row is a span of offsets ({span}) passed without delivery, not a message; \
                 queen.seek the group back to deliver them again while retention keeps them, or dlq_delete the row"
            ),
        );
    }
}

/// The payload and headers of a dead letter, opened if the queue is encrypted.
fn payload(client: &mut SpiClient<'_>, id: pgrx::Uuid) -> (Vec<u8>, Option<Vec<u8>>) {
    let rows = run(
        client,
        "SELECT coalesce(d.data, queen._open_dead_letter(d.envelope, d.message_id)), d.headers, d.message_id
           FROM queen.log_dlq d WHERE d.id = $1",
        &[id.into()],
    );
    let row = rows.first();
    let payload = row
        .get::<crate::pg::jsonb::RawJsonb>(1)
        .or_raise()
        .unwrap_or_else(|| errors::internal("dead letter vanished"))
        .0;
    let headers = row.get::<Vec<u8>>(2).or_raise().map(|h| {
        let message_id: pgrx::Uuid = row.get(3).or_raise().unwrap();
        crate::queue::encryption::open_headers(message_id.as_bytes(), &h)
    });
    (payload, headers)
}

/// The arguments of `dlq_replay` and `dlq_delete`, checked; on Citus the call must have
/// been routed to the partition's home (`citus::ensure_id_home`).
fn args(partition_id: Option<pgrx::Uuid>, transaction_id: Option<&str>) -> (pgrx::Uuid, &str) {
    let partition_id = partition_id.unwrap_or_else(|| errors::null_arg("partition_id"));
    let transaction_id = transaction_id.unwrap_or_else(|| errors::null_arg("transaction_id"));
    crate::queue::citus::ensure_id_home("partition", &partition_id);
    (partition_id, transaction_id)
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.dlq_replay(uuid, text) IS
  'queen: re-push a dead letter with a fresh transaction id';
"#,
    name = "dlq_replay_home",
    requires = [dlq_replay]
);

/// Re-pushes the stored payload and headers to its queue and partition with a fresh transaction id,
/// then removes the row — one transaction, so a failed push leaves the row in place.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn dlq_replay(partition_id: Option<pgrx::Uuid>, transaction_id: Option<&str>) -> JsonB {
    let (partition_id, transaction_id) = args(partition_id, transaction_id);
    let (id, queue, partition, (payload, headers)) = Spi::connect_mut(|client| {
        let (id, queue, partition) = lock_row(client, partition_id, transaction_id);
        refuse_span(client, id);
        (id, queue, partition, payload(client, id))
    });
    // A replayed message is due at once (after the queue's delay), whatever its first
    // push asked for.
    let pushed =
        push_items(vec![PushItem { queue, partition, payload, transaction_id: None, headers, deliver_at: None }]);
    let row = &pushed[0];
    let removed = Spi::connect_mut(|client| {
        !run(client, "DELETE FROM queen.log_dlq WHERE id = $1 RETURNING 1", &[id.into()]).is_empty()
    });
    JsonB(json!({
        "replayed": true,
        "dlqRowRemoved": removed,
        "transactionId": row.transaction_id,
        "messageId": row.message_id.to_string(),
        "offset": row.msg_offset,
    }))
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.dlq_delete(uuid, text) IS
  'queen: remove a dead letter';
"#,
    name = "dlq_delete_home",
    requires = [dlq_delete]
);

/// Removes the dead-letter row at the address and nothing else.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn dlq_delete(partition_id: Option<pgrx::Uuid>, transaction_id: Option<&str>) -> JsonB {
    let (partition_id, transaction_id) = args(partition_id, transaction_id);
    let id = Spi::connect_mut(|client| {
        let (id, ..) = lock_row(client, partition_id, transaction_id);
        run(client, "DELETE FROM queen.log_dlq WHERE id = $1", &[id.into()]);
        id
    });
    JsonB(json!({
        "deleted": true,
        "id": from_pg_uuid(&id).to_string(),
        "partitionId": from_pg_uuid(&partition_id).to_string(),
        "transactionId": transaction_id,
    }))
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.dlq_redrive IS
  'queen: push dead letters again, in partition order, to the group that dead-lettered each (deliver_to => ''failing_group'') or to every group (''all''); each once unless force';
"#,
    name = "dlq_redrive_home",
    requires = [dlq_redrive]
);

/// Dead letters redriven per round: each round reads this many rows, pushes them in one
/// batch and marks them, so a call holds one round's payloads at a time.
const REDRIVE_ROUND: i64 = 500;

/// `queen.dlq_redrive` (docs/functions.md#dlq_redrive): pushes the matching dead letters
/// of `queue` again, oldest offset first per partition, into their partitions. With
/// `deliver_to => 'failing_group'` each copy carries the `queen.redrive` header naming the group
/// that dead-lettered it, and every other group's pops pass over it
/// (`queen_core::policy::redrive_passes`). A row is redriven once (`redriven_at`) unless
/// `force`; span rows (purge) hold no message and are left alone. Returns the count and
/// the last row redriven: a call that stopped at `max_messages` is resumed by calling
/// again.
#[allow(clippy::too_many_arguments)]
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn dlq_redrive(
    queue: Option<&str>,
    consumer_group: default!(Option<&str>, "NULL"),
    partition: default!(Option<&str>, "NULL"),
    error_like: default!(Option<&str>, "NULL"),
    since: default!(Option<pgrx::datum::TimestampWithTimeZone>, "NULL"),
    until: default!(Option<pgrx::datum::TimestampWithTimeZone>, "NULL"),
    max_messages: default!(Option<i32>, 10000),
    deliver_to: default!(Option<&str>, "'failing_group'"),
    force: default!(Option<bool>, false),
) -> JsonB {
    let queue = queue.unwrap_or_else(|| errors::null_arg("queue"));
    let limit = max_messages.unwrap_or_else(|| errors::null_arg("max_messages"));
    let to_arg = deliver_to.unwrap_or_else(|| errors::null_arg("deliver_to"));
    let force = force.unwrap_or_else(|| errors::null_arg("force"));
    crate::queue::names::check_queue_name("queue", queue);
    crate::queue::citus::ensure_home(queue);
    if let Some(g) = consumer_group {
        crate::queue::names::check_lane_name("consumer_group", g);
    }
    if let Some(p) = partition {
        crate::queue::names::check_lane_name("partition", p);
    }
    let to = queen_core::policy::check_redrive(limit, to_arg).unwrap_or_else(|v| errors::violation(v));
    crate::queue::privileges::require(Some(queue), crate::queue::privileges::Privilege::Admin);
    let filter = RedriveFilter { queue, group: consumer_group, partition, error_like, since, until, force };
    let (mut redriven, mut last) = (0i64, serde_json::Value::Null);
    while redriven < i64::from(limit) {
        let want = REDRIVE_ROUND.min(i64::from(limit) - redriven);
        let round = Spi::connect_mut(|client| redrive_round(client, &filter, want, to));
        let Some((items, ids, at)) = round else { break };
        let n = items.len() as i64;
        push_items(items);
        Spi::connect_mut(|client| {
            run(client, "UPDATE queen.log_dlq SET redriven_at = clock_timestamp() WHERE id = ANY($1)", &[ids.into()]);
        });
        redriven += n;
        last = at;
    }
    let more = Spi::connect_mut(|client| redrive_round(client, &filter, 1, to).is_some());
    JsonB(json!({"queue": queue, "deliverTo": to_arg, "redriven": redriven, "last": last, "more": more}))
}

/// What `dlq_redrive` selects.
struct RedriveFilter<'a> {
    queue: &'a str,
    group: Option<&'a str>,
    partition: Option<&'a str>,
    error_like: Option<&'a str>,
    since: Option<pgrx::datum::TimestampWithTimeZone>,
    until: Option<pgrx::datum::TimestampWithTimeZone>,
    force: bool,
}

/// The next `want` dead letters to redrive, locked, in partition then offset order: their
/// push items (payload and headers opened; with `FailingGroup`, the redrive header set),
/// their row ids, and where the round ended. None when no row is left.
fn redrive_round(
    client: &mut SpiClient<'_>,
    f: &RedriveFilter<'_>,
    want: i64,
    to: queen_core::policy::RedriveTo,
) -> Option<(Vec<PushItem>, Vec<pgrx::Uuid>, serde_json::Value)> {
    let failing = to == queen_core::policy::RedriveTo::FailingGroup;
    let rows = run(
        client,
        "SELECT d.id, p.name, coalesce(d.data, queen._open_dead_letter(d.envelope, d.message_id)),
                CASE WHEN $8 THEN coalesce(queen._dead_letter_headers(d.headers, d.message_id), '{}'::jsonb)
                                  || jsonb_build_object($9::text, d.consumer_group)
                     ELSE queen._dead_letter_headers(d.headers, d.message_id) END,
                d.msg_offset, d.consumer_group
           FROM queen.log_dlq d
           JOIN queen.queues q ON q.queue_id = d.queue_id
           JOIN queen.partitions p ON p.partition_id = d.partition_id
          WHERE q.name = $1 AND d.last_offset IS NULL AND (d.redriven_at IS NULL OR $10)
            AND ($2::text IS NULL OR d.consumer_group = $2) AND ($3::text IS NULL OR p.name = $3)
            AND ($4::text IS NULL OR d.error_message LIKE $4)
            AND ($5::timestamptz IS NULL OR d.failed_at >= $5) AND ($6::timestamptz IS NULL OR d.failed_at < $6)
            AND (NOT $10 OR d.redriven_at IS NULL OR d.redriven_at < statement_timestamp())
          ORDER BY p.name, d.msg_offset, d.consumer_group, d.id
          LIMIT $7
            FOR UPDATE OF d",
        &[
            f.queue.into(),
            f.group.into(),
            f.partition.into(),
            f.error_like.into(),
            f.since.into(),
            f.until.into(),
            want.into(),
            failing.into(),
            queen_core::policy::REDRIVE_HEADER.into(),
            f.force.into(),
        ],
    );
    let (mut items, mut ids, mut last) = (Vec::new(), Vec::new(), serde_json::Value::Null);
    for r in rows {
        let id: pgrx::Uuid = r.get(1).or_raise().unwrap();
        let partition: String = r.get(2).or_raise().unwrap();
        let payload = r
            .get::<crate::pg::jsonb::RawJsonb>(3)
            .or_raise()
            .unwrap_or_else(|| errors::internal("a dead letter without its payload"))
            .0;
        let headers = r.get::<crate::pg::jsonb::RawJsonb>(4).or_raise().map(|h| h.0);
        let offset: i64 = r.get(5).or_raise().unwrap();
        let group: String = r.get(6).or_raise().unwrap();
        last = json!({"partition": partition, "offset": offset, "consumerGroup": group, "id": from_pg_uuid(&id).to_string()});
        ids.push(id);
        items.push(PushItem {
            queue: f.queue.to_string(),
            partition,
            payload,
            transaction_id: None,
            headers,
            deliver_at: None,
        });
    }
    (!items.is_empty()).then_some((items, ids, last))
}
