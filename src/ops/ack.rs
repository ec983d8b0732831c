//! Ack (docs/functions.md#ack): an ack is an offset commit, fenced by its lease. The arithmetic is
//! `queen_core::ack::plan_lane`; this module locks lanes, applies plans, files dead
//! letters and reports.

use std::collections::BTreeMap;

use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use queen_core::ack::{plan_lane, AckItem, AckStatus, Disposal, ItemOutcome, LaneState, RetryPolicy};
use queen_core::policy::dead_lettering;

use crate::lane::rows::{AckPlan, AckPlans};
use crate::pg::clock::{clock_now, timestamptz};
use crate::pg::errors::{self, excerpt, SpiExt};
use crate::pg::ids::to_pg_uuid;
use crate::pg::jsonb::{Found, JsonbArg};
use crate::pg::report::{Json, JsonOut};
use crate::pg::spi::run;
use crate::storage::segments;

/// The queue's retry backoff (`retry_backoff`, `retry_backoff_max`) in microseconds, as
/// two columns of a statement over `queen.queues` aliased `$q`.
macro_rules! retry_backoff_micros_sql {
    ($q:literal) => {
        concat!(
            "(extract(epoch FROM ",
            $q,
            ".retry_backoff) * 1000000)::int8, (extract(epoch FROM ",
            $q,
            ".retry_backoff_max) * 1000000)::int8"
        )
    };
}

/// An ack item addressed to a partition, in input order.
struct Addressed {
    partition_id: pgrx::Uuid,
    item: AckItem,
}

/// A lane of the lease, locked for this ack.
struct LockedLane {
    partition_id: pgrx::Uuid,
    consumer_group: String,
    queue_id: i64,
    state: LaneState,
    live: bool,
    policy: RetryPolicy,
    queue: String,
    /// With the lane registry: the lane's whole state, locked by this transaction.
    registry: Option<queen_core::lanes::State>,
}

/// A `retry_after` (microseconds) with the status it comes with: only `failed` and
/// `retry` redeliver, and the pause has its limits (`policy::check_retry_after`).
fn check_retry_after(argument: &str, status: AckStatus, micros: i64) -> i64 {
    if !matches!(status, AckStatus::Failed | AckStatus::Retry) {
        errors::invalid(argument, format_args!("applies to status failed or retry, not {status}"));
    }
    if let Err(v) = queen_core::policy::check_retry_after(micros) {
        errors::invalid(argument, v.detail);
    }
    micros
}

fn parse_status(s: &str) -> AckStatus {
    s.parse()
        .unwrap_or_else(|_| errors::invalid("status", format_args!("{s:?} (must be completed, failed, retry or dlq)")))
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.ack(uuid, uuid, bigint, text, text, interval) IS
  'queen: ack one offset under a lease (completed, failed, retry, dlq; retry_after delays a redelivery)';
"#,
    name = "ack_one_home",
    requires = [ack_one]
);

#[pg_extern(name = "ack", security_definer)]
fn ack_one(
    lease_id: Option<pgrx::Uuid>,
    partition_id: Option<pgrx::Uuid>,
    msg_offset: Option<i64>,
    status: default!(Option<&str>, "'completed'"),
    error: default!(Option<&str>, "NULL"),
    retry_after: default!(Option<pgrx::datum::Interval>, "NULL"),
) -> JsonOut {
    let lease_id = lease_id.unwrap_or_else(|| errors::null_arg("lease_id"));
    let partition_id = partition_id.unwrap_or_else(|| errors::null_arg("partition_id"));
    let offset = msg_offset.unwrap_or_else(|| errors::null_arg("msg_offset"));
    let status = parse_status(status.unwrap_or_else(|| errors::null_arg("status")));
    let retry_after = retry_after
        .map(|v| check_retry_after("retry_after", status, crate::pg::clock::interval_micros("retry_after", v)));
    let item = AckItem { offset, status, error: error.map(str::to_string), retry_after };
    JsonOut(ack(lease_id, Some(vec![Addressed { partition_id, item }])))
}

/// The keys an ack item may have.
const ACK_KEYS: [&str; 5] = ["partitionId", "offset", "status", "error", "retryAfter"];

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.ack(uuid, jsonb) IS
  'queen: ack [{partitionId, offset, status?, error?, retryAfter?}] under a lease (completed, failed, retry, dlq)';
"#,
    name = "ack_many_home",
    requires = [ack_many]
);

