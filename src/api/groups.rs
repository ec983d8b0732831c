//! Moving and removing consumer groups: `queen.seek`, `queen.purge` and `queen.drop_group`.
//! Each takes the queue lock in share mode, then the group's lanes in partition order
//! (`queen_core::lock_order`), waiting for a pop or ack in flight on a lane, and refuses a
//! lane under a live lease unless `force` (SQLSTATE 55006); with `force` the lease ends.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::{JsonB, PgSqlErrorCode};

use queen_core::lanes::seek_cursor;
use serde_json::json;

use crate::ops::cursors::{lock_lanes, move_cursor, Busy, Lane, Which};
use crate::pg::clock::timestamptz;
use crate::pg::errors::{self, SpiExt};
use crate::pg::ids::from_pg_uuid;
use crate::pg::spi::{first_value, run};
use crate::queue::names::{check_lane_name, check_queue_name};

/// The queue's id, its lock taken (share mode) and the caller's admin privilege checked on
/// it; then, without the registry after a crash, the lane journal saved (`lane::settle_journal`), before any other lock.
fn queue_id(client: &mut SpiClient<'_>, queue: &str) -> Option<i64> {
    let id = crate::queue::privileges::lock_queue(client, queue, crate::queue::privileges::Privilege::Admin)?;
    crate::lane::settle_journal(client, true);
    Some(id)
}

fn refuse_leased(lanes: &[Lane], force: bool, what: &str) {
    if force {
        return;
    }
    if let Some(l) = lanes.iter().find(|l| l.leased) {
        errors::raise(
            PgSqlErrorCode::ERRCODE_OBJECT_IN_USE,
            format!(
                "queen: cannot {what}: partition {:?} is under a live lease (ack it, let it expire, or pass force => true)",
                l.partition
            ),
        );
    }
}

fn group_exists(client: &mut SpiClient<'_>, queue_id: i64, group: &str) -> bool {
    first_value::<bool>(run(
        client,
        "SELECT true FROM queen.groups WHERE queue_id = $1 AND consumer_group = $2 FOR UPDATE",
        &[queue_id.into(), group.into()],
    ))
    .is_some()
}

fn no_group(queue: &str, group: &str) -> ! {
    errors::raise(
        PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
        format!("queen: queue {queue:?} has no consumer group {group:?}"),
    )
}

/// The first offset of a partition whose message is at least `at` old (microseconds),
/// or None when every message is older. A segment's `created_at` is its newest message's
/// time, so the first segment at or after `at` holds the answer.
/// (Under READ COMMITTED only: `seek` refuses the other levels.)
fn first_offset_at(client: &mut SpiClient<'_>, partition_id: pgrx::Uuid, at: i64) -> Option<i64> {
    let seg = run(
        client,
        "SELECT first_offset, last_offset FROM (
           SELECT first_offset, last_offset FROM queen.segments WHERE partition_id = $1 AND created_at >= $2
           UNION ALL
           SELECT first_offset, last_offset FROM queen.fresh_segments WHERE partition_id = $1 AND created_at >= $2
         ) s ORDER BY first_offset LIMIT 1",
        &[partition_id.into(), timestamptz(at).into()],
    );
    let row = seg.into_iter().next()?;
    let (first, last): (i64, i64) = (row.get(1).or_raise().unwrap(), row.get(2).or_raise().unwrap());
    let mut found = None;
    crate::storage::segments::read(client, partition_id, first, last, |offset, message| {
        if let Some((_, created_at)) = message {
            if pgrx::pg_sys::TimestampTz::from(created_at) >= at {
                found = Some(offset);
                return false;
            }
        }
        true
    });
    found.or(Some(last + 1))
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.seek(text, text, text, bigint, timestamptz, bool) IS
  'queen: move a consumer group''s cursors to an offset or to the first message at or after a time';
"#,
    name = "seek_home",
    requires = [seek]
);

