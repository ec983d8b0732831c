//! Push: one immutable segment per partition per call. Offsets are reserved without a
//! commit-long lock (`offsets`), so pushes to one partition commit in parallel; a small
//! push goes to the fresh tier, which compaction merges into large segments later.

use std::collections::{BTreeMap, HashMap, HashSet};

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use queen_core::compaction::FRESH_MAX;
use queen_core::offsets::reservation_end;
use queen_core::segment::{self, Entry, Frame};
use smallvec::SmallVec;

use crate::offsets::exhausted;
use crate::pg::errors::{self, SpiExt};
use crate::pg::ids::{new_ids, to_pg_uuid};
use crate::pg::jsonb::{Found, JsonbArg, RawJsonb};
use crate::pg::spi::{first_value, run};
use crate::pg::srf::{arg, function_info_v1, ResultRows};
use crate::queue::lookup::{self, Target};
use crate::queue::names::{check_lane_name, check_queue_name};
use crate::queue::privileges::Privilege;

// Limits of a push (a segment must stay well below bytea's 1 GB): the policy's.
use queen_core::policy::limits::{
    BATCH_ITEMS as MAX_BATCH_ITEMS, CALL_BYTES as MAX_CALL_BYTES, HEADERS_BYTES as MAX_HEADERS_BYTES,
    PAYLOAD_BYTES as MAX_PAYLOAD_BYTES, TRANSACTION_ID as MAX_TRANSACTION_ID,
};
use queen_core::policy::DEFAULT_PARTITION;

/// One message to push, validated.
pub struct PushItem {
    pub queue: String,
    pub partition: String,
    /// The payload as jsonb bytes (see `jsonb`).
    pub payload: Vec<u8>,
    pub transaction_id: Option<String>,
    /// The headers object as jsonb bytes; None: no headers.
    pub headers: Option<Vec<u8>>,
    /// Not delivered before this time (microseconds since 2000-01-01); None: no such time.
    pub deliver_at: Option<i64>,
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

/// A push's rows: `queen.push_result`, six columns.
type PushRows = ResultRows<6>;

/// Stores the rows and returns from the call.
fn finish(mut out: PushRows, rows: Vec<PushRow>) -> pg_sys::Datum {
    for r in rows {
        out.put(|| {
            (
                [
                    pg_sys::Datum::from(r.idx),
                    r.status.into_datum().unwrap(),
                    to_pg_uuid(r.message_id).into_datum().unwrap(),
                    r.transaction_id.into_datum().unwrap(),
                    r.partition_id.into_datum().unwrap(),
                    pg_sys::Datum::from(r.msg_offset),
                ],
                [false; 6],
            )
        });
    }
    out.finish()
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
    if let Some(headers) = &item.headers {
        if !crate::pg::jsonb::is_object(headers) {
            // SAFETY: the headers are the jsonb bytes of the call's argument, as PostgreSQL
            // parsed them.
            let text = unsafe { crate::pg::jsonb::to_text(headers) };
            errors::invalid(
                &format!("{}headers", at()),
                format_args!("must be a JSON object, got {}", crate::pg::errors::excerpt(&text)),
            );
        }
        // The redrive header is queen's own (`queen.dlq_redrive`): a producer that set it
        // could hide its message from every group but one, or from all.
        if crate::pg::jsonb::value_at(headers, queen_core::policy::REDRIVE_HEADER).is_some() {
            errors::invalid(
                &format!("{}headers", at()),
                format_args!("the key {:?} is reserved for queen.dlq_redrive", queen_core::policy::REDRIVE_HEADER),
            );
        }
        if headers.len() > MAX_HEADERS_BYTES {
            errors::raise(
                pgrx::PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!(
                    "queen: {}headers is {} bytes (as jsonb); the most a message may carry is {MAX_HEADERS_BYTES}",
                    at(),
                    headers.len()
                ),
            );
        }
    }
    if let Some(deliver_at) = item.deliver_at {
        // SAFETY: a plain read of the current transaction's start time.
        let now = unsafe { pgrx::pg_sys::GetCurrentTransactionStartTimestamp() };
        if let Err(v) = queen_core::policy::check_deliver_at(deliver_at, now) {
            errors::invalid(&format!("{}deliver_at", at()), v.detail);
        }
    }
    if let Some(tx) = &item.transaction_id {
        if tx.is_empty() || tx.len() > MAX_TRANSACTION_ID {
            errors::invalid(
                &format!("{}transaction_id", at()),
                format_args!("must be 1 to {MAX_TRANSACTION_ID} bytes, got {}", tx.len()),
            );
        }
        if queen_core::addresses::is_span_address(tx) {
            errors::invalid(
                &format!("{}transaction_id", at()),
                format_args!(
                    "{tx:?} has the form of a dead-letter span's address ({}), which queen keeps for itself",
                    queen_core::addresses::span_forms()
                ),
            );
        }
    }
}

extension_sql!(
    r#"
CREATE FUNCTION queen.push(
    queue text,
    payload jsonb,
    partition text DEFAULT 'Default',
    transaction_id text DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    deliver_at timestamptz DEFAULT NULL
) RETURNS SETOF queen.push_result
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'push_one_wrapper';
COMMENT ON FUNCTION queen.push(text, jsonb, text, text, jsonb, timestamptz) IS
  'queen: push one message (with optional headers and delivery time); returns queen.push_result (status queued or duplicate)';
"#,
    name = "push"
);

function_info_v1!(pg_finfo_push_one_wrapper);

/// `queen.push(queue, payload, partition, transaction_id, headers, deliver_at)`: one
/// message; one result row (`idx` 0). It pins its search path itself
/// (`spi::with_pinned_search_path`), which costs far less per call than a SET clause.
///
/// # Safety
/// Called by PostgreSQL only, as the function declared above.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn push_one_wrapper(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: this call's fcinfo, of a function returning SETOF queen.push_result.
    let out = unsafe { PushRows::begin(fcinfo, "queen.push_result") };
    // SAFETY: the arguments are those of queen.push.
    let row = unsafe { push_one(fcinfo) };
    finish(out, vec![row])
}

