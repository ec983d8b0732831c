//! Maximum depth and overflow policies (docs/concepts.md#maximum-depth); the rules are
//! `queen_core::overflow`'s.
//!
//! - `check_push`: before a push reserves offsets, the queue's depth and the pushed
//!   partition's `hold` lags are read (committed state: the readable ends and the groups'
//!   committed cursors), and the push is refused (53400) when it would pass a limit.
//!   Nothing is stored then. Only queues with a limit pay for the read.
//! - `skip_queue`: the background worker's retention round (and `queen.retain`) moves a
//!   `skip` group's cursor past its oldest messages wherever its lag passes its `max_lag`,
//!   and files each span passed as one dead letter, reason `skipped`.

use pgrx::spi::SpiClient;
use pgrx::PgSqlErrorCode;
use queen_core::overflow::{self, OnOverflow, Refusal};

use crate::ops::cursors::{lock_lanes, move_cursor, Busy, Which};
use crate::pg::errors::{self, SpiExt};
use crate::pg::spi::run;
use crate::queue::lookup::Target;

/// (`lane_lags!`) The committed cursor of each lane (`queen._lane`: the registry's, else the row's) with
/// its partition's readable end and retention mark, for the lanes of the groups of queue
/// `$1` that `$3` picks (`hold` or `skip`), of partition `$2` only unless NULL.
macro_rules! lane_lags {
    () => {
        concat!(
            "SELECT g.consumer_group, g.max_lag, l.partition_id, ",
            queen_core::lag_sql!("v.committed", "p.retained_through", "queen._readable(p.partition_id, p.head)"),
            " AS lag
               FROM queen.groups g
               JOIN queen.lanes l ON l.queue_id = g.queue_id AND l.consumer_group = g.consumer_group
               JOIN queen.partitions p ON p.partition_id = l.partition_id
              CROSS JOIN LATERAL queen._lane(l.partition_id, l.consumer_group, l.committed, l.lease_id,
                                             l.lease_expires_at, l.batch_end, l.batch_retry_count, l.attempt_count) v
              WHERE g.queue_id = $1 AND g.on_overflow = $3 AND ($2::uuid IS NULL OR l.partition_id = $2)"
        )
    };
}

/// What `push::locate` reads of a queue `q`'s limits, for its `Target`: `max_depth`, and
/// whether a group holds producers back by its `max_lag` (the groups `HOLD_LAGS_HERE`
/// reads).
macro_rules! locate_limits {
    () => {
        "q.max_depth, EXISTS (SELECT 1 FROM queen.groups g WHERE g.queue_id = q.queue_id
                                 AND g.on_overflow = 'hold' AND g.max_lag IS NOT NULL)"
    };
}
pub(crate) use locate_limits;

/// The `hold` groups with a `max_lag`, with their lag in the partition `$2`.
const HOLD_LAGS_HERE: &str =
    concat!("SELECT consumer_group, lag, max_lag FROM (", lane_lags!(), ") x WHERE max_lag IS NOT NULL ORDER BY 1");

