//! Push (spec §3): one immutable segment per partition per call, offsets reserved under
//! the partition row lock so that they commit gapless and in order.

use std::collections::{BTreeMap, HashMap};

use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use queen_core::segment::{self, Frame};

use crate::errors::{self, check_lane_name, check_queue_name, SpiExt};
use crate::jsonb::{Found, JsonbArg, RawJsonb};
use crate::queues;
use crate::spi::{new_ids, run, to_pg_uuid};

/// Largest payload accepted, in jsonb's binary form.
pub const MAX_PAYLOAD_BYTES: usize = 64 << 20;
/// Most items in one push_batch call.
pub const MAX_BATCH_ITEMS: usize = 100_000;
/// Most payload bytes in one call (a segment must stay well below bytea's 1 GB).
pub const MAX_CALL_BYTES: usize = 256 << 20;
/// Longest transaction id.
pub const MAX_TRANSACTION_ID: usize = 512;
pub const DEFAULT_PARTITION: &str = "Default";

/// One message to push, validated.
pub struct PushItem {
    pub queue: String,
    pub partition: String,
    /// The payload as jsonb bytes (see `jsonb`).
    pub payload: Vec<u8>,
    pub transaction_id: Option<String>,
}

/// One result row: `queen.push_result`.
pub struct PushRow {
    pub idx: i32,
    pub status: &'static str,
    pub message_id: uuid::Uuid,
    pub transaction_id: String,
    pub partition_id: pgrx::Uuid,
    pub msg_offset: i64,
}


fn into_table(rows: Vec<PushRow>) -> TableIterator<
    'static,
    (
        name!(idx, i32),
        name!(status, String),
        name!(message_id, pgrx::Uuid),
        name!(transaction_id, String),
        name!(partition_id, pgrx::Uuid),
        name!(msg_offset, i64),
    ),
> {
    TableIterator::new(rows.into_iter().map(|r| {
        (r.idx, r.status.to_string(), to_pg_uuid(r.message_id), r.transaction_id, r.partition_id, r.msg_offset)
    }))
}

/// Checks one item; `at` names it in error messages ("" for push, "items[i]." for a batch)
/// and is only called on the error path.
fn check_item(item: &PushItem, at: &dyn Fn() -> String) {
    if queen_core::names::queue_name(&item.queue).is_err() {
        check_queue_name(&format!("{}queue", at()), &item.queue);
    }
    if queen_core::names::lane_name(&item.partition).is_err() {
        check_lane_name(&format!("{}partition", at()), &item.partition);
    }
    if item.payload.len() > MAX_PAYLOAD_BYTES {
        errors::raise(
            pgrx::PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!(
                "queen: {}payload is {} bytes (as jsonb); the most a message may carry is {MAX_PAYLOAD_BYTES}",
                at(),
                item.payload.len()
            ),
        );
    }
    if let Some(tx) = &item.transaction_id {
        if tx.is_empty() || tx.len() > MAX_TRANSACTION_ID {
            errors::invalid(
                &format!("{}transaction_id", at()),
                format_args!("must be 1 to {MAX_TRANSACTION_ID} bytes, got {}", tx.len()),
            );
        }
    }
}

/// `queen._push`, wrapped by `queen.push` (sql/api.sql).
/// Internal: called only by `queen.push` (sql/api.sql), which fixes the search_path.
#[pg_extern(name = "_push")]
fn push_one(
    p_queue: Option<&str>,
    p_payload: Option<RawJsonb>,
    p_partition: Option<&str>,
    p_transaction_id: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(idx, i32),
        name!(status, String),
        name!(message_id, pgrx::Uuid),
        name!(transaction_id, String),
        name!(partition_id, pgrx::Uuid),
        name!(msg_offset, i64),
    ),
> {
    let queue = p_queue.unwrap_or_else(|| errors::null_arg("queue"));
    let payload = p_payload.unwrap_or_else(|| errors::null_arg("payload"));
    let item = PushItem {
        queue: queue.to_string(),
        partition: p_partition.unwrap_or(DEFAULT_PARTITION).to_string(),
        payload: payload.0,
        transaction_id: p_transaction_id.map(str::to_string),
    };
    check_item(&item, &String::new);
    into_table(push_items(vec![item]))
}

/// The keys a push_batch item may have; anything else is refused (a typo such as
/// "partiton" must not silently send a message to the default partition).
const BATCH_KEYS: [&str; 4] = ["queue", "partition", "payload", "transactionId"];