/// Pushes the one message of a `queen.push` or `queen.send` call (the two declarations'
/// arguments are the same: keep them in step) and returns its result.
///
/// # Safety
/// `fcinfo` is the call's, with the arguments (and SQL types) of `queen.push`.
unsafe fn push_one(fcinfo: pg_sys::FunctionCallInfo) -> PushRow {
    // SAFETY: as the caller promises.
    let item = unsafe { one_item(fcinfo) };
    let mut rows = crate::pg::spi::with_pinned_search_path(|| push_items(vec![item]));
    rows.pop().expect("one item, one result")
}

/// The message of a `queen.push` or `queen.send` call, checked.
///
/// # Safety
/// `fcinfo` is the call's, with the arguments (and SQL types) of `queen.push`.
unsafe fn one_item(fcinfo: pg_sys::FunctionCallInfo) -> PushItem {
    // SAFETY: as the caller promises.
    let (queue, payload, partition, transaction_id, headers, deliver_at) = unsafe {
        (
            arg::<&str>(fcinfo, 0).unwrap_or_else(|| errors::null_arg("queue")),
            arg::<RawJsonb>(fcinfo, 1).unwrap_or_else(|| errors::null_arg("payload")),
            arg::<&str>(fcinfo, 2),
            arg::<&str>(fcinfo, 3),
            arg::<RawJsonb>(fcinfo, 4),
            arg::<TimestampWithTimeZone>(fcinfo, 5),
        )
    };
    let item = PushItem {
        queue: queue.to_string(),
        partition: partition.unwrap_or(DEFAULT_PARTITION).to_string(),
        payload: payload.0,
        transaction_id: transaction_id.map(str::to_string),
        headers: headers.map(|h| h.0),
        deliver_at: deliver_at.map(i64::from),
    };
    check_item(&item, &String::new);
    item
}

extension_sql!(
    r#"
CREATE FUNCTION queen.send(
    queue text,
    payload jsonb,
    partition text DEFAULT 'Default',
    transaction_id text DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    deliver_at timestamptz DEFAULT NULL
) RETURNS bigint
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'send_wrapper';
COMMENT ON FUNCTION queen.send(text, jsonb, text, text, jsonb, timestamptz) IS
  'queen: push one message and return its offset in its partition (a duplicate: the original''s); push''s scalar form';
"#,
    name = "send"
);

function_info_v1!(pg_finfo_send_wrapper);

/// `queen.send(...)`: `queen.push` with the same arguments, returning only the message's
/// offset as a scalar. A single push called as a set-returning function pays for a
/// function scan, a result tuplestore and its row on every call; a scalar pays for none.
///
/// # Safety
/// Called by PostgreSQL only, as the function declared above.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn send_wrapper(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: the arguments are those of queen.push (the declaration above).
    let row = unsafe { push_one(fcinfo) };
    pg_sys::Datum::from(row.msg_offset)
}

/// The keys a push_batch item may have; anything else is refused (a typo such as
/// "partiton" must not silently send a message to the default partition).
const BATCH_KEYS: [&str; 6] = ["queue", "partition", "payload", "transactionId", "headers", "deliverAt"];

/// A string field of a batch item: absent or null is None; anything else but a string
/// is an error naming the item and the key.
fn string_field(found: Option<Found>, at: &dyn Fn() -> String, key: &str) -> Option<String> {
    match found? {
        Found::Str(s) => Some(s),
        Found::Null => None,
        Found::Other(text) => errors::invalid(&format!("{}{key}", at()), format_args!("must be a string, got {text}")),
    }
}

extension_sql!(
    r#"
CREATE FUNCTION queen.push_batch(items jsonb) RETURNS SETOF queen.push_result
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'push_batch_wrapper';
COMMENT ON FUNCTION queen.push_batch(jsonb) IS
  'queen: push a JSON array of {queue, partition?, payload, transactionId?, headers?, deliverAt?} atomically';
"#,
    name = "push_batch",
    requires = ["push"]
);

function_info_v1!(pg_finfo_push_batch_wrapper);

/// `queen.push_batch(items)`: a JSON array of `{queue, partition?, payload, transactionId?,
/// headers?, deliverAt?}`, atomically; one result row per item in input order. The items
/// are read in jsonb's binary form; payloads are copied out as jsonb bytes. Pins its
/// search path as `push`.
///
/// # Safety
/// Called by PostgreSQL only, as the function declared above.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn push_batch_wrapper(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: this call's fcinfo, of a function returning SETOF queen.push_result.
    let out = unsafe { PushRows::begin(fcinfo, "queen.push_result") };
    // SAFETY: the argument is jsonb, as declared above.
    let items_arg = unsafe { arg::<JsonbArg>(fcinfo, 0) }.unwrap_or_else(|| errors::null_arg("items"));
    let items = read_batch(items_arg, None);
    // On Citus, items for queues that live on other nodes go there (`push_at_homes`).
    let queues: Vec<&str> = items.iter().map(|it| it.queue.as_str()).collect();
    let rows = match push_at_homes(items_arg, &queues) {
        Some(rows) => rows,
        None => crate::pg::spi::with_pinned_search_path(|| push_items(items)),
    };
    finish(out, rows)
}

