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