/// Everything stored in queue `$1`, whether it has a group, and each `hold` group's lag.
const DEPTH: &str = concat!(
    "SELECT (SELECT coalesce(sum(",
    queen_core::lag_sql!("p.retained_through", "p.retained_through", "queen._readable(p.partition_id, p.head)"),
    "), 0)::int8 FROM queen.partitions p WHERE p.queue_id = $1),
            EXISTS (SELECT 1 FROM queen.groups WHERE queue_id = $1),
            (SELECT array_agg(lag) FROM (SELECT sum(lag)::int8 AS lag FROM (",
    lane_lags!(),
    ") x GROUP BY consumer_group) s)"
);

/// The `skip` groups' lanes past their `max_lag`.
const SKIP_OVER: &str =
    concat!("SELECT consumer_group, partition_id FROM (", lane_lags!(), ") x WHERE lag > max_lag ORDER BY 1, 2");

/// Refuses (53400) a push of `n` messages to target `t` of `queue` that would take the
/// queue past its `max_depth`, or a `hold` group past its `max_lag` in the partition.
///
/// Each limit's headroom is read (`queue_depth`, `HOLD_LAGS_HERE`) and kept per backend
/// for `HEADROOM_FRESH_US`, lowered by each push it lets pass (`Headrooms`); a push is
/// refused only on a fresh read (`overflow::headroom_covers`). The depth counts this
/// transaction's own pushes: with the offset registry its reservations are readable to
/// itself; without it, its earlier statements' segments are, but not this call's, which are
/// written at its end: `earlier` counts those (messages this call already queued to the
/// same queue).
pub fn check_push(client: &mut SpiClient<'_>, queue: &str, t: &Target, n: i64, earlier: i64) {
    if let Some(max_depth) = t.max_depth {
        let key = Headroom::Queue(t.queue_id);
        if !Headrooms::take(key, n) {
            let read_under = crate::pg::cache::last_generation();
            let own = if crate::offsets::enabled() { 0 } else { earlier };
            let depth = queue_depth(client, t.queue_id) + own;
            if let Some(r) = overflow::push_refusal(n, Some(max_depth), depth, []) {
                refuse(queue, n, r);
            }
            Headrooms::store(key, max_depth - depth - n, read_under);
        }
    }
    if t.lag_limited {
        let key = Headroom::Partition(t.partition_id);
        if !Headrooms::take(key, n) {
            let read_under = crate::pg::cache::last_generation();
            let here: Vec<(String, i64, i64)> = run(
                client,
                HOLD_LAGS_HERE,
                &[t.queue_id.into(), t.partition_id.into(), OnOverflow::Hold.as_str().into()],
            )
            .map(|r| {
                (
                    r.get::<String>(1).or_raise().unwrap(),
                    r.get::<i64>(2).or_raise().unwrap(),
                    r.get::<i64>(3).or_raise().unwrap(),
                )
            })
            .collect();
            if let Some(r) =
                overflow::push_refusal(n, None, 0, here.iter().map(|(g, lag, max)| (g.as_str(), *lag, *max)))
            {
                refuse(queue, n, r);
            }
            let least = here.iter().map(|(_, lag, max)| max - lag).min().unwrap_or(i64::MAX);
            Headrooms::store(key, least - n, read_under);
        }
    }
}

fn refuse(queue: &str, n: i64, r: Refusal) -> ! {
    let message = match r {
        Refusal::Queue { depth, max_depth } => format!(
            "queen: queue {queue:?} is full: {depth} messages unconsumed, max_depth {max_depth}; \
             a push of {n} is refused (consume, raise max_depth, or skip a group's backlog)"
        ),
        Refusal::Group { group, lag, max_lag } => format!(
            "queen: queue {queue:?} is full for consumer group {group:?}: {lag} messages unconsumed in this \
             partition, max_lag {max_lag}; a push of {n} is refused (consume, or configure the group's \
             max_lag or on_overflow => 'skip')"
        ),
    };
    errors::raise(PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED, message)
}

/// What a headroom limits: a queue's depth, or the `hold` groups' lag in a partition.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Headroom {
    Queue(i64),
    Partition(pgrx::Uuid),
}

/// Per backend: each limit's headroom as last read, with when, and the cache generation
/// it was read under (`cache::generation`: a `configure` or `configure_group` that commits
/// starts a new one).
struct Headrooms;

thread_local! {
    static HEADROOMS: std::cell::RefCell<std::collections::HashMap<Headroom, (u64, std::time::Instant, i64)>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

impl Headrooms {
    /// Lets a push of `n` pass on the kept headroom of `key`, lowering it: false when there
    /// is none, it is stale or too small (then the caller reads again).
    fn take(key: Headroom, n: i64) -> bool {
        let generation = crate::pg::cache::last_generation();
        HEADROOMS.with(|h| {
            let mut h = h.borrow_mut();
            let Some((g, at, headroom)) = h.get_mut(&key) else { return false };
            let age = at.elapsed().as_micros().min(i64::MAX as u128) as i64;
            if *g != generation || !overflow::headroom_covers(*headroom, age, n) {
                return false;
            }
            *headroom -= n;
            true
        })
    }

    /// Keeps `key`'s headroom read under cache generation `read_under`, unless a change
    /// of the limits arrived while it was read (it may be stale already).
    fn store(key: Headroom, headroom: i64, read_under: u64) {
        let generation = crate::pg::cache::last_generation();
        if generation != read_under {
            return;
        }
        HEADROOMS.with(|h| {
            let mut h = h.borrow_mut();
            if h.len() >= 10_000 {
                h.clear();
            }
            h.insert(key, (generation, std::time::Instant::now(), headroom));
        })
    }
}

/// The queue's depth (`overflow::depth`): every stored offset while it has no group, else
/// the lag of its slowest `hold` group.
fn queue_depth(client: &mut SpiClient<'_>, queue_id: i64) -> i64 {
    let row =
        run(client, DEPTH, &[queue_id.into(), Option::<pgrx::Uuid>::None.into(), OnOverflow::Hold.as_str().into()])
            .next()
            .expect("one row");
    let stored = row.get::<i64>(1).or_raise().unwrap_or(0);
    let any_group = row.get::<bool>(2).or_raise().unwrap_or(false);
    let lags = row.get::<Vec<i64>>(3).or_raise().unwrap_or_default();
    overflow::depth(stored, any_group, lags)
}

/// Queues with a `skip` group that has a `max_lag` (the worker's list).
pub fn queues_to_skip(client: &mut SpiClient<'_>) -> Vec<i64> {
    run(
        client,
        "SELECT DISTINCT queue_id FROM queen.groups WHERE on_overflow = 'skip' AND max_lag IS NOT NULL ORDER BY 1",
        &[],
    )
    .map(|r| r.get::<i64>(1).or_raise().unwrap())
    .collect()
}

/// Moves every `skip` group of the queue past its oldest messages wherever its lag passes
/// its `max_lag` (`overflow::skip_span`), filing each span as one `skipped` dead letter.
/// A lane under a live lease is left for a later pass (its consumer is at work; its next
/// batch ends the lease). Returns the messages skipped; 0 when the queue is gone or busy.
pub fn skip_queue(client: &mut SpiClient<'_>, queue_id: i64) -> i64 {
    // Never waits (as retention): a queue a `delete_queue` holds is left for the next pass.
    if !crate::pg::locks::try_share_queue(queue_id) {
        return 0;
    }
    // The lanes past their max_lag, by group: a first look without locks.
    let over: Vec<(String, pgrx::Uuid)> =
        run(client, SKIP_OVER, &[queue_id.into(), Option::<pgrx::Uuid>::None.into(), OnOverflow::Skip.as_str().into()])
            .map(|r| (r.get::<String>(1).or_raise().unwrap(), r.get(2).or_raise().unwrap()))
            .collect();
    let mut groups: Vec<(&str, Vec<pgrx::Uuid>)> = Vec::new();
    for (g, pid) in &over {
        match groups.last_mut() {
            Some(last) if last.0 == g.as_str() => last.1.push(*pid),
            _ => groups.push((g.as_str(), vec![*pid])),
        }
    }
    groups.into_iter().map(|(group, pids)| skip_lanes(client, queue_id, group, &pids)).sum()
}

/// Locks the lanes `pids` of `group` that nobody holds (a long-poll may hold one for
/// minutes: it is left for a later pass, as a leased one is) and moves each that is still
/// past `max_lag` and under no live lease, filing the span passed. Returns the messages
/// skipped.
fn skip_lanes(client: &mut SpiClient<'_>, queue_id: i64, group: &str, pids: &[pgrx::Uuid]) -> i64 {
    let lanes = lock_lanes(client, queue_id, group, Which::Ids(pids), Busy::Skip);
    // The policy again, now that the lanes are locked: a `configure_group` that committed
    // since the first look wins (a group no longer skipping is left alone).
    let Some(max_lag) = crate::pg::spi::first_value::<i64>(run(
        client,
        "SELECT max_lag FROM queen.groups WHERE queue_id = $1 AND consumer_group = $2 AND on_overflow = $3",
        &[queue_id.into(), group.into(), OnOverflow::Skip.as_str().into()],
    )) else {
        return 0;
    };
    let mut journal = Vec::new();
    let mut skipped = 0;
    for l in lanes {
        if l.leased {
            continue;
        }
        let readable = crate::offsets::readable(l.partition_id);
        let Some((from, to)) = overflow::skip_span(l.committed, l.retained_through, readable, max_lag) else {
            continue;
        };
        crate::ops::dlq::file_skipped(client, queue_id, l.partition_id, group, (from, to), max_lag);
        move_cursor(client, &l, group, to, &mut journal);
        skipped += to - from + 1;
    }
    crate::lane::registry::journal(client, group, &journal);
    skipped
}
