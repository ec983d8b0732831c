//! `queen.dlq_replay` and `queen.dlq_delete` (docs/functions.md#dlq_replay): replay and
//! delete one dead letter by its address (partition_id, transaction_id) and, optionally,
//! its id. Filing dead letters is `dlq`'s; listing is `queen.dlq` (sql/api.sql).

use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::{JsonB, PgSqlErrorCode};
use serde_json::json;

use crate::ops::push::{push_items_as, PushItem};
use crate::pg::errors::{self, SpiExt};
use crate::pg::ids::from_pg_uuid;
use crate::pg::spi::run;

/// The dead-letter row at an address, locked; P0002 when there is none. With `id`, that
/// row (it must be at the address); without, the oldest there when the call looks. Two
/// consumer groups can dead-letter the same message, and spans can share an address: each
/// call takes one row. The row is chosen first, then its queue's privilege is checked and
/// its queue lock taken (`queen_core::lock_order`), then that row and no other is locked: a
/// row that another call removed (or moved, a `skipped` span extended) meanwhile gives
/// P0002, never the next row at the address, which the caller did not choose. Returns (row
/// id, queue, partition); the payload is read apart (`payload`), so that deleting a row
/// never needs to open it.
fn lock_row(
    client: &mut SpiClient<'_>,
    partition_id: pgrx::Uuid,
    transaction_id: &str,
    id: Option<pgrx::Uuid>,
) -> (pgrx::Uuid, String, String) {
    let chosen = run(
        client,
        "SELECT d.id, d.queue_id FROM queen.log_dlq d
          WHERE d.partition_id = $1 AND d.transaction_id = $2 AND ($3::uuid IS NULL OR d.id = $3)
          ORDER BY d.failed_at, d.id
          LIMIT 1",
        &[partition_id.into(), transaction_id.into(), id.into()],
    )
    .next()
    .map(|r| (r.get::<pgrx::Uuid>(1).or_raise().unwrap(), r.get::<i64>(2).or_raise().unwrap()));
    let not_found = |client: &mut SpiClient<'_>| -> ! {
        // Whether a dead letter is there is the business of who may administer the
        // partition's queue: others get 42501 whatever the address holds.
        let queue = crate::pg::spi::first_value::<i64>(run(
            client,
            "SELECT queue_id FROM queen.partitions WHERE partition_id = $1",
            &[partition_id.into()],
        ));
        if let Some(q) = queue {
            crate::queue::privileges::require_id(client, q, crate::queue::privileges::Privilege::Admin);
        }
        let which = id.map(|id| format!(" with id {}", from_pg_uuid(&id))).unwrap_or_default();
        errors::raise(
            PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
            format!(
                "queen: no dead-letter row{which} for partition_id {} and transaction_id {:?}",
                from_pg_uuid(&partition_id),
                errors::excerpt(transaction_id)
            ),
        );
    };
    let Some((row_id, queue_id)) = chosen else { not_found(client) };
    crate::queue::privileges::require_id(client, queue_id, crate::queue::privileges::Privilege::Admin);
    if !crate::pg::locks::share_queue(queue_id) {
        not_found(client);
    }
    let row = run(
        client,
        "SELECT d.id, q.name, p.name
           FROM queen.log_dlq d
           JOIN queen.queues q ON q.queue_id = d.queue_id
           JOIN queen.partitions p ON p.partition_id = d.partition_id
          WHERE d.id = $1 AND d.queue_id = $2 AND d.partition_id = $3 AND d.transaction_id = $4
            FOR UPDATE OF d",
        &[row_id.into(), queue_id.into(), partition_id.into(), transaction_id.into()],
    )
    .next();
    let Some(row) = row else { not_found(client) };
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
    // A replay reaches every group: a redrive header the message carried is taken off.
    let key = queen_core::policy::REDRIVE_HEADER;
    let headers = match headers {
        Some(h) if crate::pg::jsonb::string_at(&h, key).is_some() => {
            let stripped =
                run(client, "SELECT $1::jsonb - $2::text", &[crate::pg::jsonb::RawJsonb(h).into(), key.into()]);
            stripped.first().get::<crate::pg::jsonb::RawJsonb>(1).or_raise().map(|h| h.0)
        }
        other => other,
    };
    (payload, headers)
}

