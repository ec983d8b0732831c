//! `queen.extend_lease` (docs/functions.md#extend_lease). Expiry needs no code: a pop treats an expired lease as
//! absent and reclaims the lane (see `pop`).

use pgrx::prelude::*;

use crate::pg::clock::{clock_now, timestamptz};
use crate::pg::errors;
use crate::pg::report::{Json, JsonOut};
use crate::pg::spi::run;
use queen_core::lane::Lane;

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.extend_lease(uuid, int) IS
  'queen: renew every live lane of a lease; never shortens';
"#,
    name = "extend_lease_home",
    requires = [extend_lease]
);

/// Pins its search path and planner settings itself (`spi::with_queen_plan_settings`), as
/// pop and ack do: no `SET` clause.
#[pg_extern(security_definer)]
fn extend_lease(lease_id: Option<pgrx::Uuid>, seconds: default!(Option<i32>, 60)) -> JsonOut {
    crate::pg::spi::with_queen_plan_settings(|| {
        let lease_id = lease_id.unwrap_or_else(|| errors::null_arg("lease_id"));
        errors::refuse_read_only("extend_lease", "renews leases");
        crate::queue::citus::ensure_id_home("lease", &lease_id);
        let seconds = seconds.unwrap_or_else(|| errors::null_arg("seconds"));
        if let Err(v) = queen_core::policy::check_extend_seconds(seconds, crate::pg::settings::max_lease()) {
            errors::violation(v);
        }
        let now = clock_now();
        let target = now.saturating_add(i64::from(seconds) * 1_000_000);
        // Renew every live lane of the lease; never shorten one. An unknown or expired lease
        // renews nothing and is no error.
        let (renewed, earliest) = if crate::lane::registry::enabled() {
            extend_registry(lease_id, target, now)
        } else {
            extend_table(lease_id, target, now)
        };
        let ts = Json::from(earliest);
        JsonOut(Json::object([
            ("leaseId", Json::uuid(&lease_id)),
            ("success", (renewed > 0).into()),
            ("renewed", renewed.into()),
            ("newExpiresAt", ts.clone()),
            ("expiresAt", ts.clone()),
            ("lease_expires_at", ts),
        ]))
    })
}

/// With the lane registry: every live lane of the lease, locked (waiting for another
/// transaction that holds one, as for a row lock), gets the later of its expiry and
/// `target`. Returns how many, and the earliest new expiry as ISO text.
fn extend_registry(lease_id: pgrx::Uuid, target: i64, now: i64) -> (i64, Option<String>) {
    let Some(info) = crate::lane::registry::lease(lease_id) else { return (0, None) };
    Spi::connect_mut(|client| {
        crate::queue::privileges::require_id(client, info.queue_id, crate::queue::privileges::Privilege::Consume)
    });
    // The queue lock, then the lanes in partition order (`queen_core::lock_order`).
    if !crate::pg::locks::share_queue(info.queue_id) {
        return (0, None);
    }
    let mut pids: Vec<pgrx::Uuid> = info.lanes.iter().map(|k| pgrx::Uuid::from_bytes(k.partition)).collect();
    pids.sort_by_key(|p| *p.as_bytes());
    let (mut renewed, mut earliest) = (0i64, i64::MAX);
    for pid in pids {
        let Some(s) = crate::lane::registry::lock(pid, &info.group, true) else { continue };
        let lane = Lane::from_registry(&s);
        let Some(next) = queen_core::lane::extend(&lane, u128::from_be_bytes(*lease_id.as_bytes()), target, now) else {
            continue;
        };
        let new = next.to_registry(&s);
        let expires = new.lease_expires;
        crate::lane::registry::set(pid, &info.group, new, None);
        renewed += 1;
        earliest = earliest.min(expires);
    }
    (renewed, (renewed > 0).then(|| iso(earliest)))
}

