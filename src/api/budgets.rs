//! Consumer lease budgets (docs/functions.md#configure_group, #may_start): a group stores the four allowances; a pop
//! by that group leases for their sum; `may_start` tells a consumer whether a queued
//! message still has the time to run.

use pgrx::datum::Interval;
use pgrx::prelude::*;
use pgrx::{JsonB, PgLogLevel, PgSqlErrorCode};
use queen_core::lease::{Budget, MICROS};
use serde_json::json;

use crate::pg::clock::{clock_now, timestamptz};
use crate::pg::errors::{self, SpiExt};
use crate::pg::spi::{first_value, run};
use crate::queue::lookup;
use crate::queue::names::{check_lane_name, check_queue_name};

/// Microseconds in an interval argument (`clock::interval_micros`); NULL is an error.
fn micros(argument: &str, v: Option<Interval>) -> i64 {
    crate::pg::clock::interval_micros(argument, v.unwrap_or_else(|| errors::null_arg(argument)))
}

fn secs(m: i64) -> f64 {
    m as f64 / MICROS as f64
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.configure_group IS
  'queen: store a consumer group''s lease budget (queue margin + handler timeout + grace + record margin) and its overflow policy';
"#,
    name = "configure_group_home",
    requires = [configure_group_settings]
);

/// `queen.configure_group` (docs/functions.md#configure_group): stores a group's lease
/// budget and its overflow policy (`max_lag` in each partition, `on_overflow`), creating
/// the group as a first pop would. Every argument not given takes its default. (Named
/// apart from the SQL function: `configure_group_wrapper`, the C symbol of 0.3.0's
/// six-argument form, stays below as a stub that asks for the update.)
#[allow(clippy::too_many_arguments)]
#[pg_extern(name = "configure_group", security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn configure_group_settings(
    queue: Option<&str>,
    consumer_group: Option<&str>,
    handler_timeout: default!(Option<Interval>, "'30 s'"),
    queue_margin: default!(Option<Interval>, "'15 s'"),
    timeout_grace: default!(Option<Interval>, "'1 s'"),
    record_margin: default!(Option<Interval>, "'2 s'"),
    max_lag: default!(Option<i64>, "NULL"),
    on_overflow: default!(Option<&str>, "'hold'"),
) -> JsonB {
    let queue = queue.unwrap_or_else(|| errors::null_arg("queue"));
    let group = consumer_group.unwrap_or_else(|| errors::null_arg("consumer_group"));
    check_queue_name("queue", queue);
    crate::queue::citus::ensure_home(queue);
    check_lane_name("consumer_group", group);
    crate::queue::privileges::require(Some(queue), crate::queue::privileges::Privilege::Admin);
    let b = Budget {
        handler_timeout: micros("handler_timeout", handler_timeout),
        queue_margin: micros("queue_margin", queue_margin),
        timeout_grace: micros("timeout_grace", timeout_grace),
        record_margin: micros("record_margin", record_margin),
    };
    if let Err(v) = b.validate() {
        errors::violation(v);
    }
    let on_overflow = on_overflow.unwrap_or_else(|| errors::null_arg("on_overflow"));
    let policy = queen_core::overflow::check_group(max_lag, on_overflow).unwrap_or_else(|v| errors::violation(v));
    // Pops cache a group's budget (`pop::group_info`): they read it again once this commits.
    crate::pg::cache::invalidate();
    Spi::connect_mut(|client| store_group(client, queue, group, &b, max_lag, policy));
    JsonB(json!({
        "queue": queue,
        "consumerGroup": group,
        "handlerTimeout": secs(b.handler_timeout),
        "queueMargin": secs(b.queue_margin),
        "timeoutGrace": secs(b.timeout_grace),
        "recordMargin": secs(b.record_margin),
        "leaseSeconds": secs(b.lease_micros()),
        "maxLag": max_lag,
        "onOverflow": policy.as_str(),
    }))
}