/// The address arguments of `dlq_replay` and `dlq_delete`, checked; on Citus the call must
/// have been routed to the partition's home (`citus::ensure_id_home`).
fn args(partition_id: Option<pgrx::Uuid>, transaction_id: Option<&str>) -> (pgrx::Uuid, &str) {
    let partition_id = partition_id.unwrap_or_else(|| errors::null_arg("partition_id"));
    let transaction_id = transaction_id.unwrap_or_else(|| errors::null_arg("transaction_id"));
    crate::queue::citus::ensure_id_home("partition", &partition_id);
    (partition_id, transaction_id)
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.dlq_replay(uuid, text, uuid) IS
  'queen: re-push a dead letter with a fresh transaction id';
"#,
    name = "dlq_replay_home",
    requires = [dlq_replay_row]
);

/// Re-pushes the stored payload and headers to its queue and partition with a fresh transaction id,
/// then removes the row — one transaction, so a failed push leaves the row in place. `id`
/// picks one row of the address (`queen.dlq` lists it); without it, the oldest. (Named
/// apart from the SQL function: `dlq_replay_wrapper` is 0.3.0's two-argument symbol,
/// a stub below.)
#[pg_extern(name = "dlq_replay", security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn dlq_replay_row(
    partition_id: Option<pgrx::Uuid>,
    transaction_id: Option<&str>,
    id: default!(Option<pgrx::Uuid>, "NULL"),
) -> JsonB {
    errors::refuse_read_only("dlq_replay", "stores a message");
    let (partition_id, transaction_id) = args(partition_id, transaction_id);
    let (id, queue, partition, (payload, headers)) = Spi::connect_mut(|client| {
        let (id, queue, partition) = lock_row(client, partition_id, transaction_id, id);
        refuse_span(client, id);
        (id, queue, partition, payload(client, id))
    });
    // A replayed message is due at once (after the queue's delay), whatever its first
    // push asked for.
    let pushed = push_items_as(
        vec![PushItem { queue, partition, payload, transaction_id: None, headers, deliver_at: None }],
        crate::queue::privileges::Privilege::Admin,
    );
    let row = &pushed[0];
    let removed = Spi::connect_mut(|client| {
        !run(client, "DELETE FROM queen.log_dlq WHERE id = $1 RETURNING 1", &[id.into()]).is_empty()
    });
    JsonB(json!({
        "replayed": true,
        "id": from_pg_uuid(&id).to_string(),
        "dlqRowRemoved": removed,
        "transactionId": row.transaction_id,
        "messageId": row.message_id.to_string(),
        "offset": row.msg_offset,
    }))
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.dlq_delete(uuid, text, uuid) IS
  'queen: remove a dead letter';
"#,
    name = "dlq_delete_home",
    requires = [dlq_delete_row]
);