/// A timestamp (microseconds since 2000-01-01) as `YYYY-MM-DDTHH:MM:SS.ffffffZ`, as the
/// table path formats it.
fn iso(micros: i64) -> String {
    // Through `spi::run` (a kept plan, no transaction id asked for): the registry path of
    // extend_lease writes nothing to the database.
    Spi::connect_mut(|client| {
        crate::pg::spi::first_value::<String>(crate::pg::spi::run(
            client,
            "SELECT to_char($1 AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
            &[timestamptz(micros).into()],
        ))
    })
    .unwrap_or_default()
}

/// Without the registry: the lanes table, in one statement that locks the lanes in
/// partition order, as an ack does (`queen_core::lock_order`).
fn extend_table(lease_id: pgrx::Uuid, target: i64, now: i64) -> (i64, Option<String>) {
    Spi::connect_mut(|client| {
        let queue_id = crate::pg::spi::first_value::<i64>(run(
            client,
            "SELECT queue_id FROM queen.leases WHERE lease_id = $1",
            &[lease_id.into()],
        ));
        let Some(queue_id) = queue_id else { return (0, None) };
        crate::queue::privileges::require_id(client, queue_id, crate::queue::privileges::Privilege::Consume);
        if !crate::pg::locks::share_queue(queue_id) {
            return (0, None);
        }
        crate::lane::rows::extend(client, lease_id, target, now)
    })
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.revoke_lease(uuid) IS
  'queen: end a lease now (an operator''s call): its lanes are claimable again and its messages are delivered again';
"#,
    name = "revoke_lease_home",
    requires = [revoke_lease]
);

/// `queen.revoke_lease(lease_id)`: ends a lease now, on every lane it still holds, as if
/// it had expired: the cursors stay where they are, the leased messages are delivered to
/// the next pop (counted as a redelivery), and an ack under the lease changes nothing
/// from then on. Waits for a transaction that holds one of its lanes, as an ack does. For
/// operators (a consumer that hung with a long lease); an unknown or expired lease revokes
/// nothing. Returns how many lanes it held.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn revoke_lease(lease_id: Option<pgrx::Uuid>) -> JsonOut {
    let lease_id = lease_id.unwrap_or_else(|| errors::null_arg("lease_id"));
    errors::refuse_read_only("revoke_lease", "ends leases");
    crate::queue::citus::ensure_id_home("lease", &lease_id);
    let (queue, revoked) = if crate::lane::registry::enabled() {
        match crate::lane::registry::lease(lease_id) {
            None => (None, 0),
            Some(info) => {
                let queue = Spi::connect_mut(|client| {
                    crate::queue::privileges::require_id(
                        client,
                        info.queue_id,
                        crate::queue::privileges::Privilege::Admin,
                    );
                    crate::pg::spi::first_value::<String>(run(
                        client,
                        "SELECT name FROM queen.queues WHERE queue_id = $1",
                        &[info.queue_id.into()],
                    ))
                });
                (queue, crate::lane::registry::revoke(lease_id, false))
            }
        }
    } else {
        Spi::connect_mut(|client| {
            let found = run(
                client,
                "SELECT le.queue_id, q.name FROM queen.leases le JOIN queen.queues q ON q.queue_id = le.queue_id
                  WHERE le.lease_id = $1",
                &[lease_id.into()],
            )
            .next()
            .map(|r| (r.get::<i64>(1).ok().flatten().unwrap_or(0), r.get::<String>(2).ok().flatten()));
            let Some((queue_id, name)) = found else { return (None, 0) };
            crate::queue::privileges::require_id(client, queue_id, crate::queue::privileges::Privilege::Admin);
            if !crate::pg::locks::share_queue(queue_id) {
                return (None, 0);
            }
            (name, crate::lane::rows::revoke_lease(client, lease_id, clock_now()))
        })
    };
    if let (Some(q), true) = (&queue, revoked > 0) {
        crate::pg::wake::notify_on_commit(q);
    }
    JsonOut(Json::object([
        ("leaseId", Json::uuid(&lease_id)),
        ("revoked", (revoked > 0).into()),
        ("lanes", revoked.into()),
    ]))
}
