//! Dead-letter queue (spec §7): replay and delete by address (partition_id,
//! transaction_id). Listing is plain SQL (`queen.dlq`, sql/api.sql); filing happens inside
//! the ack that gives up on a message (`ack::file_dead_letter`).

use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::{JsonB, PgSqlErrorCode};
use serde_json::json;

use crate::errors::{self, SpiExt};
use crate::push::{push_items, PushItem};
use crate::spi::{from_pg_uuid, run};

/// The oldest dead-letter row at an address, locked; P0002 when there is none. Two
/// consumer groups can dead-letter the same message: each call takes one row.
fn lock_row(
    client: &mut SpiClient<'_>,
    partition_id: pgrx::Uuid,
    transaction_id: &str,
) -> (pgrx::Uuid, String, String, Vec<u8>) {
    let rows = run(
        client,
        "SELECT d.id, q.name, p.name, coalesce(d.data, queen._open_dead_letter(d.envelope, d.message_id))
           FROM queen.log_dlq d
           JOIN queen.queues q ON q.queue_id = d.queue_id
           JOIN queen.partitions p ON p.partition_id = d.partition_id
          WHERE d.partition_id = $1 AND d.transaction_id = $2
          ORDER BY d.failed_at, d.id
          LIMIT 1
            FOR UPDATE OF d",
        &[partition_id.into(), transaction_id.into()],
    );
    let Some(row) = rows.into_iter().next() else {
        errors::raise(
            PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
            format!(
                "queen: no dead-letter row for partition_id {} and transaction_id {transaction_id:?}",
                from_pg_uuid(&partition_id)
            ),
        );
    };
    (
        row.get(1).or_raise().unwrap(),
        row.get(2).or_raise().unwrap(),
        row.get(3).or_raise().unwrap(),
        row.get::<crate::jsonb::RawJsonb>(4).or_raise().unwrap().0,
    )
}

fn args(partition_id: Option<pgrx::Uuid>, transaction_id: Option<&str>) -> (pgrx::Uuid, &str) {
    (
        partition_id.unwrap_or_else(|| errors::null_arg("partition_id")),
        transaction_id.unwrap_or_else(|| errors::null_arg("transaction_id")),
    )
}

/// Re-pushes the stored payload to its queue and partition with a fresh transaction id,
/// then removes the row — one transaction, so a failed push leaves the row in place.
#[pg_extern]
#[search_path(pg_catalog, pg_temp)]
fn dlq_replay(partition_id: Option<pgrx::Uuid>, transaction_id: Option<&str>) -> JsonB {
    let (partition_id, transaction_id) = args(partition_id, transaction_id);
    let (id, queue, partition, payload) = Spi::connect_mut(|client| lock_row(client, partition_id, transaction_id));
    let pushed = push_items(vec![PushItem { queue, partition, payload, transaction_id: None }]);
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

/// Removes the dead-letter row at the address and nothing else.
#[pg_extern]
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