/// `queen.seek`: moves a consumer group's cursors so that its next pop delivers
/// `to_offset` (or, with `to_time`, the first message pushed at or after that time) in
/// each of its partitions, or in `partition` alone. Offsets are clamped to what exists:
/// not below what retention deleted, not past the readable end; a time after every
/// message moves the cursor to the end. Retry counts restart; a lane under a live lease
/// is refused (55006) unless `force`, which ends the lease. Returns each lane's move.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn seek(
    queue: Option<&str>,
    consumer_group: Option<&str>,
    partition: default!(Option<&str>, "NULL"),
    to_offset: default!(Option<i64>, "NULL"),
    to_time: default!(Option<TimestampWithTimeZone>, "NULL"),
    force: default!(Option<bool>, false),
) -> JsonB {
    let queue = queue.unwrap_or_else(|| errors::null_arg("queue"));
    let group = consumer_group.unwrap_or_else(|| errors::null_arg("consumer_group"));
    let force = force.unwrap_or_else(|| errors::null_arg("force"));
    check_queue_name("queue", queue);
    crate::queue::citus::ensure_home(queue);
    check_lane_name("consumer_group", group);
    crate::queue::privileges::require(Some(queue), crate::queue::privileges::Privilege::Admin);
    if let Some(p) = partition {
        check_lane_name("partition", p);
    }
    let at: Option<i64> = to_time.map(pgrx::pg_sys::TimestampTz::from);
    if to_offset.is_some() == at.is_some() {
        errors::invalid("to_offset", "give exactly one of to_offset and to_time");
    }
    if at.is_some_and(|t| t == i64::MIN || t == i64::MAX) {
        errors::invalid("to_time", "must be a finite time");
    }
    // The readable end comes from the offset registry, which is current, and `to_time`'s
    // search reads the segments: with an older snapshot it misses messages pushed since,
    // and the cursor would go past them.
    errors::read_committed_only(
        "seek",
        "the transaction's snapshot misses messages committed since it was taken, and the cursor could pass over them",
    );
    let moved = Spi::connect_mut(|client| {
        let Some(queue_id) = queue_id(client, queue) else { no_group(queue, group) };
        // The lane-creation lock, as lane creation takes it: a retention step skips the
        // queue until this commits, so the segments a rewind points at stay.
        crate::pg::locks::lanes_creation(queue_id, false, true);
        if !group_exists(client, queue_id, group) {
            no_group(queue, group);
        }
        let lanes = lock_lanes(client, queue_id, group, partition.map_or(Which::All, Which::Named), Busy::Wait);
        if let (Some(p), true) = (partition, lanes.is_empty()) {
            errors::raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
                format!("queen: queue {queue:?} has no partition {p:?} for group {group:?}"),
            );
        }
        refuse_leased(&lanes, force, "seek");
        seek_lanes(client, &lanes, group, to_offset, at)
    });
    crate::pg::wake::notify_on_commit(queue);
    JsonB(json!({"queue": queue, "consumerGroup": group, "lanes": moved}))
}

/// Moves each locked lane's cursor so that its next pop delivers `to_offset`, or the first
/// message at or after `at` (clamped by `seek_cursor`); journals the registry's changes.
/// Returns each lane's move.
fn seek_lanes(
    client: &mut SpiClient<'_>,
    lanes: &[Lane],
    group: &str,
    to_offset: Option<i64>,
    at: Option<i64>,
) -> Vec<serde_json::Value> {
    let mut journal = Vec::new();
    let mut out = Vec::new();
    for l in lanes {
        let readable = crate::offsets::readable(l.partition_id);
        let next = match (to_offset, at) {
            (Some(o), _) => o,
            (None, Some(t)) => first_offset_at(client, l.partition_id, t).unwrap_or(readable + 1),
            _ => unreachable!("checked by seek"),
        };
        let to = seek_cursor(next, l.retained_through, readable);
        move_cursor(client, l, group, to, &mut journal);
        out.push(json!({
            "partition": l.partition,
            "partitionId": from_pg_uuid(&l.partition_id).to_string(),
            "committedBefore": l.committed,
            "committed": to,
            "leaseEnded": l.leased,
        }));
    }
    crate::lane::registry::journal(client, group, &journal);
    out
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.purge(text, text, bool) IS
  'queen: move every cursor of a queue (or of one group) to the readable end, recording each span passed as a purged dead-letter row';
"#,
    name = "purge_home",
    requires = [purge]
);

/// `queen.purge`: moves the cursors of every group of `queue`, or of `consumer_group`
/// alone, to each partition's readable end. Each lane's span of messages passed is filed
/// as one dead-letter row (`purged`, no payload), in the same transaction, so nothing
/// leaves a group's path unseen. A lane under a live lease is refused (55006) unless
/// `force`, which ends the lease. Returns each lane's move.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn purge(
    queue: Option<&str>,
    consumer_group: default!(Option<&str>, "NULL"),
    force: default!(Option<bool>, false),
) -> JsonB {
    let queue = queue.unwrap_or_else(|| errors::null_arg("queue"));
    let force = force.unwrap_or_else(|| errors::null_arg("force"));
    check_queue_name("queue", queue);
    crate::queue::citus::ensure_home(queue);
    if let Some(g) = consumer_group {
        check_lane_name("consumer_group", g);
    }
    crate::queue::privileges::require(Some(queue), crate::queue::privileges::Privilege::Admin);
    let moved = Spi::connect_mut(|client| {
        let Some(queue_id) = queue_id(client, queue) else {
            return match consumer_group {
                Some(g) => no_group(queue, g),
                None => Vec::new(), // an unknown queue holds nothing to purge
            };
        };
        // The lane-creation lock, as seek takes it; then each group row and its lanes, the
        // groups in name order.
        crate::pg::locks::lanes_creation(queue_id, false, true);
        let groups: Vec<String> = match consumer_group {
            Some(g) if group_exists(client, queue_id, g) => vec![g.to_string()],
            Some(g) => no_group(queue, g),
            None => run(
                client,
                "SELECT consumer_group FROM queen.groups WHERE queue_id = $1 ORDER BY consumer_group FOR UPDATE",
                &[queue_id.into()],
            )
            .map(|r| r.get::<String>(1).or_raise().unwrap())
            .collect(),
        };
        let mut out = Vec::new();
        for g in &groups {
            let lanes = lock_lanes(client, queue_id, g, Which::All, Busy::Wait);
            refuse_leased(&lanes, force, "purge");
            out.extend(purge_lanes(client, queue_id, &lanes, g));
        }
        out
    });
    let purged: i64 = moved.iter().map(|m| m["purged"].as_i64().unwrap_or(0)).sum();
    JsonB(json!({"queue": queue, "consumerGroup": consumer_group, "purged": purged, "lanes": moved}))
}