#[pg_extern(name = "ack", security_definer)]
fn ack_many(lease_id: Option<pgrx::Uuid>, acks: Option<JsonbArg>) -> JsonOut {
    let lease_id = lease_id.unwrap_or_else(|| errors::null_arg("lease_id"));
    let acks = acks.unwrap_or_else(|| errors::null_arg("acks"));
    // Read in jsonb's binary form: no text round trip, and numbers of any size are text
    // here (pgrx's JsonB would go through serde's f64 and fail on 1e309).
    let n = acks.array_len().unwrap_or_else(|| {
        errors::invalid("acks", "must be a JSON array of {partitionId, offset, status?, error?, retryAfter?}")
    });
    if n == 0 {
        errors::invalid("acks", "must hold at least one item");
    }
    if let Err(v) = queen_core::policy::check_ack_items(n) {
        errors::violation(v);
    }
    let items = (0..n).map(|i| ack_item(&acks, i)).collect();
    JsonOut(ack(lease_id, Some(items)))
}

/// Item `i` of the `acks` array, checked: a clear 22023 naming the item's field when it
/// is malformed.
fn ack_item(acks: &JsonbArg, i: u32) -> Addressed {
    let at = |k: &str| format!("acks[{i}].{k}");
    let obj = acks.object_at(i).unwrap_or_else(|text| {
        errors::invalid(
            &format!("acks[{i}]"),
            format_args!("must be an object {{partitionId, offset, status?, error?, retryAfter?}}, got {text}"),
        )
    });
    let (pid, offset, status, error, retry_after) =
        (obj.get("partitionId"), obj.get("offset"), obj.get("status"), obj.get("error"), obj.get("retryAfter"));
    let present = [&pid, &offset, &status, &error, &retry_after].iter().filter(|v| v.is_some()).count();
    obj.reject_unknown_keys(&ACK_KEYS, present, &format!("acks[{i}]"));
    let partition_id = match pid {
        Some(Found::Str(s)) => uuid::Uuid::parse_str(&s)
            .map(to_pg_uuid)
            .unwrap_or_else(|_| errors::invalid(&at("partitionId"), format_args!("{s:?} is not a uuid"))),
        Some(Found::Other(t)) => errors::invalid(&at("partitionId"), format_args!("{t} is not a uuid")),
        _ => errors::invalid(&at("partitionId"), "is missing"),
    };
    let offset = match offset {
        Some(Found::Other(t)) => queen_core::ack::offset_from_number(&t).unwrap_or_else(|| {
            errors::invalid(&at("offset"), format_args!("{} is not an integer offset", excerpt(&t)))
        }),
        Some(Found::Str(t)) => queen_core::ack::offset_from_string(&t).unwrap_or_else(|| {
            errors::invalid(
                &at("offset"),
                format_args!("{:?} is not an integer offset (a string of digits)", excerpt(&t)),
            )
        }),
        _ => errors::invalid(&at("offset"), "is missing"),
    };
    let status = match status {
        None | Some(Found::Null) => AckStatus::Completed,
        Some(Found::Str(s)) => s.parse().unwrap_or_else(|_| {
            errors::invalid(&at("status"), format_args!("{s:?} (must be completed, failed, retry or dlq)"))
        }),
        Some(Found::Other(t)) => errors::invalid(&at("status"), format_args!("{t} is not a string")),
    };
    let error = match error {
        None | Some(Found::Null) => None,
        Some(Found::Str(s)) | Some(Found::Other(s)) => Some(s),
    };
    // retryAfter: seconds (a JSON number, fractions allowed).
    let retry_after = match retry_after {
        None | Some(Found::Null) => None,
        Some(Found::Other(t)) => {
            let secs = t.parse::<f64>().ok().filter(|v| v.is_finite()).unwrap_or_else(|| {
                errors::invalid(&at("retryAfter"), format_args!("{} is not a number of seconds", excerpt(&t)))
            });
            // Out of i64's range saturates, and the limit check refuses it.
            let micros = (secs * queen_core::lease::MICROS as f64).round() as i64;
            Some(check_retry_after(&at("retryAfter"), status, micros))
        }
        Some(Found::Str(s)) => errors::invalid(&at("retryAfter"), format_args!("{s:?} is not a number of seconds")),
    };
    Addressed { partition_id, item: AckItem { offset, status, error, retry_after } }
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.ack(uuid) IS
  'queen: complete every lane the lease holds';
"#,
    name = "ack_lease_home",
    requires = [ack_lease]
);