/// Removes one dead-letter row at the address (`id`'s, else the oldest) and nothing else.
#[pg_extern(name = "dlq_delete", security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn dlq_delete_row(
    partition_id: Option<pgrx::Uuid>,
    transaction_id: Option<&str>,
    id: default!(Option<pgrx::Uuid>, "NULL"),
) -> JsonB {
    errors::refuse_read_only("dlq_delete", "removes a dead letter");
    let (partition_id, transaction_id) = args(partition_id, transaction_id);
    let id = Spi::connect_mut(|client| {
        let (id, ..) = lock_row(client, partition_id, transaction_id, id);
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

crate::pg::srf::older_sql_symbol!(
    pg_finfo_dlq_replay_wrapper,
    dlq_replay_wrapper,
    "The C symbol of `queen.dlq_replay` up to 0.3.0, whose SQL declared 2 arguments."
);
crate::pg::srf::older_sql_symbol!(
    pg_finfo_dlq_delete_wrapper,
    dlq_delete_wrapper,
    "The C symbol of `queen.dlq_delete` up to 0.3.0, whose SQL declared 2 arguments."
);

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.dlq_redrive IS
  'queen: push dead letters again, in partition order, to the group that dead-lettered each (deliver_to => ''failing_group'') or to every group (''all''); each once unless force';
"#,
    name = "dlq_redrive_home",
    requires = [dlq_redrive]
);

/// Rows one round of `dlq_redrive` locks, and the payload and header bytes it holds at
/// most (a round stops early past them, or after one message when that one is larger):
/// what a call holds is one round's messages.
const REDRIVE_ROUND: i64 = 500;
const REDRIVE_ROUND_BYTES: usize = 32 << 20;

/// `queen.dlq_redrive` (docs/functions.md#dlq_redrive): pushes the matching dead letters
/// of `queue` again, oldest offset first per partition, into their partitions. With
/// `deliver_to => 'failing_group'` each copy carries the `queen.redrive` header naming the
/// group that dead-lettered it, and every other group's pops pass over it
/// (`queen_core::policy::redrive_passes`); with `'all'` the header is taken off. A row is
/// redriven once (`redriven_at`) unless `force`; span rows (purge), rows that cannot be
/// opened, and, for `'failing_group'`, rows whose group is gone are left alone (the latter
/// two counted: `unopenable`, `groupGone`). Returns the count and the last row
/// redriven: a call that stopped at `max_messages` is resumed by calling again.
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
    errors::refuse_read_only("dlq_redrive", "stores messages");
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
    let filter = RedriveFilter { queue, group: consumer_group, partition, error_like, since, until, force, to };
    // The queue lock before any dead-letter row (`queen_core::lock_order`); None: no such
    // queue, or deleted while this waited.
    let queue_id = Spi::connect_mut(|client| {
        crate::queue::privileges::lock_queue(client, queue, crate::queue::privileges::Privilege::Admin)
    });
    // A copy for its failing group alone needs that group until this commits: the groups'
    // rows are locked as a lane insert locks them (FOR KEY SHARE), before any dead letter.
    // A drop_group in flight commits first (its dead letters then count as groupGone, and
    // stay unmarked), or waits for this redrive. Without it, a copy went to a group being
    // dropped, which no group then read, and its dead letter was marked redriven.
    if let (Some(id), true) = (queue_id, to.needs_its_group()) {
        Spi::connect_mut(|client| {
            run(
                client,
                "SELECT 1 FROM queen.groups WHERE queue_id = $1 AND ($2::text IS NULL OR consumer_group = $2)
                  ORDER BY consumer_group FOR KEY SHARE",
                &[id.into(), consumer_group.into()],
            );
        });
    }
    let (mut redriven, mut last) = (0i64, serde_json::Value::Null);
    while queue_id.is_some() && redriven < i64::from(limit) {
        let want = REDRIVE_ROUND.min(i64::from(limit) - redriven);
        let Some((items, ids, at)) = Spi::connect_mut(|client| redrive_round(client, &filter, want)) else { break };
        let n = items.len() as i64;
        push_items_as(items, crate::queue::privileges::Privilege::Admin);
        Spi::connect_mut(|client| {
            run(client, "UPDATE queen.log_dlq SET redriven_at = clock_timestamp() WHERE id = ANY($1)", &[ids.into()]);
        });
        redriven += n;
        last = at;
    }
    let (more, unopenable, group_gone) = match queue_id {
        Some(_) => Spi::connect_mut(|client| {
            (!matching(client, &filter, 1, false).is_empty(), unopenable(client, &filter), group_gone(client, &filter))
        }),
        None => (false, 0, 0),
    };
    JsonB(json!({
        "queue": queue, "deliverTo": to_arg, "redriven": redriven, "last": last, "more": more, "unopenable": unopenable,
        "groupGone": group_gone,
    }))
}

/// What `dlq_redrive` selects, and where it sends it.
struct RedriveFilter<'a> {
    queue: &'a str,
    group: Option<&'a str>,
    partition: Option<&'a str>,
    error_like: Option<&'a str>,
    since: Option<pgrx::datum::TimestampWithTimeZone>,
    until: Option<pgrx::datum::TimestampWithTimeZone>,
    force: bool,
    to: queen_core::policy::RedriveTo,
}