/// Moves each locked lane of `group` to its partition's readable end, filing the span it
/// passes as one `purged` dead-letter row. Returns each lane's move.
fn purge_lanes(client: &mut SpiClient<'_>, queue_id: i64, lanes: &[Lane], group: &str) -> Vec<serde_json::Value> {
    let mut journal = Vec::new();
    let mut out = Vec::new();
    for l in lanes {
        let readable = crate::offsets::readable(l.partition_id);
        let from = l.committed.max(l.retained_through) + 1;
        if readable < from {
            continue; // nothing past the cursor
        }
        let error = format!("purged by queen.purge: offsets {from}..{readable} not delivered to group {group:?}");
        crate::ops::dlq::file_span(
            client,
            queue_id,
            l.partition_id,
            group,
            (from, readable),
            queen_core::addresses::SpanKind::Purged,
            &error,
        );
        move_cursor(client, l, group, readable, &mut journal);
        out.push(json!({
            "consumerGroup": group,
            "partition": l.partition,
            "partitionId": from_pg_uuid(&l.partition_id).to_string(),
            "committedBefore": l.committed,
            "committed": readable,
            "purged": readable - from + 1,
            "leaseEnded": l.leased,
        }));
    }
    crate::lane::registry::journal(client, group, &journal);
    out
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.drop_group(text, text, bool) IS
  'queen: remove a consumer group (its cursors and leases) so that it no longer holds retention back';
"#,
    name = "drop_group_home",
    requires = [drop_group]
);

/// `queen.drop_group`: removes a consumer group: its lanes (cursors), its leases, and the
/// group itself, so that it no longer holds retention back. Its dead letters stay (they
/// are listed and replayed by queue). A lane under a live lease is refused (55006) unless
/// `force`. Returns what was removed; a group that does not exist is `dropped: false`.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn drop_group(queue: Option<&str>, consumer_group: Option<&str>, force: default!(Option<bool>, false)) -> JsonB {
    let queue = queue.unwrap_or_else(|| errors::null_arg("queue"));
    let group = consumer_group.unwrap_or_else(|| errors::null_arg("consumer_group"));
    let force = force.unwrap_or_else(|| errors::null_arg("force"));
    check_queue_name("queue", queue);
    crate::queue::citus::ensure_home(queue);
    check_lane_name("consumer_group", group);
    crate::queue::privileges::require(Some(queue), crate::queue::privileges::Privilege::Admin);
    // It waits for the transactions that hold the group's lanes, then deletes their rows
    // and journal entries: those must include what they committed meanwhile.
    errors::read_committed_only(
        "drop_group",
        "the transaction's snapshot misses what the acks it waits for commit, and a group created again under the same name would inherit it",
    );
    // Pops cache whether a group exists (`pop::group_info`): they look again once this
    // commits.
    crate::pg::cache::invalidate();
    let lanes = Spi::connect_mut(|client| {
        let queue_id = queue_id(client, queue)?;
        if !group_exists(client, queue_id, group) {
            return None;
        }
        let lanes = lock_lanes(client, queue_id, group, Which::All, Busy::Wait);
        refuse_leased(&lanes, force, "drop the group");
        let pids: Vec<pgrx::Uuid> = lanes.iter().map(|l| l.partition_id).collect();
        // The journal first (its entries would otherwise revive these cursors if the group
        // were created again): holding its tables keeps the worker from rotating them
        // under the lane rows deleted next.
        run(
            client,
            "WITH j0 AS (DELETE FROM queen.lane_journal_0 WHERE partition_id = ANY($2) AND consumer_group = $1)
             DELETE FROM queen.lane_journal_1 WHERE partition_id = ANY($2) AND consumer_group = $1",
            &[group.into(), pids.clone().into()],
        );
        crate::lane::rows::drop_group(client, queue_id, group);
        // The registry forgets the lanes once this commits (until then they stay locked).
        crate::lane::registry::drop_group_on_commit(queue_id, group, &pids);
        Some(lanes.len())
    });
    JsonB(match lanes {
        Some(n) => json!({"queue": queue, "consumerGroup": group, "dropped": true, "lanes": n}),
        None => json!({"queue": queue, "consumerGroup": group, "dropped": false}),
    })
}
