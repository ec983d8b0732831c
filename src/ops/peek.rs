//! `queen.peek` and `queen.get` (docs/functions.md#peek, #get): messages read without a
//! lease, a cursor move or an attempt count, in `queen.message` rows as pop returns them
//! (the lease columns and `attempt` NULL). Reads go up to each partition's readable end,
//! within a byte budget as pop's do, and open an encrypted queue's envelopes under the
//! same privilege as pop (`consume`).

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::{pg_sys, PgSqlErrorCode};
use queen_core::segment::Frame;

use crate::ops::pop::{put_rows, Budget, Delivered};
use crate::pg::errors::{self, SpiExt};
use crate::pg::spi::{first_value, run};
use crate::pg::srf::{arg, function_info_v1, ResultRows};
use crate::queue::lookup;
use crate::queue::names::{check_lane_name, check_queue_name};

extension_sql!(
    r#"
CREATE FUNCTION queen.peek(
    queue text,
    partition text DEFAULT NULL,
    consumer_group text DEFAULT NULL,
    from_offset bigint DEFAULT NULL,
    max_messages int DEFAULT 100,
    max_bytes bigint DEFAULT 33554432
) RETURNS SETOF queen.message
LANGUAGE c VOLATILE SECURITY DEFINER
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS 'MODULE_PATHNAME', 'peek_wrapper';
COMMENT ON FUNCTION queen.peek(text, text, text, bigint, int, bigint) IS
  'queen: read messages without a lease, a cursor move or an attempt count (from a group''s cursor, an offset, or the oldest kept)';
CREATE FUNCTION queen.get(
    queue text,
    partition text DEFAULT NULL,
    msg_offset bigint DEFAULT NULL,
    transaction_id text DEFAULT NULL
) RETURNS SETOF queen.message
LANGUAGE c VOLATILE SECURITY DEFINER
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS 'MODULE_PATHNAME', 'get_wrapper';
COMMENT ON FUNCTION queen.get(text, text, bigint, text) IS
  'queen: one message by partition and offset, or by its producer transaction id (within the dedup window), without a lease';
"#,
    name = "peek"
);

struct PeekArgs<'a> {
    queue: &'a str,
    partition: Option<&'a str>,
    group: Option<&'a str>,
    from_offset: Option<i64>,
    max_messages: i32,
    max_bytes: i64,
}

function_info_v1!(pg_finfo_peek_wrapper);

/// `queen.peek(...)`: its rows, all at once (`srf`), with its search path pinned as pop's.
///
/// # Safety
/// Called by PostgreSQL only, as the function declared above.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn peek_wrapper(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: this call's fcinfo, of a function returning SETOF queen.message.
    let mut out = unsafe { ResultRows::<12>::begin(fcinfo, "queen.message") };
    // SAFETY: the arguments' SQL types are those of the declaration above.
    let a = unsafe {
        PeekArgs {
            queue: arg::<&str>(fcinfo, 0).unwrap_or_else(|| errors::null_arg("queue")),
            partition: arg::<&str>(fcinfo, 1),
            group: arg::<&str>(fcinfo, 2),
            from_offset: arg::<i64>(fcinfo, 3),
            max_messages: arg::<i32>(fcinfo, 4).unwrap_or_else(|| errors::null_arg("max_messages")),
            max_bytes: arg::<i64>(fcinfo, 5).unwrap_or_else(|| errors::null_arg("max_bytes")),
        }
    };
    let rows = crate::pg::spi::with_pinned_search_path(|| {
        check_queue_name("queue", a.queue);
        crate::queue::citus::ensure_home(a.queue);
        crate::queue::privileges::require(Some(a.queue), crate::queue::privileges::Privilege::Consume);
        if let Some(p) = a.partition {
            check_lane_name("partition", p);
        }
        if let Some(g) = a.group {
            check_lane_name("consumer_group", g);
        }
        if let Err(v) = queen_core::policy::check_peek(a.max_messages, a.from_offset, a.max_bytes) {
            errors::violation(v);
        }
        Spi::connect_mut(|client| peek(client, &a))
    });
    put_rows(&mut out, rows, a.group, true);
    out.finish()
}