/// Creates the group (as a first pop would: 'all', after a session creating it right now)
/// and stores its budget and overflow policy.
fn store_group(
    client: &mut pgrx::spi::SpiClient<'_>,
    queue: &str,
    group: &str,
    b: &Budget,
    max_lag: Option<i64>,
    policy: queen_core::overflow::OnOverflow,
) {
    let (queue_id, ..) =
        crate::queue::privileges::ensure_queue_locked_for(client, queue, crate::queue::privileges::Privilege::Admin);
    // Creates the group and its lanes as a first pop would ('all'), after a session
    // that is creating it right now.
    lookup::ensure_group(client, queue_id, group, "all", true);
    run(
        client,
        "INSERT INTO queen.groups AS g (queue_id, consumer_group, handler_timeout, queue_margin,
                                      timeout_grace, record_margin, max_lag, on_overflow)
         VALUES ($1, $2, make_interval(secs => $3), make_interval(secs => $4),
                 make_interval(secs => $5), make_interval(secs => $6), $7, $8)
         ON CONFLICT (queue_id, consumer_group) DO UPDATE SET
           handler_timeout = EXCLUDED.handler_timeout, queue_margin = EXCLUDED.queue_margin,
           timeout_grace = EXCLUDED.timeout_grace, record_margin = EXCLUDED.record_margin,
           max_lag = EXCLUDED.max_lag, on_overflow = EXCLUDED.on_overflow",
        &[
            queue_id.into(),
            group.into(),
            secs(b.handler_timeout).into(),
            secs(b.queue_margin).into(),
            secs(b.timeout_grace).into(),
            secs(b.record_margin).into(),
            max_lag.into(),
            policy.as_str().into(),
        ],
    );
}

crate::pg::srf::older_sql_symbol!(
    pg_finfo_configure_group_wrapper,
    configure_group_wrapper,
    "The C symbol of `queen.configure_group` up to 0.3.0, whose SQL declared 6 arguments."
);

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.may_start(uuid, interval) IS
  'queen: may a queued message start? false with WARNING SQL0105 when the lease cannot cover it';
"#,
    name = "may_start_home",
    requires = [may_start]
);

/// True when the lease's remaining time covers `handler_timeout` (default: the group's)
/// plus the group's grace and record margin. Otherwise false, with a WARNING that begins
/// `SQL0105: queued message has insufficient lease time`. An expired or unknown lease is
/// false. A group without a stored budget counts grace and margin as 0.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn may_start(lease_id: Option<pgrx::Uuid>, handler_timeout: default!(Option<Interval>, "NULL")) -> bool {
    let lease_id = lease_id.unwrap_or_else(|| errors::null_arg("lease_id"));
    crate::queue::citus::ensure_id_home("lease", &lease_id);
    let asked = handler_timeout.map(|v| micros("handler_timeout", Some(v)));
    let now = clock_now();
    let found = if crate::lane::registry::enabled() {
        may_start_registry(lease_id, now)
    } else {
        may_start_rows(lease_id, now)
    };
    let (ok, detail) = match found {
        None => (false, "the lease is expired or unknown".to_string()),
        Some((remaining, group_timeout, grace, margin)) => {
            let b = Budget {
                handler_timeout: group_timeout.unwrap_or(0),
                queue_margin: 0,
                timeout_grace: grace,
                record_margin: margin,
            };
            let timeout = asked.or(group_timeout).unwrap_or(0);
            let ok = b.may_start(remaining, timeout);
            (
                ok,
                format!(
                    "{:.3} s of lease remain; starting needs {:.3} s (handler timeout {:.3} s + grace {:.3} s + record margin {:.3} s)",
                    secs(remaining),
                    secs(b.start_requirement(timeout)),
                    secs(timeout),
                    secs(grace),
                    secs(margin)
                ),
            )
        }
    };
    if !ok {
        pgrx::pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_WARNING,
            "SQL0105: queued message has insufficient lease time".to_string(),
            "queen",
        )
        .set_detail(detail)
        .report(PgLogLevel::WARNING);
    }
    ok
}