/// The items of a `push_batch` call, read and checked. With `call_queue` (the form that
/// names its queue, for Citus routing) an item may leave `queue` out, and may not name
/// another queue.
fn read_batch(items_arg: JsonbArg, call_queue: Option<&str>) -> Vec<PushItem> {
    let n = items_arg.array_len().unwrap_or_else(|| errors::invalid("items", "must be a JSON array of objects"));
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
        let item = batch_item(&items_arg, i, call_queue, &at);
        check_item(&item, &at);
        total += item.payload.len() + item.headers.as_ref().map_or(0, Vec::len);
        items.push(item);
    }
    if total > MAX_CALL_BYTES {
        errors::raise(
            pgrx::PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("queen: items carry {total} payload and header bytes; at most {MAX_CALL_BYTES} per call"),
        );
    }
    items
}

/// Item `i` of a batch, read (`check_item` checks it after): a clear 22023 naming the
/// item's key when a key is unknown, missing or of the wrong type. `at` is its prefix.
fn batch_item(items_arg: &JsonbArg, i: u32, call_queue: Option<&str>, at: &dyn Fn() -> String) -> PushItem {
    let obj = items_arg.object_at(i).unwrap_or_else(|text| {
        errors::invalid(
            &format!("items[{i}]"),
            format_args!(
                "must be an object {{queue, partition?, payload, transactionId?, headers?, deliverAt?}}, got {text}"
            ),
        )
    });
    let (queue, partition, transaction_id) = (obj.get("queue"), obj.get("partition"), obj.get("transactionId"));
    // A JSON null payload is a payload; only a missing key is an error. Null headers
    // are no headers.
    let payload = obj.get_jsonb("payload");
    let mut present = [queue.is_some(), partition.is_some(), transaction_id.is_some(), payload.is_some()]
        .iter()
        .filter(|&&b| b)
        .count();
    // The rarer keys are looked up only when the object has more keys than these.
    let (headers, deliver_at) =
        if obj.key_count() > present { (obj.get("headers"), obj.get("deliverAt")) } else { (None, None) };
    present += usize::from(headers.is_some()) + usize::from(deliver_at.is_some());
    obj.reject_unknown_keys(&BATCH_KEYS, present, &format!("items[{i}]"));
    PushItem {
        queue: match (string_field(queue, &at, "queue"), call_queue) {
            (Some(q), Some(c)) if q != c => errors::invalid(
                &format!("{}queue", at()),
                format_args!("is {q:?}, but this call pushes to {c:?} only (leave the key out)"),
            ),
            (Some(q), _) => q,
            (None, Some(c)) => c.to_string(),
            (None, None) => errors::invalid(&format!("{}queue", at()), "is missing"),
        },
        partition: string_field(partition, &at, "partition").unwrap_or_else(|| DEFAULT_PARTITION.to_string()),
        payload: payload.unwrap_or_else(|| errors::invalid(&format!("{}payload", at()), "is missing")),
        transaction_id: string_field(transaction_id, &at, "transactionId"),
        headers: match headers {
            None | Some(Found::Null) => None,
            Some(_) => obj.get_jsonb("headers"),
        },
        // deliverAt: a timestamp as PostgreSQL reads timestamptz text (ISO 8601).
        deliver_at: string_field(deliver_at, &at, "deliverAt")
            .map(|t| parse_timestamptz(&format!("{}deliverAt", at()), &t)),
    }
}

extension_sql!(
    r#"
CREATE FUNCTION queen.push_batch(queue text, items jsonb) RETURNS SETOF queen.push_result
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'push_batch_to_wrapper';
COMMENT ON FUNCTION queen.push_batch(text, jsonb) IS
  'queen: push a JSON array of {partition?, payload, transactionId?, headers?, deliverAt?} to one queue atomically';
"#,
    name = "push_batch_to",
    requires = ["push_batch"]
);

function_info_v1!(pg_finfo_push_batch_to_wrapper);

/// `queen.push_batch(queue, items)`: `push_batch` for one queue, which the call names
/// first. On Citus the coordinator routes it by that argument, as it routes `push`
/// (src/queue/citus.rs); anywhere else it is `push_batch` with every item's queue set.
///
/// # Safety
/// Called by PostgreSQL only, as the function declared above.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn push_batch_to_wrapper(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: this call's fcinfo, of a function returning SETOF queen.push_result.
    let out = unsafe { PushRows::begin(fcinfo, "queen.push_result") };
    // SAFETY: the arguments are text and jsonb, as declared above.
    let (queue, items_arg) = unsafe { (arg::<&str>(fcinfo, 0), arg::<JsonbArg>(fcinfo, 1)) };
    let queue = queue.unwrap_or_else(|| errors::null_arg("queue"));
    check_queue_name("queue", queue);
    let items = read_batch(items_arg.unwrap_or_else(|| errors::null_arg("items")), Some(queue));
    let rows = crate::pg::spi::with_pinned_search_path(|| push_items(items));
    finish(out, rows)
}