#[pg_extern(name = "ack", security_definer)]
fn ack_lease(lease_id: Option<pgrx::Uuid>) -> JsonOut {
    let lease_id = lease_id.unwrap_or_else(|| errors::null_arg("lease_id"));
    JsonOut(ack(lease_id, None))
}

/// Applies `items` (or, with None, completes every lane of the lease) and reports.
/// Pins its search path and planner settings itself (`spi::with_queen_plan_settings`): the
/// three forms of `queen.ack` carry no `SET` clause.
fn ack(lease_id: pgrx::Uuid, items: Option<Vec<Addressed>>) -> Json {
    errors::refuse_read_only("ack", "moves cursors");
    crate::pg::spi::with_queen_plan_settings(|| {
        crate::queue::citus::ensure_id_home("lease", &lease_id);
        Spi::connect_mut(|client| ack_in(client, lease_id, items))
    })
}

fn ack_in(client: &mut SpiClient<'_>, lease_id: pgrx::Uuid, items: Option<Vec<Addressed>>) -> Json {
    let now = clock_now();
    // The partitions named by the items, or (whole-lease form, None) the lease's own list,
    // read in the same statement that locks the lanes.
    let pids: Option<Vec<pgrx::Uuid>> = items.as_ref().map(|items| {
        let mut v: Vec<_> = items.iter().map(|a| a.partition_id).collect();
        v.sort_by_key(|p| *p.as_bytes());
        v.dedup();
        v
    });
    // Lock the lanes this lease holds, in partition order (no deadlock between acks).
    let registry = crate::lane::registry::enabled();
    let lanes: Vec<LockedLane> = if registry {
        lock_registry(client, lease_id, pids.as_deref(), now)
    } else {
        lock_rows(client, lease_id, pids, now)
    };

    // Whole-lease form: one `completed` item at batch_end for every live lane.
    let items: Vec<Addressed> = items.unwrap_or_else(|| {
        lanes
            .iter()
            .filter_map(|l| {
                let item = queen_core::lane::whole_lease_item(l.state.batch_end, l.live)?;
                Some(Addressed { partition_id: l.partition_id, item })
            })
            .collect()
    });
    let call_error: Option<String> = items.iter().find_map(|a| a.item.error.clone());

    let mut by_lane: BTreeMap<[u8; 16], Vec<usize>> = BTreeMap::new();
    for (i, a) in items.iter().enumerate() {
        by_lane.entry(*a.partition_id.as_bytes()).or_default().push(i);
    }
    // Each item's report, once its lane decided it (`ack_lane`).
    let mut item_json: Vec<Option<Json>> = vec![None; items.len()];
    let mut lane_json = Vec::new();
    let mut plans = AckPlans::default();
    let mut group = String::new();
    for lane in lanes.iter().filter(|l| l.live) {
        let Some(idxs) = by_lane.get(lane.partition_id.as_bytes()) else { continue };
        let (json, plan) = ack_lane(client, lane, idxs, &items, call_error.as_deref(), now, &mut item_json);
        lane_json.push(json);
        plans.add(plan);
        group = lane.consumer_group.clone();
    }
    if registry {
        apply_registry(client, &lanes, &plans);
    } else if !plans.is_empty() {
        crate::lane::rows::apply_acks(client, lease_id, &group, plans);
    }
    report(lease_id, &items, item_json, lane_json)
}

/// The ack's report: the lease, each item's report in input order (an item no live lane
/// decided is refused), and each lane's.
fn report(lease_id: pgrx::Uuid, items: &[Addressed], item_json: Vec<Option<Json>>, lane_json: Vec<Json>) -> Json {
    let item_json = item_json
        .into_iter()
        .zip(items)
        .map(|(v, a)| {
            v.unwrap_or_else(|| {
                let refused = "no live lane of this lease on that partition (expired, superseded or unknown)";
                item_report(a, false, false, false, refused.into())
            })
        })
        .collect();
    Json::object([
        ("leaseId", Json::uuid(&lease_id)),
        ("items", Json::Array(item_json)),
        ("lanes", Json::Array(lane_json)),
    ])
}