/// A string field of a batch item: absent or null is None; anything else but a string
/// is an error naming the item and the key.
fn string_field(found: Option<Found>, at: &dyn Fn() -> String, key: &str) -> Option<String> {
    match found? {
        Found::Str(s) => Some(s),
        Found::Null => None,
        Found::Other(text) => errors::invalid(&format!("{}{key}", at()), format_args!("must be a string, got {text}")),
    }
}

/// Internal: called only by `queen.push_batch`, which fixes the search_path. The items
/// are read in jsonb's binary form; payloads are copied out as jsonb bytes.
#[pg_extern(name = "_push_batch")]
fn push_batch(p_items: Option<JsonbArg>) -> TableIterator<
    'static,
    (
        name!(idx, i32),
        name!(status, String),
        name!(message_id, pgrx::Uuid),
        name!(transaction_id, String),
        name!(partition_id, pgrx::Uuid),
        name!(msg_offset, i64),
    ),
> {
    let items_arg = p_items.unwrap_or_else(|| errors::null_arg("items"));
    let n = items_arg
        .array_len()
        .unwrap_or_else(|| errors::invalid("items", "must be a JSON array of objects"));
    if n == 0 {
        errors::invalid("items", "must hold at least one item");
    }
    if n as usize > MAX_BATCH_ITEMS {
        errors::raise(
            pgrx::PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("queen: items holds {n} messages; at most {MAX_BATCH_ITEMS} per call"),
        );
    }
    let mut items = Vec::with_capacity(n as usize);
    let mut total = 0usize;
    for i in 0..n {
        let at = || format!("items[{i}].");
        let obj = items_arg.object_at(i).unwrap_or_else(|text| {
            errors::invalid(
                &format!("items[{i}]"),
                format_args!("must be an object {{queue, partition?, payload, transactionId?}}, got {text}"),
            )
        });
        let (queue, partition, transaction_id) = (obj.get("queue"), obj.get("partition"), obj.get("transactionId"));
        // A JSON null payload is a payload; only a missing key is an error.
        let payload = obj.get_jsonb("payload");
        let present = [queue.is_some(), partition.is_some(), transaction_id.is_some(), payload.is_some()]
            .iter()
            .filter(|&&b| b)
            .count();
        obj.reject_unknown_keys(&BATCH_KEYS, present, &format!("items[{i}]"));
        let item = PushItem {
            queue: string_field(queue, &at, "queue")
                .unwrap_or_else(|| errors::invalid(&format!("{}queue", at()), "is missing")),
            partition: string_field(partition, &at, "partition").unwrap_or_else(|| DEFAULT_PARTITION.to_string()),
            payload: payload.unwrap_or_else(|| errors::invalid(&format!("{}payload", at()), "is missing")),
            transaction_id: string_field(transaction_id, &at, "transactionId"),
        };
        check_item(&item, &at);
        total += item.payload.len();
        items.push(item);
    }
    if total > MAX_CALL_BYTES {
        errors::raise(
            pgrx::PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("queen: items carry {total} payload bytes; at most {MAX_CALL_BYTES} per call"),
        );
    }
    into_table(push_items(items))
}

/// Reserves `n` offsets on a partition, creating it if needed. Returns the partition id
/// and the first reserved offset. The row lock taken here is held until commit.
fn reserve(client: &mut SpiClient<'_>, queue_id: i64, partition: &str, n: i64) -> (pgrx::Uuid, i64) {
    loop {
        let updated = run(
            client,
            "UPDATE queen.partitions SET head = head + $3 WHERE queue_id = $1 AND name = $2
             RETURNING partition_id, head",
            &[queue_id.into(), partition.into(), n.into()],
        );
        if let Some(row) = updated.into_iter().next() {
            let pid: pgrx::Uuid = row.get(1).or_raise().unwrap();
            let head: i64 = row.get(2).or_raise().unwrap();
            return (pid, head - n + 1);
        }
        if let Some((pid, head)) = queues::create_partition(client, queue_id, partition, n) {
            return (pid, head - n + 1);
        }
        // Another session created it between our UPDATE and INSERT: reserve on its row.
    }
}