/// A `deliverAt` timestamp (RFC 3339, `queen_core::policy::rfc3339`), in microseconds;
/// 22023 naming `argument` for any other text. PostgreSQL reads the checked text, so only
/// a time it cannot represent can still fail there (22008).
fn parse_timestamptz(argument: &str, text: &str) -> i64 {
    if !queen_core::policy::rfc3339(text) {
        errors::invalid(argument, format_args!("{text:?} is not an RFC 3339 timestamp (such as 2026-12-01T10:00:00Z)"));
    }
    let c = std::ffi::CString::new(text).expect("an RFC 3339 timestamp has no NUL");
    // SAFETY: timestamptz_in on a NUL-terminated string (typmod -1); an ERROR it raises
    // propagates as any ERROR does.
    let d = unsafe {
        pgrx::direct_function_call::<TimestampWithTimeZone>(
            pgrx::pg_sys::timestamptz_in,
            &[
                Some(pgrx::pg_sys::Datum::from(c.as_ptr())),
                Some(pgrx::pg_sys::Datum::from(0u32)),
                Some(pgrx::pg_sys::Datum::from(-1i32)),
            ],
        )
    };
    i64::from(d.unwrap_or_else(|| errors::internal("timestamptz_in returned NULL")))
}

/// Whether a push of `n` offsets to a partition writes to the fresh tier (decided when
/// they are reserved, so that readers know where to look).
fn goes_fresh(n: usize) -> bool {
    n < FRESH_MAX
}

/// Finds a queue's partition in one statement, creating the queue and the partition when
/// they do not exist yet.
fn locate(client: &mut SpiClient<'_>, queue: &str, partition: &str, privilege: Privilege) -> Target {
    // Between a restart on this library and `ALTER EXTENSION queen UPDATE`, the schema is
    // 0.3.0's: it has no limits to read, and a push works as it did.
    const LOCATE: &str = concat!(
        "SELECT q.queue_id, q.dedup_window, q.encryption, p.partition_id, ",
        crate::ops::overflow::locate_limits!(),
        " FROM queen.queues q LEFT JOIN queen.partitions p ON p.queue_id = q.queue_id AND p.name = $2
         WHERE q.name = $1"
    );
    const LOCATE_0_3: &str = "SELECT q.queue_id, q.dedup_window, q.encryption, p.partition_id, NULL::int8, false
                                FROM queen.queues q LEFT JOIN queen.partitions p ON p.queue_id = q.queue_id AND p.name = $2
                               WHERE q.name = $1";
    let sql = if crate::pg::catalog::queen_column(c"queues", c"max_depth") { LOCATE } else { LOCATE_0_3 };
    loop {
        let row = run(client, sql, &[queue.into(), partition.into()]);
        let Some(r) = row.into_iter().next() else {
            // A new queue: created (or found, when another session just created it), then
            // read again; one deleted since the call's check (or while this waited for its
            // lock, below) only for a role that may create queues (privileges, module docs).
            crate::queue::privileges::require(Some(queue), privilege);
            lookup::ensure_queue(client, queue);
            continue;
        };
        let queue_id = r.get::<i64>(1).or_raise().unwrap();
        let pid = r.get::<pgrx::Uuid>(4).or_raise();
        // The queue lock before the partition row's foreign key locks the queue row
        // (`queen_core::lock_order`); a queue deleted while this waited is created again.
        // (Under REPEATABLE READ that foreign key fails on a queue deleted since the
        // snapshot, and `target_locked` checks again in any case.)
        if pid.is_none() && !crate::pg::locks::share_queue(queue_id) {
            continue;
        }
        // A partition another session creates at the same moment: look it up again.
        if let Some(partition_id) = pid.or_else(|| lookup::create_partition(client, queue_id, partition)) {
            return Target {
                queue_id,
                partition_id,
                dedup_window: r.get::<i32>(2).or_raise().unwrap(),
                encrypted: r.get::<bool>(3).or_raise().unwrap(),
                max_depth: r.get::<i64>(5).or_raise(),
                lag_limited: r.get::<bool>(6).or_raise().unwrap(),
            };
        }
    }
}

/// Reserves `n` offsets of a partition for this transaction; returns the first, or None
/// when the partition is gone (`drop_partition`): the caller looks its target up again.
/// With the registry (`offsets`) nothing is locked. Without it the partition row is
/// updated and stays locked until commit, so pushes to one partition commit in offset
/// order; its head starts past anything stored (the registry does not keep that column
/// current).
/// `pushed_at`: the time the messages carry (their segment's `created_at`).
fn reserve(
    client: &mut SpiClient<'_>,
    partition_id: pgrx::Uuid,
    n: i64,
    writes_all: bool,
    pushed_at: i64,
) -> Option<i64> {
    if crate::offsets::enabled() {
        return crate::offsets::reserve(client, partition_id, n, writes_all, goes_fresh(n as usize), pushed_at);
    }
    let head = crate::pg::spi::first_value::<i64>(run(
        client,
        "UPDATE queen.partitions p
            SET head = greatest(p.head, p.retained_through,
                         (SELECT s.last_offset FROM queen.segments s WHERE s.partition_id = $1
                           ORDER BY s.first_offset DESC LIMIT 1),
                         (SELECT f.last_offset FROM queen.fresh_segments f WHERE f.partition_id = $1
                           ORDER BY f.first_offset DESC LIMIT 1)) + $2
          WHERE p.partition_id = $1
         RETURNING p.head",
        &[partition_id.into(), n.into()],
    ))?;
    // The row's head moved by `n` from `head - n`: past the last offset, the error rolls
    // that back with the call.
    if reservation_end(head - n, n).is_none() {
        exhausted(n);
    }
    Some(head - n + 1)
}