/// One live lane's acks (`items[i]` for each `i` of `idxs`): its plan (`plan_lane`), the
/// dead letter it files, each item's report (into `item_json`), the lane's report, and
/// what the registry or the lane row gets.
fn ack_lane(
    client: &mut SpiClient<'_>,
    lane: &LockedLane,
    idxs: &[usize],
    items: &[Addressed],
    call_error: Option<&str>,
    now: i64,
    item_json: &mut [Option<Json>],
) -> (Json, AckPlan) {
    let lane_items: Vec<AckItem> = idxs.iter().map(|&i| items[i].item.clone()).collect();
    let plan = plan_lane(lane.state, &lane_items, lane.policy, call_error);
    // Some(Some(error)): filed; Some(None): the offset held no message to file.
    let dead_letter = match &plan.disposal {
        Disposal::DeadLetter { offset, error, retry_count } => {
            Some(file_dead_letter(client, lane, *offset, error, *retry_count).then(|| error.clone()))
        }
        _ => None,
    };
    for (&i, outcome) in idxs.iter().zip(&plan.items) {
        item_json[i] = Some(outcome_report(&items[i], outcome, dead_letter.as_ref()));
    }
    let retry_at = queen_core::lane::retry_at(&plan, now);
    if plan.release && retry_at.is_none() {
        // Released lanes are claimable at once: wake waiting pops when we commit. (A lane
        // in backoff is not: a waiting pop sleeps until its end, see `pop`.)
        crate::pg::wake::notify_on_commit(&lane.queue);
    }
    // Seconds before the lane's messages are delivered again (null: at once).
    let retry_after = retry_at.and(plan.retry_after).map(|d| Json::float(d as f64 / queen_core::lease::MICROS as f64));
    let json = Json::object([
        ("partitionId", Json::uuid(&lane.partition_id)),
        ("committed", plan.committed.into()),
        ("leaseReleased", plan.release.into()),
        ("retryCount", plan.retry_count.into()),
        ("retryAfter", retry_after.into()),
    ]);
    let ack_plan = AckPlan {
        partition_id: lane.partition_id,
        committed: plan.committed,
        release: plan.release,
        retry: plan.retry_count,
        reset: plan.reset_attempts,
        retry_at,
    };
    (json, ack_plan)
}

/// Without the registry: locks the lanes of `lease_id` (of the partitions `pids`, or all
/// the lease's) in partition order, after the queue lock and the consume privilege. None
/// when the lease is unknown or its queue was deleted while this waited.
fn lock_rows(
    client: &mut SpiClient<'_>,
    lease_id: pgrx::Uuid,
    pids: Option<Vec<pgrx::Uuid>>,
    now: i64,
) -> Vec<LockedLane> {
    let queue = crate::pg::spi::first_value::<i64>(run(
        client,
        "SELECT queue_id FROM queen.leases WHERE lease_id = $1",
        &[lease_id.into()],
    ));
    let locked = queue.is_some_and(|q| {
        crate::queue::privileges::require_id(client, q, crate::queue::privileges::Privilege::Consume);
        crate::pg::locks::share_queue(q)
    });
    if !locked {
        return Vec::new(); // unknown lease, or its queue was deleted while this waited
    }
    // A lease a version without the registry took, still live across a preloaded run and
    // a crash: the journal's cursors first, or this ack's would be overwritten by them.
    crate::lane::settle_journal(client, true);
    run(
        client,
        concat!(
            "SELECT l.partition_id, l.consumer_group, l.queue_id, l.committed, l.batch_end,
                l.batch_retry_count, ",
            queen_core::lease_live_sql!("l", "$3"),
            ", q.retry_limit,
                q.dead_letter_queue, q.dlq_after_max_retries, q.name, ",
            retry_backoff_micros_sql!("q"),
            "
           FROM queen.lanes l JOIN queen.queues q ON q.queue_id = l.queue_id
          WHERE l.partition_id = ANY(coalesce($2::uuid[],
                  (SELECT le.partition_ids FROM queen.leases le WHERE le.lease_id = $1)))
            AND l.lease_id = $1
          ORDER BY l.partition_id
            FOR UPDATE OF l"
        ),
        &[lease_id.into(), pids.into(), timestamptz(now).into()],
    )
    .map(|row| LockedLane {
        partition_id: row.get(1).or_raise().unwrap(),
        consumer_group: row.get(2).or_raise().unwrap(),
        queue_id: row.get(3).or_raise().unwrap(),
        state: LaneState {
            committed: row.get(4).or_raise().unwrap(),
            batch_end: row.get::<i64>(5).or_raise().unwrap_or(0),
            retry_count: row.get(6).or_raise().unwrap(),
        },
        live: row.get(7).or_raise().unwrap_or(false),
        policy: RetryPolicy {
            retry_limit: row.get(8).or_raise().unwrap(),
            dead_lettering: dead_lettering(row.get(9).or_raise().unwrap(), row.get(10).or_raise().unwrap()),
            retry_backoff: row.get(12).or_raise().unwrap(),
            retry_backoff_max: row.get(13).or_raise().unwrap(),
        },
        queue: row.get(11).or_raise().unwrap(),
        registry: None,
    })
    .collect()
}