/// Where each partition's read starts, and its readable end: `from_offset`, else the
/// group's cursor + 1 (its committed state, as `status` shows it), else the oldest offset
/// retention kept; never below what retention deleted.
/// (`queen._lane` takes no NULL: it is asked only where the lane exists.)
const STARTS: &str = "
SELECT p.partition_id, p.name,
       greatest(coalesce($3::int8, c.committed + 1, p.retained_through + 1), p.retained_through + 1),
       queen._readable(p.partition_id, p.head)
  FROM queen.partitions p
  LEFT JOIN queen.lanes l ON l.partition_id = p.partition_id AND l.consumer_group = $4
 CROSS JOIN LATERAL (SELECT CASE WHEN l.partition_id IS NOT NULL THEN
                       (SELECT v.committed FROM queen._lane(l.partition_id, l.consumer_group, l.committed, l.lease_id,
                                                            l.lease_expires_at, l.batch_end, l.batch_retry_count,
                                                            l.attempt_count) v) END AS committed) c
 WHERE p.queue_id = $1 AND ($2::text IS NULL OR p.name = $2)
 ORDER BY p.name";

fn peek(client: &mut SpiClient<'_>, a: &PeekArgs) -> Vec<Delivered> {
    let Some(queue_id) = lookup::queue_id(client, a.queue) else {
        return Vec::new(); // an unknown queue: zero rows, as pop
    };
    // Checked again on the queue read (privileges, module docs).
    crate::queue::privileges::require_id(client, queue_id, crate::queue::privileges::Privilege::Consume);
    if let Some(g) = a.group {
        let exists = first_value::<bool>(run(
            client,
            "SELECT true FROM queen.groups WHERE queue_id = $1 AND consumer_group = $2",
            &[queue_id.into(), g.into()],
        ));
        if exists.is_none() {
            errors::raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
                format!("queen: queue {:?} has no consumer group {g:?}", a.queue),
            );
        }
    }
    let starts: Vec<(pgrx::Uuid, String, i64, i64)> =
        run(client, STARTS, &[queue_id.into(), a.partition.into(), a.from_offset.into(), a.group.into()])
            .map(|r| {
                (
                    r.get(1).or_raise().unwrap(),
                    r.get(2).or_raise().unwrap(),
                    r.get(3).or_raise().unwrap(),
                    r.get(4).or_raise().unwrap(),
                )
            })
            .collect();
    let budget = Budget::new(a.max_bytes);
    let mut out = Vec::new();
    for (pid, partition, start, readable) in starts {
        if out.len() >= a.max_messages as usize || budget.full() {
            break;
        }
        if start <= readable {
            let room = a.max_messages as usize - out.len();
            read(client, pid, &partition, (start, readable), &budget, room, &mut out);
        }
    }
    out
}

/// Reads up to `room` messages of one partition in `start..=end` into `out`, within
/// `budget`. A message that cannot be opened, and a segment that cannot be decoded, are
/// passed over with a WARNING: a peek files nothing (a pop files them as dead letters).
fn read(
    client: &mut SpiClient<'_>,
    pid: pgrx::Uuid,
    partition: &str,
    (start, end): (i64, i64),
    budget: &Budget,
    room: usize,
    out: &mut Vec<Delivered>,
) {
    let mut taken = 0;
    let mut corrupt = |k: crate::storage::segments::Corrupt| {
        pgrx::warning!("queen: peek passed offsets {}..{} of partition {partition:?}: {}", k.from, k.last, k.error);
    };
    crate::storage::segments::read_or_skip(
        client,
        pid,
        start,
        end,
        &|| budget.room(),
        |offset, message| {
            let Some((f, created_at)) = message else {
                return true; // a gap
            };
            let Some(d) = open(pid, partition, offset, f, created_at) else {
                return true;
            };
            if !budget.take(d.payload.len() + d.headers.as_ref().map_or(0, Vec::len)) {
                return false;
            }
            out.push(d);
            taken += 1;
            taken < room
        },
        Some(&mut corrupt),
    );
}

/// A stored message as a row: its payload and headers opened (an encrypted queue's
/// envelopes), None with a WARNING when they cannot be; a key that is not configured
/// raises, as it stops a pop.
fn open(
    pid: pgrx::Uuid,
    partition: &str,
    offset: i64,
    f: Frame<'_>,
    created_at: TimestampWithTimeZone,
) -> Option<Delivered> {
    match crate::queue::encryption::open_frame(&f) {
        Ok(opened) => Some(Delivered::new(pid, partition.to_string(), offset, &f, created_at, opened)),
        Err(e) if e.stops_pop() => e.raise(),
        Err(e) => {
            pgrx::warning!("queen: peek passed offset {offset} of partition {partition:?}: {}", e.message);
            None
        }
    }
}