/// The in-window duplicates of a partition's items, found before any offset is reserved:
/// (transaction id -> original message id and offset).
fn stored_duplicates(
    client: &mut SpiClient<'_>,
    t: &Target,
    transaction_ids: Vec<String>,
) -> HashMap<String, (pgrx::Uuid, i64)> {
    if transaction_ids.is_empty() {
        return HashMap::new();
    }
    run(
        client,
        concat!(
            "SELECT d.transaction_id, d.message_id, d.msg_offset FROM queen.dedup d
              WHERE d.partition_id = $1 AND d.transaction_id = ANY($2) AND ",
            queen_core::dedup_live_sql!("d", "$3")
        ),
        &[t.partition_id.into(), transaction_ids.into(), f64::from(t.dedup_window).into()],
    )
    .map(|r| (r.get::<String>(1).or_raise().unwrap(), (r.get(2).or_raise().unwrap(), r.get(3).or_raise().unwrap())))
    .collect()
}

/// Records the producer transaction ids of reserved items in `queen.dedup`. An id that a
/// concurrent push recorded first (the insert waits for that push to end) is a duplicate:
/// returns those, with the original's message id and offset. Ids are inserted in sorted
/// order, so two pushes that share several ids cannot deadlock.
fn record_ids(
    client: &mut SpiClient<'_>,
    t: &Target,
    ids: Vec<(String, uuid::Uuid, i64)>,
) -> HashMap<String, (pgrx::Uuid, i64)> {
    let mut ids = ids;
    ids.sort_by(|a, b| a.0.cmp(&b.0));
    let asked: Vec<String> = ids.iter().map(|i| i.0.clone()).collect();
    let message_ids: Vec<pgrx::Uuid> = ids.iter().map(|i| to_pg_uuid(i.1)).collect();
    let offsets: Vec<i64> = ids.iter().map(|i| i.2).collect();
    let recorded: HashSet<String> = run(
        client,
        concat!(
            "INSERT INTO queen.dedup AS d (partition_id, transaction_id, message_id, msg_offset)
             SELECT $1, u.t, u.m, u.o FROM unnest($2::text[], $3::uuid[], $4::int8[]) WITH ORDINALITY AS u(t, m, o, i)
              ORDER BY u.i
             ON CONFLICT (partition_id, transaction_id) DO UPDATE
                SET message_id = EXCLUDED.message_id, msg_offset = EXCLUDED.msg_offset,
                    created_at = EXCLUDED.created_at
              WHERE ",
            queen_core::dedup_expired_sql!("d", "$5"),
            " RETURNING d.transaction_id"
        ),
        &[
            t.partition_id.into(),
            asked.clone().into(),
            message_ids.into(),
            offsets.into(),
            f64::from(t.dedup_window).into(),
        ],
    )
    .map(|r| r.get::<String>(1).or_raise().unwrap())
    .collect();
    let lost: Vec<String> = asked.into_iter().filter(|tx| !recorded.contains(tx)).collect();
    let first = ids.first().map_or(0, |i| i.2);
    // Keep the dedup state bounded: now and then, drop this partition's expired entries
    // (never waiting on one a concurrent push holds).
    if queen_core::policy::dedup_prune_due(first, ids.len() as i64) {
        run(
            client,
            concat!(
                "DELETE FROM queen.dedup WHERE ctid = ANY(ARRAY(
                   SELECT d.ctid FROM queen.dedup d WHERE d.partition_id = $1 AND ",
                queen_core::dedup_expired_sql!("d", "$2"),
                " FOR UPDATE SKIP LOCKED))"
            ),
            &[t.partition_id.into(), f64::from(t.dedup_window).into()],
        );
    }
    stored_duplicates(client, t, lost)
}

/// A segment row to insert.
struct SegmentRow {
    pid: pgrx::Uuid,
    first: i64,
    last: i64,
    data: Vec<u8>,
}

/// Segment rows to insert, per tier.
#[derive(Default)]
struct Writes {
    rows: Vec<SegmentRow>,
}

impl Writes {
    fn push(&mut self, row: SegmentRow) {
        self.rows.push(row);
    }

    fn insert(self, client: &mut SpiClient<'_>, fresh: bool, now: i64) {
        let Writes { rows } = self;
        if rows.is_empty() {
            return;
        }
        let generation = crate::storage::generations::current(client);
        // The fresh tier's rows go in directly (one row per small push: see `heap`), in
        // order, until the direct path refuses one (`insert_fresh_segment` then wrote
        // nothing); SQL takes that row and the rest.
        let mut direct = 0;
        while fresh
            && direct < rows.len()
            && crate::pg::heap::insert_fresh_segment(
                rows[direct].pid,
                rows[direct].first,
                rows[direct].last,
                now,
                &rows[direct].data,
                generation,
            )
        {
            direct += 1;
        }
        if direct == rows.len() {
            return;
        }
        let rest = &rows[direct..];
        let pids: Vec<pgrx::Uuid> = rest.iter().map(|r| r.pid).collect();
        let firsts: Vec<i64> = rest.iter().map(|r| r.first).collect();
        let lasts: Vec<i64> = rest.iter().map(|r| r.last).collect();
        let data: Vec<&[u8]> = rest.iter().map(|r| &r.data[..]).collect();
        let created_at = crate::pg::clock::timestamptz(now);
        // (A static text per table: `run` keeps a plan per text.)
        macro_rules! insert_into {
            ($table:literal) => {
                concat!(
                    "INSERT INTO queen.",
                    $table,
                    " (partition_id, first_offset, last_offset, created_at, data, generation)
                     SELECT u.p, u.f, u.l, $5, u.d, $6 FROM unnest($1::uuid[], $2::int8[], $3::int8[], $4::bytea[]) AS u(p, f, l, d)"
                )
            };
        }
        let sql = if fresh { insert_into!("fresh_segments") } else { insert_into!("segments") };
        run(
            client,
            sql,
            &[pids.into(), firsts.into(), lasts.into(), data.into(), created_at.into(), generation.into()],
        );
    }
}