impl RedriveFilter<'_> {
    /// `matching_sql`'s `$10` for the rows to redrive: `Some(true)` (only rows whose group
    /// exists) when each copy is for its group alone (`RedriveTo::needs_its_group`), else
    /// `None` (any).
    fn group_exists_filter(&self) -> Option<bool> {
        self.to.needs_its_group().then_some(true)
    }

    /// `matching_sql`'s parameters: at most `limit` rows, openable ones or not (`$9`), and
    /// `$10` `group_exists`.
    fn args(&self, limit: i64, openable: bool, group_exists: Option<bool>) -> [DatumWithOid<'_>; 10] {
        [
            self.queue.into(),
            self.group.into(),
            self.partition.into(),
            self.error_like.into(),
            self.since.into(),
            self.until.into(),
            limit.into(),
            self.force.into(),
            openable.into(),
            group_exists.into(),
        ]
    }
}

/// The dead letters `f` selects, at most `$7`, in partition then offset order: rows that
/// hold a message (not a purge's span), not redriven yet (or, with `force`, not by this
/// call), and whose payload and headers can be opened, or (`$9` false) those that cannot;
/// with `$10` true, only rows whose group still exists, with `$10` false only those whose
/// group is gone (`drop_group`), with `$10` NULL both. Returns (id, partition, offset,
/// group).
macro_rules! matching_sql {
    () => {
        "SELECT d.id, p.name, d.msg_offset, d.consumer_group
           FROM queen.log_dlq d
           JOIN queen.queues q ON q.queue_id = d.queue_id
           JOIN queen.partitions p ON p.partition_id = d.partition_id
          WHERE q.name = $1 AND d.last_offset IS NULL
            AND (d.redriven_at IS NULL OR ($8 AND d.redriven_at < statement_timestamp()))
            AND ($2::text IS NULL OR d.consumer_group = $2) AND ($3::text IS NULL OR p.name = $3)
            AND ($4::text IS NULL OR d.error_message LIKE $4)
            AND ($5::timestamptz IS NULL OR d.failed_at >= $5) AND ($6::timestamptz IS NULL OR d.failed_at < $6)
            AND (d.reason <> 'unreadable'
                 AND (d.data IS NOT NULL OR queen._dead_letter_unopenable(d.envelope, d.message_id) IS NULL)
                 AND (d.headers IS NULL OR queen._dead_letter_headers(d.headers, d.message_id) IS NOT NULL)) = $9
            AND ($10::bool IS NULL
                 OR EXISTS (SELECT 1 FROM queen.groups g
                             WHERE g.queue_id = d.queue_id AND g.consumer_group = d.consumer_group) = $10)
          ORDER BY p.name, d.msg_offset, d.consumer_group, d.id
          LIMIT $7"
    };
}

/// The matching rows; with `lock`, locked (after the queue lock: `queen_core::lock_order`).
fn matching(
    client: &mut SpiClient<'_>,
    f: &RedriveFilter<'_>,
    want: i64,
    lock: bool,
) -> Vec<(pgrx::Uuid, String, i64, String)> {
    const PEEK: &str = matching_sql!();
    const LOCK: &str = concat!(matching_sql!(), " FOR UPDATE OF d");
    run(client, if lock { LOCK } else { PEEK }, &f.args(want, true, f.group_exists_filter()))
        .map(|r| {
            (
                r.get(1).or_raise().unwrap(),
                r.get(2).or_raise().unwrap(),
                r.get(3).or_raise().unwrap(),
                r.get(4).or_raise().unwrap(),
            )
        })
        .collect()
}