function_info_v1!(pg_finfo_get_wrapper);

/// `queen.get(...)`: one message, or none.
///
/// # Safety
/// Called by PostgreSQL only, as the function declared above.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn get_wrapper(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: this call's fcinfo, of a function returning SETOF queen.message.
    let mut out = unsafe { ResultRows::<12>::begin(fcinfo, "queen.message") };
    // SAFETY: the arguments' SQL types are those of the declaration above.
    let (queue, partition, offset, transaction_id) = unsafe {
        (
            arg::<&str>(fcinfo, 0).unwrap_or_else(|| errors::null_arg("queue")),
            arg::<&str>(fcinfo, 1),
            arg::<i64>(fcinfo, 2),
            arg::<&str>(fcinfo, 3),
        )
    };
    let rows = crate::pg::spi::with_pinned_search_path(|| {
        check_queue_name("queue", queue);
        crate::queue::citus::ensure_home(queue);
        crate::queue::privileges::require(Some(queue), crate::queue::privileges::Privilege::Consume);
        if let Some(p) = partition {
            check_lane_name("partition", p);
        }
        match (offset, transaction_id) {
            (Some(_), Some(_)) | (None, None) => {
                errors::invalid("msg_offset", "give exactly one of msg_offset and transaction_id")
            }
            (Some(_), None) if partition.is_none() => errors::invalid("partition", "msg_offset needs its partition"),
            (Some(o), None) if o < 1 => errors::invalid("msg_offset", "must be 1 or more (offsets start at 1)"),
            _ => {}
        }
        Spi::connect_mut(|client| get(client, queue, partition, offset, transaction_id))
    });
    put_rows(&mut out, rows, None, true);
    out.finish()
}

/// The message at (partition, offset), or the one the dedup table records for the
/// producer transaction id (in `partition`, or in any partition of the queue).
fn get(
    client: &mut SpiClient<'_>,
    queue: &str,
    partition: Option<&str>,
    offset: Option<i64>,
    transaction_id: Option<&str>,
) -> Vec<Delivered> {
    let Some(queue_id) = lookup::queue_id(client, queue) else {
        return Vec::new();
    };
    crate::queue::privileges::require_id(client, queue_id, crate::queue::privileges::Privilege::Consume);
    // A producer id is looked up while its dedup entry is live (`dedup_live_sql!`): an
    // expired entry may still be in the table until churn deletes it.
    const FIND: &str = concat!(
        "SELECT p.partition_id, p.name, coalesce($3::int8, d.msg_offset), queen._readable(p.partition_id, p.head),
                p.retained_through
           FROM queen.partitions p
           JOIN queen.queues q ON q.queue_id = p.queue_id
           LEFT JOIN queen.dedup d ON $4::text IS NOT NULL AND d.partition_id = p.partition_id
                                  AND d.transaction_id = $4 AND ",
        queen_core::dedup_live_sql!("d", "q.dedup_window"),
        "
          WHERE p.queue_id = $1 AND ($2::text IS NULL OR p.name = $2)
            AND ($4::text IS NULL OR d.partition_id IS NOT NULL)
          ORDER BY p.name"
    );
    // Every partition that may hold it, by name: a producer id pushed to several partitions
    // is the first of them that can still be read (one whose copy retention deleted, or
    // that is not readable yet, is passed over).
    let found: Vec<(pgrx::Uuid, String, i64, i64, i64)> =
        run(client, FIND, &[queue_id.into(), partition.into(), offset.into(), transaction_id.into()])
            .map(|row| {
                (
                    row.get(1).or_raise().unwrap(),
                    row.get(2).or_raise().unwrap(),
                    row.get(3).or_raise().unwrap(),
                    row.get(4).or_raise().unwrap(),
                    row.get(5).or_raise().unwrap(),
                )
            })
            .collect();
    for (pid, name, at, readable, retained) in found {
        if at > readable || at <= retained {
            continue; // not readable yet, or deleted by retention
        }
        let mut out = Vec::new();
        read(client, pid, &name, (at, at), &Budget::new(i64::MAX), 1, &mut out);
        out.retain(|d| transaction_id.is_none_or(|t| d.transaction_id == t));
        if !out.is_empty() {
            return out;
        }
    }
    Vec::new()
}