thread_local! {
    /// Per backend: queue id -> its retry policy and name (`cache::cached`). Acks of one
    /// message read no queue row while no queue changed.
    static POLICIES: crate::pg::cache::Settings<i64, (RetryPolicy, String)> = Default::default();
}

/// A queue's retry policy and name; None when the queue no longer exists.
fn queue_policy(client: &mut SpiClient<'_>, queue_id: i64) -> Option<(RetryPolicy, String)> {
    crate::pg::cache::cached(
        &POLICIES,
        queue_id,
        || {
            let q = run(
                client,
                concat!(
                    "SELECT q.retry_limit, q.dead_letter_queue, q.dlq_after_max_retries, q.name, ",
                    retry_backoff_micros_sql!("q"),
                    " FROM queen.queues q WHERE q.queue_id = $1"
                ),
                &[queue_id.into()],
            )
            .next()?;
            let policy = RetryPolicy {
                retry_limit: q.get(1).or_raise().unwrap(),
                dead_lettering: dead_lettering(q.get(2).or_raise().unwrap(), q.get(3).or_raise().unwrap()),
                retry_backoff: q.get(5).or_raise().unwrap(),
                retry_backoff_max: q.get(6).or_raise().unwrap(),
            };
            Some((policy, q.get::<String>(4).or_raise().unwrap()))
        },
        |_| true,
    )
}

/// With the lane registry: the lanes of a live or expired lease, locked in partition
/// order (an ack waits for another transaction that holds one, as for a row lock). Only
/// lanes that still carry this lease; `wanted` limits them to the items' partitions.
fn lock_registry(
    client: &mut SpiClient<'_>,
    lease_id: pgrx::Uuid,
    wanted: Option<&[pgrx::Uuid]>,
    now: i64,
) -> Vec<LockedLane> {
    let Some(info) = crate::lane::registry::lease(lease_id) else { return Vec::new() };
    crate::queue::privileges::require_id(client, info.queue_id, crate::queue::privileges::Privilege::Consume);
    // The queue lock before the lanes (`queen_core::lock_order`).
    if !crate::pg::locks::share_queue(info.queue_id) {
        return Vec::new();
    }
    let Some((policy, queue)) = queue_policy(client, info.queue_id) else { return Vec::new() };
    let mut pids: Vec<pgrx::Uuid> = info
        .lanes
        .iter()
        .map(|k| pgrx::Uuid::from_bytes(k.partition))
        .filter(|p| wanted.is_none_or(|w| w.contains(p)))
        .collect();
    pids.sort_by_key(|p| *p.as_bytes());
    let mut locked = Vec::with_capacity(pids.len());
    for pid in pids {
        // The lease's lanes are those that carry it, and those whose holder ended it
        // without committing yet (an ack, a revoke: it may roll back), which this waits
        // for (not one the holder claimed again meanwhile: `lanes::chain_for`). A lane that
        // has moved on since is not this ack's.
        let Some(s) = crate::lane::registry::lock(pid, &info.group, true) else { continue };
        if s.lease_id != *lease_id.as_bytes() {
            continue;
        }
        locked.push(LockedLane {
            partition_id: pid,
            consumer_group: info.group.clone(),
            queue_id: info.queue_id,
            state: LaneState { committed: s.committed, batch_end: s.batch_end, retry_count: s.retry_count },
            live: s.live_lease(now),
            policy,
            queue: queue.clone(),
            registry: Some(s),
        });
    }
    locked
}

/// With the lane registry: the plans take effect there, and every changed cursor or retry
/// count is journaled in this transaction.
fn apply_registry(client: &mut SpiClient<'_>, lanes: &[LockedLane], plans: &AckPlans) {
    let mut journal = Vec::new();
    let mut group = "";
    for p in plans.iter() {
        let lane = lanes.iter().find(|l| l.partition_id == p.partition_id).expect("an acked lane is locked");
        let old = lane.registry.expect("locked in the registry");
        group = &lane.consumer_group;
        let state = queen_core::lane::Lane::from_registry(&old);
        let next = queen_core::lane::apply_ack_effect(&state, p.committed, p.release, p.retry, p.reset, p.retry_at);
        let new = next.to_registry(&old);
        let changed = new.journal_seq != old.journal_seq;
        crate::lane::registry::set(p.partition_id, &lane.consumer_group, new, None);
        if changed {
            journal.push((p.partition_id, new));
        }
    }
    crate::lane::registry::journal(client, group, &journal);
}