/// How many matching dead letters cannot be opened (a corrupt segment's bytes, an envelope
/// that does not authenticate, or one whose key is not configured): left in place.
fn unopenable(client: &mut SpiClient<'_>, f: &RedriveFilter<'_>) -> i64 {
    count_matching(client, f, false, None)
}

/// With `deliver_to => 'failing_group'`: how many matching dead letters that could be
/// opened belong to a group that is gone (`drop_group`): no group would get their copies,
/// so they are left in place (`deliver_to => 'all'` redrives them).
fn group_gone(client: &mut SpiClient<'_>, f: &RedriveFilter<'_>) -> i64 {
    if f.group_exists_filter().is_none() {
        return 0;
    }
    count_matching(client, f, true, Some(false))
}

/// The number of rows `matching_sql` selects with `$9` `openable` and `$10` `group_exists`.
fn count_matching(
    client: &mut SpiClient<'_>,
    f: &RedriveFilter<'_>,
    openable: bool,
    group_exists: Option<bool>,
) -> i64 {
    const COUNT: &str = concat!("SELECT count(*) FROM (", matching_sql!(), ") x");
    crate::pg::spi::first_value::<i64>(run(client, COUNT, &f.args(i64::MAX, openable, group_exists))).unwrap_or(0)
}

/// The next round of dead letters to redrive, locked: at most `want` rows, and no more
/// payload and header bytes than `REDRIVE_ROUND_BYTES` (one message at least). Returns
/// their push items (payload and headers opened; the redrive header set for
/// `FailingGroup`, taken off for `All`), their row ids, and where the round ended; None
/// when no row is left.
fn redrive_round(
    client: &mut SpiClient<'_>,
    f: &RedriveFilter<'_>,
    want: i64,
) -> Option<(Vec<PushItem>, Vec<pgrx::Uuid>, serde_json::Value)> {
    let failing = f.to == queen_core::policy::RedriveTo::FailingGroup;
    let (mut items, mut ids, mut last, mut bytes) = (Vec::new(), Vec::new(), serde_json::Value::Null, 0usize);
    for (id, partition, offset, group) in matching(client, f, want, true) {
        if bytes >= REDRIVE_ROUND_BYTES {
            break; // the rest of the locked rows wait for the next round
        }
        let (payload, headers) = letter(client, id, failing.then_some(group.as_str()));
        bytes += payload.len() + headers.as_ref().map_or(0, Vec::len);
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

/// A dead letter's payload and headers, opened, with the redrive header set to `target`
/// (None: taken off, so that every group gets the copy).
fn letter(client: &mut SpiClient<'_>, id: pgrx::Uuid, target: Option<&str>) -> (Vec<u8>, Option<Vec<u8>>) {
    let row = run(
        client,
        "SELECT coalesce(d.data, queen._open_dead_letter(d.envelope, d.message_id)),
                CASE WHEN $2::text IS NOT NULL
                     THEN coalesce(queen._dead_letter_headers(d.headers, d.message_id), '{}'::jsonb)
                          || jsonb_build_object($3::text, $2::text)
                     ELSE queen._dead_letter_headers(d.headers, d.message_id) - $3::text END
           FROM queen.log_dlq d WHERE d.id = $1",
        &[id.into(), target.into(), queen_core::policy::REDRIVE_HEADER.into()],
    );
    let row = row.first();
    let payload = row
        .get::<crate::pg::jsonb::RawJsonb>(1)
        .or_raise()
        .unwrap_or_else(|| errors::internal("a dead letter without its payload"))
        .0;
    (payload, row.get::<crate::pg::jsonb::RawJsonb>(2).or_raise().map(|h| h.0))
}