/// Stores validated items: one segment per (queue, partition), offsets in input order.
/// Items whose producer transaction id was seen within the queue's dedup window (or
/// earlier in this call) are duplicates: nothing is stored for them, and their row names
/// the original. A duplicate found only after offsets were reserved (a concurrent push of
/// the same id won) leaves a gap at its offset.
pub fn push_items(items: Vec<PushItem>) -> Vec<PushRow> {
    push_items_as(items, Privilege::Produce)
}

/// `push_items` for a caller that needs `privilege` on the items' queues to push there:
/// `produce` for the push functions, `admin` for `dlq_replay` and `dlq_redrive`, whose
/// pushes are part of administering the queue (a 0.3.0 role given EXECUTE on
/// `dlq_replay` alone replays without being a producer of every queue).
pub fn push_items_as(items: Vec<PushItem>, privilege: Privilege) -> Vec<PushRow> {
    // Before the offsets registry (shared memory) is touched.
    errors::refuse_read_only("push", "stores messages");
    // (queue, partition) name order: the order partition rows are locked in without the
    // registry, so that two batches cannot deadlock.
    let mut groups: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        groups.entry((item.queue.as_str(), item.partition.as_str())).or_default().push(i);
    }
    // On Citus, every queue of the call must live on this node (`push_at_homes`).
    let mut last_queue = None;
    for &(queue, _) in groups.keys() {
        if last_queue != Some(queue) {
            crate::queue::citus::ensure_home(queue);
            crate::queue::privileges::require(Some(queue), privilege);
            last_queue = Some(queue);
        }
    }
    let mut call = Call::new(&items, privilege);
    Spi::connect_mut(|client| {
        for (&(queue, partition), idxs) in &groups {
            // Once more when the partition was dropped under this push (`reserve`): the
            // target is looked up again, and the partition created anew.
            while !call.push_to(client, queue, partition, idxs) {
                // Under REPEATABLE READ or SERIALIZABLE the lookup reads the transaction's
                // snapshot, which still shows the dropped partition: it would find it
                // again, for ever.
                if errors::fixed_snapshot() {
                    errors::serialization_failure("the partition was dropped by a concurrent transaction");
                }
                crate::pg::cache::on_abort(); // forget the dropped partition's target
            }
        }
        let now = call.now;
        std::mem::take(&mut call.fresh_tier).insert(client, true, now);
        std::mem::take(&mut call.durable_tier).insert(client, false, now);
    });
    call.rows.into_iter().map(|r| r.expect("every item has a result")).collect()
}

/// One push call: its items, their ids, and what it decided so far. The steps of
/// `push_items` share it.
struct Call<'a> {
    items: &'a [PushItem],
    message_ids: Vec<uuid::Uuid>,
    /// Each item's producer transaction id, or its message id's text (`Call::new`).
    transaction_ids: Vec<String>,
    /// The segment rows' time and every frame's: the transaction's start, as now().
    now: i64,
    /// Each item's result, once decided.
    rows: Vec<Option<PushRow>>,
    fresh_tier: Writes,
    durable_tier: Writes,
    /// Messages stored so far by this call, per queue id (for `max_depth`): a call has a
    /// queue or a few, kept inline.
    queued: SmallVec<[(i64, i64); 4]>,
    /// What the caller needs on a queue to push there (`push_items_as`).
    privilege: Privilege,
}

impl<'a> Call<'a> {
    fn new(items: &'a [PushItem], privilege: Privilege) -> Self {
        let message_ids: Vec<uuid::Uuid> = new_ids(items.len());
        // A message given no transaction id gets its message id's text: unique as the
        // message id is, and not stored (the segment codec derives it, `TX_FROM_ID`).
        let transaction_ids: Vec<String> = items
            .iter()
            .zip(&message_ids)
            .map(|(it, id)| it.transaction_id.clone().unwrap_or_else(|| queen_core::ids::uuid_string(id.as_bytes())))
            .collect();
        // SAFETY: a plain read of the current transaction's start time.
        let now = unsafe { pgrx::pg_sys::GetCurrentTransactionStartTimestamp() };
        Call {
            items,
            message_ids,
            transaction_ids,
            now,
            rows: (0..items.len()).map(|_| None).collect(),
            fresh_tier: Writes::default(),
            durable_tier: Writes::default(),
            queued: SmallVec::new(),
            privilege,
        }
    }

    /// Item `i`'s result when it repeats a message stored at `original` (message id,
    /// offset) of partition `pid`.
    fn duplicate(&self, i: usize, pid: pgrx::Uuid, (message_id, msg_offset): (pgrx::Uuid, i64)) -> PushRow {
        PushRow {
            idx: i as i32,
            status: "duplicate",
            message_id: crate::pg::ids::from_pg_uuid(&message_id),
            transaction_id: self.transaction_ids[i].clone(),
            partition_id: pid,
            msg_offset,
        }
    }