/// Locks (or creates) a partition, then sorts `idxs` into duplicates — of a message stored
/// within the queue's dedup window, or of an earlier item of this call — and fresh items,
/// for which it reserves offsets and records the transaction ids. Duplicates get their
/// result row here (`status = 'duplicate'`, the original's message id and offset).
/// Concurrent pushes of one id serialize on the partition row lock, so exactly one wins.
#[allow(clippy::too_many_arguments)]
fn reserve_dedup(
    client: &mut SpiClient<'_>,
    queue_id: i64,
    partition: &str,
    dedup_window: i32,
    idxs: &[usize],
    items: &[PushItem],
    message_ids: &[uuid::Uuid],
    transaction_ids: &[String],
    rows: &mut [Option<PushRow>],
) -> (pgrx::Uuid, i64, Vec<usize>) {
    let pid = loop {
        let locked = run(
            client,
            "SELECT partition_id FROM queen.partitions WHERE queue_id = $1 AND name = $2 FOR UPDATE",
            &[queue_id.into(), partition.into()],
        );
        if let Some(pid) = crate::spi::first_value::<pgrx::Uuid>(locked) {
            break pid;
        }
        if let Some((pid, _)) = queues::create_partition(client, queue_id, partition, 0) {
            break pid;
        }
    };
    let asked: Vec<String> =
        idxs.iter().filter(|&&i| items[i].transaction_id.is_some()).map(|&i| transaction_ids[i].clone()).collect();
    let known: HashMap<String, (pgrx::Uuid, i64)> = run(
        client,
        "SELECT transaction_id, message_id, msg_offset FROM queen.dedup
          WHERE partition_id = $1 AND transaction_id = ANY($2)
            AND created_at > now() - make_interval(secs => $3)",
        &[pid.into(), asked.into(), f64::from(dedup_window).into()],
    )
    .into_iter()
    .map(|r| (r.get::<String>(1).or_raise().unwrap(), (r.get(2).or_raise().unwrap(), r.get(3).or_raise().unwrap())))
    .collect();

    let mut fresh = Vec::with_capacity(idxs.len());
    let mut pending: Vec<(usize, usize)> = Vec::new(); // (duplicate idx, fresh position of original)
    let mut in_call: HashMap<&str, usize> = HashMap::new();
    for &i in idxs {
        if items[i].transaction_id.is_some() {
            let tx = transaction_ids[i].as_str();
            if let Some(&(message_id, msg_offset)) = known.get(tx) {
                rows[i] = Some(PushRow {
                    idx: i as i32,
                    status: "duplicate",
                    message_id: crate::spi::from_pg_uuid(&message_id),
                    transaction_id: tx.to_string(),
                    partition_id: pid,
                    msg_offset,
                });
                continue;
            }
            if let Some(&pos) = in_call.get(tx) {
                pending.push((i, pos));
                continue;
            }
            in_call.insert(tx, fresh.len());
        }
        fresh.push(i);
    }
    if fresh.is_empty() {
        return (pid, 0, fresh);
    }
    let n = fresh.len() as i64;
    let head = crate::spi::first_value::<i64>(run(
        client,
        "UPDATE queen.partitions SET head = head + $2 WHERE partition_id = $1 RETURNING head",
        &[pid.into(), n.into()],
    ))
    .unwrap_or_else(|| crate::errors::internal("locked partition vanished"));
    let first = head - n + 1;
    for (i, pos) in pending {
        let original = fresh[pos];
        rows[i] = Some(PushRow {
            idx: i as i32,
            status: "duplicate",
            message_id: message_ids[original],
            transaction_id: transaction_ids[i].clone(),
            partition_id: pid,
            msg_offset: first + pos as i64,
        });
    }
    let (mut txs, mut ids, mut offsets) = (Vec::new(), Vec::new(), Vec::new());
    for (k, &i) in fresh.iter().enumerate() {
        if items[i].transaction_id.is_some() {
            txs.push(transaction_ids[i].clone());
            ids.push(crate::spi::to_pg_uuid(message_ids[i]));
            offsets.push(first + k as i64);
        }
    }
    run(
        client,
        "INSERT INTO queen.dedup (partition_id, transaction_id, message_id, msg_offset)
         SELECT $1, * FROM unnest($2::text[], $3::uuid[], $4::int8[])
         ON CONFLICT (partition_id, transaction_id) DO UPDATE
           SET message_id = EXCLUDED.message_id, msg_offset = EXCLUDED.msg_offset,
               created_at = EXCLUDED.created_at",
        &[pid.into(), txs.into(), ids.into(), offsets.into()],
    );
    // Keep the dedup state bounded: now and then, drop this partition's expired entries.
    if first % 64 < n {
        run(
            client,
            "DELETE FROM queen.dedup WHERE partition_id = $1
                AND created_at <= now() - make_interval(secs => $2)",
            &[pid.into(), f64::from(dedup_window).into()],
        );
    }
    (pid, first, fresh)
}