/// An item's report.
fn item_report(a: &Addressed, success: bool, dlq: bool, dropped: bool, error: Json) -> Json {
    Json::object([
        ("partitionId", Json::uuid(&a.partition_id)),
        ("offset", a.item.offset.into()),
        ("status", a.item.status.as_str().into()),
        ("success", success.into()),
        ("dlq", dlq.into()),
        ("dropped", dropped.into()),
        ("error", error),
    ])
}

/// The report of an item its lane decided (`dead_letter` as in `ack_lane`).
fn outcome_report(a: &Addressed, outcome: &ItemOutcome, dead_letter: Option<&Option<String>>) -> Json {
    let (dlq, dropped, error): (bool, bool, Json) = match outcome {
        ItemOutcome::Applied => (false, false, a.item.error.clone().into()),
        ItemOutcome::DeadLettered => match dead_letter {
            Some(Some(error)) => (true, false, error.clone().into()),
            // A gap (a push that never committed): nothing to file; the cursor passes it.
            _ => (false, false, NO_MESSAGE.into()),
        },
        ItemOutcome::Dropped => (false, true, Json::Null),
        ItemOutcome::OutsideSpan => (false, false, "offset outside the leased span (committed, batch_end]".into()),
        ItemOutcome::AboveSignal { signal_offset } => {
            (false, false, format!("not applied: a lower explicit signal at offset {signal_offset}").into())
        }
        ItemOutcome::BesideSignal { signal } => {
            (false, false, format!("not applied: a {signal} signal for the same offset decides").into())
        }
    };
    item_report(a, outcome.success(), dlq, dropped, error)
}

/// What an ack reports for a dead-lettering signal at an offset that holds no message.
const NO_MESSAGE: &str = "no message at this offset (a push that did not commit): nothing to dead-letter";

/// Decodes the frame at `offset` and files it in `queen.log_dlq`, in the ack's own
/// transaction: the cursor passes the message only if its dead letter is stored. Returns
/// false when the offset is a gap (nothing to file).
fn file_dead_letter(client: &mut SpiClient<'_>, lane: &LockedLane, offset: i64, error: &str, retry_count: i32) -> bool {
    type Stored = (pgrx::Uuid, String, Vec<u8>, Option<Vec<u8>>);
    // A missing message must mean a push that did not commit, not rows a rotation moved
    // after this transaction's snapshot.
    crate::storage::generations::check_snapshot(client);
    let mut frame: Option<Stored> = None;
    segments::read(client, lane.partition_id, offset, offset, |_, message| {
        if let Some((f, _)) = message {
            frame = Some((
                pgrx::Uuid::from_bytes(f.message_id),
                f.transaction_id.to_string(),
                f.payload.to_vec(),
                f.headers.map(<[u8]>::to_vec),
            ));
        }
        false
    });
    // An offset inside the span holds a message unless an aborted push left it empty:
    // then there is nothing to file, and the cursor passes it all the same. Under
    // REPEATABLE READ or SERIALIZABLE the read used the transaction's snapshot, which may
    // predate the segment that holds the offset (a message pushed, then leased by a pop,
    // after it; or a compaction's or rotation's copy): then it is not known to be a gap,
    // and the cursor must not pass a message it did not file.
    let Some((message_id, transaction_id, payload, headers)) = frame else {
        if errors::fixed_snapshot() && segments::gaps_from(client, lane.partition_id, offset, offset).is_none() {
            errors::serialization_failure(&format!(
                "offset {offset} to dead-letter lies in a segment committed after this transaction's snapshot"
            ));
        }
        return false;
    };
    crate::ops::dlq::file(
        client,
        crate::ops::dlq::Filing {
            queue_id: lane.queue_id,
            partition_id: lane.partition_id,
            group: &lane.consumer_group,
            offset,
            message_id,
            transaction_id: &transaction_id,
            stored: payload,
            headers,
            error,
            retry_count,
            raw: false,
            reason: "failed",
        },
    );
    true
}