    /// Pushes the items `idxs` of one (queue, partition): deduplicates them, reserves their
    /// offsets and queues their segment for its tier. False when the partition was dropped
    /// under this push (nothing decided: the caller tries again).
    fn push_to(&mut self, client: &mut SpiClient<'_>, queue: &str, partition: &str, idxs: &[usize]) -> bool {
        let t = target_locked(client, queue, partition, self.privilege);
        crate::pg::wake::notify_on_commit(queue);
        // Minted transaction ids are unique: only producer-supplied ones need the dedup
        // window, and only they pay for it.
        let items = self.items;
        let dedup =
            queen_core::policy::dedup_applies(t.dedup_window, idxs.iter().any(|&i| items[i].transaction_id.is_some()));
        let known = if dedup {
            let asked = idxs.iter().filter(|&&i| items[i].transaction_id.is_some());
            stored_duplicates(client, &t, asked.map(|&i| self.transaction_ids[i].clone()).collect())
        } else {
            HashMap::new()
        };
        // Items to store, duplicates of stored ids, and repeats within this call.
        let ids: Vec<Option<&str>> =
            idxs.iter().map(|&i| items[i].transaction_id.as_ref().map(|_| self.transaction_ids[i].as_str())).collect();
        let class = queen_core::dedup::classify(&ids, dedup, |tx| known.get(tx).copied());
        for (k, original) in class.known {
            self.rows[idxs[k]] = Some(self.duplicate(idxs[k], t.partition_id, original));
        }
        let fresh: Vec<usize> = class.store.iter().map(|&k| idxs[k]).collect();
        if fresh.is_empty() {
            return true; // every item was a duplicate: no offsets, no segment
        }
        self.check_limits(client, queue, &t, fresh.len() as i64);
        // Without dedup every reserved offset is written (or the call fails).
        let Some(first) = reserve(client, t.partition_id, fresh.len() as i64, !dedup, self.now) else {
            return false;
        };
        let lost = if dedup {
            let ids = fresh
                .iter()
                .enumerate()
                .filter(|(_, &i)| items[i].transaction_id.is_some())
                .map(|(k, &i)| (self.transaction_ids[i].clone(), self.message_ids[i], first + k as i64))
                .collect();
            record_ids(client, &t, ids)
        } else {
            HashMap::new()
        };
        let stored = self.decide(&t, &fresh, first, &lost);
        for &(k, pos) in &class.repeats {
            let original = self.rows[fresh[pos]].as_ref().expect("the original's row is set");
            let original = (to_pg_uuid(original.message_id), original.msg_offset);
            self.rows[idxs[k]] = Some(self.duplicate(idxs[k], t.partition_id, original));
        }
        // Counted for every queue, with a limit or not: the next partition's target may
        // have been read after a concurrent `set_limits` gave the queue one.
        let n = stored.iter().filter(|&&s| s).count() as i64;
        match self.queued.iter_mut().find(|q| q.0 == t.queue_id) {
            Some(q) => q.1 += n,
            None => self.queued.push((t.queue_id, n)),
        }
        // The segment ends on its last stored message: a gap at the end is no entry.
        let Some(last_k) = stored.iter().rposition(|&s| s) else { return true };
        let data = self.encode(queue, &t, &fresh[..=last_k], &stored);
        let last = first + last_k as i64;
        // A small push goes to the fresh tier uncompressed (`encode`).
        let tier = if goes_fresh(fresh.len()) { &mut self.fresh_tier } else { &mut self.durable_tier };
        tier.push(SegmentRow { pid: t.partition_id, first, last, data });
        if dedup && crate::offsets::enabled() {
            crate::offsets::wrote(t.partition_id, last);
        }
        true
    }

    /// A queue with a maximum depth, or a group with a maximum lag: a push of `n` to `t` is
    /// refused past them (`ops::overflow::check_push`), before anything is reserved.
    fn check_limits(&self, client: &mut SpiClient<'_>, queue: &str, t: &Target, n: i64) {
        if t.max_depth.is_some() || t.lag_limited {
            let earlier = self.queued.iter().find(|q| q.0 == t.queue_id).map_or(0, |q| q.1);
            crate::ops::overflow::check_push(client, queue, t, n, earlier);
        }
    }

    /// The results of the items `fresh`, reserved from offset `first` on: queued, or a
    /// duplicate when a concurrent push recorded its id first (`lost`). Returns which
    /// were stored (a lost one leaves a gap at its offset).
    fn decide(
        &mut self,
        t: &Target,
        fresh: &[usize],
        first: i64,
        lost: &HashMap<String, (pgrx::Uuid, i64)>,
    ) -> Vec<bool> {
        let mut stored = Vec::with_capacity(fresh.len());
        for (k, &i) in fresh.iter().enumerate() {
            // Only a given id can have been recorded first by another push: the text of a
            // message id this push gave is never looked up, even if some producer gave the
            // same text as its own id.
            let given = self.items[i].transaction_id.is_some();
            let row = match lost.get(&self.transaction_ids[i]).filter(|_| given) {
                Some(&original) => self.duplicate(i, t.partition_id, original),
                None => PushRow {
                    idx: i as i32,
                    status: "queued",
                    message_id: self.message_ids[i],
                    transaction_id: self.transaction_ids[i].clone(),
                    partition_id: t.partition_id,
                    msg_offset: first + k as i64,
                },
            };
            stored.push(row.status == "queued");
            self.rows[i] = Some(row);
        }
        stored
    }