/// Without the lane registry: `may_start_registry`'s answer, from the lease and lane rows.
fn may_start_rows(lease_id: pgrx::Uuid, now: i64) -> Option<(i64, Option<i64>, i64, i64)> {
    Spi::connect_mut(|client| {
        // The privilege first, on the lease's queue (a check inside the query's WHERE
        // could be evaluated on other leases' rows: the planner orders conditions).
        let queue = first_value::<i64>(run(
            client,
            "SELECT queue_id FROM queen.leases WHERE lease_id = $1",
            &[lease_id.into()],
        ));
        if let Some(queue_id) = queue {
            crate::queue::privileges::require_id(client, queue_id, crate::queue::privileges::Privilege::Consume);
        }
        let rows = run(
            client,
            concat!(
                "SELECT (extract(epoch FROM min(l.lease_expires_at) - $2) * 1000000)::int8,
                (extract(epoch FROM g.handler_timeout) * 1000000)::int8,
                (extract(epoch FROM g.timeout_grace) * 1000000)::int8,
                (extract(epoch FROM g.record_margin) * 1000000)::int8
           FROM queen.leases le
           JOIN queen.lanes l ON l.partition_id = ANY(le.partition_ids) AND l.lease_id = le.lease_id
           LEFT JOIN queen.groups g ON g.queue_id = le.queue_id AND g.consumer_group = le.consumer_group
          WHERE le.lease_id = $1 AND ",
                queen_core::lease_live_sql!("l", "$2"),
                "
          GROUP BY g.handler_timeout, g.timeout_grace, g.record_margin"
            ),
            &[lease_id.into(), timestamptz(now).into()],
        );
        rows.into_iter().next().map(|r| {
            (
                r.get::<i64>(1).or_raise().unwrap_or(0),
                r.get::<i64>(2).or_raise(),
                r.get::<i64>(3).or_raise().unwrap_or(0),
                r.get::<i64>(4).or_raise().unwrap_or(0),
            )
        })
    })
}

/// With the lane registry: the remaining time of the lease (its earliest live lane) and
/// the group's handler timeout, grace and record margin (microseconds).
fn may_start_registry(lease_id: pgrx::Uuid, now: i64) -> Option<(i64, Option<i64>, i64, i64)> {
    let info = crate::lane::registry::lease(lease_id)?;
    Spi::connect_mut(|client| {
        crate::queue::privileges::require_id(client, info.queue_id, crate::queue::privileges::Privilege::Consume)
    });
    let earliest = info
        .lanes
        .iter()
        .map(|k| crate::lane::registry::view(pgrx::Uuid::from_bytes(k.partition), &info.group).0)
        .filter(|s| s.held_by(lease_id.as_bytes(), now))
        .map(|s| s.lease_expires)
        .min()?;
    let budget = Spi::connect_mut(|client| {
        run(
            client,
            "SELECT (extract(epoch FROM g.handler_timeout) * 1000000)::int8,
                    (extract(epoch FROM g.timeout_grace) * 1000000)::int8,
                    (extract(epoch FROM g.record_margin) * 1000000)::int8
               FROM queen.groups g WHERE g.queue_id = $1 AND g.consumer_group = $2",
            &[info.queue_id.into(), info.group.as_str().into()],
        )
        .next()
        .map(|r| {
            (
                r.get::<i64>(1).or_raise(),
                r.get::<i64>(2).or_raise().unwrap_or(0),
                r.get::<i64>(3).or_raise().unwrap_or(0),
            )
        })
    });
    let (timeout, grace, margin) = budget.unwrap_or((None, 0, 0));
    Some((earliest - now, timeout, grace, margin))
}