/// Stores validated items: one segment per (queue, partition), offsets in input order.
pub fn push_items(items: Vec<PushItem>) -> Vec<PushRow> {
    // BTreeMap order is the lock order: (queue, partition) by name.
    let mut groups: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        groups.entry((item.queue.as_str(), item.partition.as_str())).or_default().push(i);
    }
    let message_ids: Vec<uuid::Uuid> = new_ids(items.len());
    let minted = new_ids(items.iter().filter(|it| it.transaction_id.is_none()).count());
    let mut minted = minted.iter();
    let transaction_ids: Vec<String> = items
        .iter()
        .map(|it| match &it.transaction_id {
            Some(t) => t.clone(),
            None => queen_core::ids::uuid_string(minted.next().unwrap().as_bytes()),
        })
        .collect();

    let mut rows: Vec<Option<PushRow>> = (0..items.len()).map(|_| None).collect();
    Spi::connect_mut(|client| {
        let mut queue_ids: BTreeMap<&str, (i64, i32, bool)> = BTreeMap::new();
        for &(queue, _) in groups.keys() {
            if !queue_ids.contains_key(queue) {
                queue_ids.insert(queue, queues::ensure_queue(client, queue));
                crate::wake::notify_on_commit(queue);
            }
        }
        let mut seg_pids = Vec::with_capacity(groups.len());
        let mut seg_first = Vec::with_capacity(groups.len());
        let mut seg_last = Vec::with_capacity(groups.len());
        let mut seg_data: Vec<Vec<u8>> = Vec::with_capacity(groups.len());
        for (&(queue, partition), idxs) in &groups {
            let (queue_id, dedup_window, encrypted) = queue_ids[queue];
            let producer_ids = idxs.iter().any(|&i| items[i].transaction_id.is_some());
            // Minted transaction ids are unique: only producer-supplied ones need the
            // dedup window, and only they pay for it.
            let (pid, first, fresh) = if producer_ids && dedup_window > 0 {
                reserve_dedup(client, queue_id, partition, dedup_window, idxs, &items, &message_ids, &transaction_ids, &mut rows)
            } else {
                let (pid, first) = reserve(client, queue_id, partition, idxs.len() as i64);
                (pid, first, idxs.clone())
            };
            if fresh.is_empty() {
                continue; // every item was a duplicate: no segment, no offsets
            }
            let n = fresh.len() as i64;
            // An encrypted queue stores envelopes (see `encryption`), sealed per message.
            let sealed: Option<Vec<Vec<u8>>> = encrypted.then(|| {
                crate::encryption::seal_all(queue, fresh.iter().map(|&i| (&message_ids[i], &items[i].payload[..])))
            });
            let frames = fresh.iter().enumerate().map(|(k, &i)| Frame {
                message_id: *message_ids[i].as_bytes(),
                transaction_id: &transaction_ids[i],
                payload: sealed.as_ref().map_or(&items[i].payload[..], |s| &s[k][..]),
            });
            seg_data.push(segment::encode(frames));
            for (k, &i) in fresh.iter().enumerate() {
                rows[i] = Some(PushRow {
                    idx: i as i32,
                    status: "queued",
                    message_id: message_ids[i],
                    transaction_id: transaction_ids[i].clone(),
                    partition_id: pid,
                    msg_offset: first + k as i64,
                });
            }
            seg_pids.push(pid);
            seg_first.push(first);
            seg_last.push(first + n - 1);
        }
        if seg_pids.is_empty() {
            return;
        }
        if seg_pids.len() == 1 {
            run(
                client,
                "INSERT INTO queen.segments (partition_id, first_offset, last_offset, data)
                 VALUES ($1, $2, $3, $4)",
                &[seg_pids[0].into(), seg_first[0].into(), seg_last[0].into(), seg_data.pop().unwrap().into()],
            );
        } else {
            run(
                client,
                "INSERT INTO queen.segments (partition_id, first_offset, last_offset, data)
                 SELECT * FROM unnest($1::uuid[], $2::int8[], $3::int8[], $4::bytea[])",
                &[seg_pids.into(), seg_first.into(), seg_last.into(), seg_data.into()],
            );
        }
    });
    rows.into_iter().map(|r| r.expect("every item belongs to one segment")).collect()
}