    /// The segment of the items `kept` (stored ones as messages, lost ones as gaps), sealed
    /// when the queue is encrypted. A small push's segment is left uncompressed:
    /// compaction compresses it with its neighbours soon, much better than one message
    /// alone.
    fn encode(&self, queue: &str, t: &Target, kept: &[usize], stored: &[bool]) -> Vec<u8> {
        let (items, message_ids) = (self.items, &self.message_ids);
        // An encrypted queue stores envelopes (see `encryption`), sealed per message.
        let sealed: Option<Vec<Vec<u8>>> = t.encrypted.then(|| {
            crate::queue::encryption::seal_all(queue, kept.iter().map(|&i| (&message_ids[i], &items[i].payload[..])))
        });
        // Headers are sealed too, each under its message id and its own purpose.
        let sealed_headers: Option<Vec<Option<Vec<u8>>>> = t.encrypted.then(|| {
            crate::queue::encryption::seal_headers(
                queue,
                kept.iter().map(|&i| (&message_ids[i], items[i].headers.as_deref())),
            )
        });
        let entries = kept.iter().enumerate().map(|(k, &i)| {
            if !stored[k] {
                return Entry::Gap;
            }
            Entry::Message(Frame {
                message_id: *message_ids[i].as_bytes(),
                transaction_id: &self.transaction_ids[i],
                payload: sealed.as_ref().map_or(&items[i].payload[..], |s| &s[k][..]),
                created_at: Some(self.now),
                headers: match &sealed_headers {
                    Some(s) => s[k].as_deref(),
                    None => items[i].headers.as_deref(),
                },
                deliver_at: items[i].deliver_at,
            })
        });
        if goes_fresh(stored.len()) {
            segment::encode_uncompressed(entries)
        } else {
            segment::encode(entries)
        }
    }
}

/// The target of (queue, partition), with the queue lock taken first
/// (`queen_core::lock_order`). A push that waited for a `delete_queue` finds its target
/// again: the queue is created anew (`locate`, if the caller may create it). The caller's
/// privilege is checked again on the queue locked (privileges, module docs).
fn target_locked(client: &mut SpiClient<'_>, queue: &str, partition: &str, privilege: Privilege) -> Target {
    loop {
        let t = lookup::target(queue, partition, || locate(client, queue, partition, privilege));
        if crate::pg::locks::share_queue_to_push(t.queue_id) {
            crate::queue::privileges::require_id(client, t.queue_id, privilege);
            return t;
        }
        crate::pg::cache::on_abort(); // forget the deleted queue's targets
    }
}

/// `push_batch(items)` on a distributed database, when some item's queue lives on another
/// node: the items are split by queue and each part is pushed with `push_batch(queue,
/// items)`, which Citus sends to the queue's home. All in the caller's transaction: parts
/// on two workers commit together (two-phase commit) or not at all. Returns the rows in
/// input order, or None when every queue lives here (or the database is not distributed):
/// the caller then pushes locally.
fn push_at_homes(items: JsonbArg, queues: &[&str]) -> Option<Vec<PushRow>> {
    // As `push_items` does, before any item goes to another node.
    errors::refuse_read_only("push", "stores messages");
    let mut by_queue: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (i, q) in queues.iter().enumerate() {
        by_queue.entry(q).or_default().push(i as i32);
    }
    if !by_queue.keys().any(|q| crate::queue::citus::lives_elsewhere(q)) {
        return None;
    }
    let mut rows: Vec<Option<PushRow>> = (0..queues.len()).map(|_| None).collect();
    crate::pg::spi::with_pinned_search_path(|| {
        Spi::connect_mut(|client| {
            // Outside BEGIN ... COMMIT, Citus opens a remote transaction block for the
            // statements of a function only with `citus.function_opens_transaction_block`
            // (on by default); off, each part would commit on its worker as soon as it ran,
            // and a part that then failed would leave the earlier ones stored. On for the
            // parts (for the rest of the transaction: a local setting), and back after.
            const GUC: &str = "citus.function_opens_transaction_block";
            let was_off = first_value::<bool>(run(
                client,
                "SELECT CASE WHEN pg_catalog.current_setting($1, true) = 'off'
                             THEN pg_catalog.set_config($1, 'on', true) = 'on' ELSE false END",
                &[GUC.into()],
            ))
            .unwrap_or(false);
            for (queue, idxs) in &by_queue {
                // SAFETY: `items` is the call's jsonb argument, valid for the whole call.
                let items_arg = unsafe { DatumWithOid::new(items, pg_sys::JSONBOID) };
                let part: String = first_value(run(
                    client,
                    "SELECT pg_catalog.jsonb_agg($1 OPERATOR(pg_catalog.->) u.i ORDER BY u.k)::text
                       FROM pg_catalog.unnest($2::int4[]) WITH ORDINALITY AS u(i, k)",
                    &[items_arg, idxs.clone().into()],
                ))
                .unwrap_or_else(|| errors::internal("an empty part of a batch"));
                // Literals, not parameters: Citus delegates a call whose queue it sees.
                let sql = format!(
                    "SELECT idx, status, message_id, transaction_id, partition_id, msg_offset
                       FROM queen.push_batch({}, {}::jsonb)",
                    pgrx::spi::quote_literal(queue),
                    pgrx::spi::quote_literal(&part)
                );
                for row in client.update(&sql, None, &[]).or_raise() {
                    let k: i32 = row.get(1).or_raise().unwrap_or_default();
                    let i = idxs[k as usize] as usize;
                    let status: String = row.get(2).or_raise().unwrap_or_default();
                    let status = match status.as_str() {
                        "queued" => "queued",
                        "duplicate" => "duplicate",
                        other => errors::internal(format_args!("push_batch on {queue:?} answered status {other:?}")),
                    };
                    rows[i] = Some(PushRow {
                        idx: i as i32,
                        status,
                        message_id: crate::pg::ids::from_pg_uuid(&row.get::<pgrx::Uuid>(3).or_raise().unwrap()),
                        transaction_id: row.get(4).or_raise().unwrap_or_default(),
                        partition_id: row.get(5).or_raise().unwrap(),
                        msg_offset: row.get(6).or_raise().unwrap_or_default(),
                    });
                }
            }
            if was_off {
                run(client, "SELECT pg_catalog.set_config($1, 'off', true)", &[GUC.into()]);
            }
        })
    });
    Some(rows.into_iter().map(|r| r.expect("every item has a result")).collect())
}
