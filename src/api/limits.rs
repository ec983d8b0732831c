//! `queen.configure_limit` (docs/functions.md#configure_limit): a consumer group's rate
//! limit and concurrency cap for a key (a partition name prefix, or `*` for each
//! partition). The rules are `queen_core::limits`'; a pop enforces them at claim time
//! (`lane::limits`).

use pgrx::prelude::*;
use pgrx::{AnyNumeric, JsonB};
use queen_core::limits::Limit;
use serde_json::json;

use crate::pg::errors;
use crate::pg::spi::{first_value, run};
use crate::queue::lookup;
use crate::queue::names::{check_lane_name, check_queue_name};

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.configure_limit IS
  'queen: set (or, with every limit NULL, remove) a consumer group''s rate limit and concurrency cap for a partition name prefix or ''*''';
"#,
    name = "configure_limit_home",
    requires = [configure_limit]
);

/// Stores the limit of (queue, group, key), creating the group as a first pop would; with
/// `rate`, `burst` and `max_in_flight` all NULL, removes it. Pops that start after this
/// commits apply it.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn configure_limit(
    queue: Option<&str>,
    consumer_group: Option<&str>,
    key: Option<&str>,
    rate: default!(Option<AnyNumeric>, "NULL"),
    burst: default!(Option<i32>, "NULL"),
    max_in_flight: default!(Option<i32>, "NULL"),
) -> JsonB {
    let queue = queue.unwrap_or_else(|| errors::null_arg("queue"));
    let group = consumer_group.unwrap_or_else(|| errors::null_arg("consumer_group"));
    let key = key.unwrap_or_else(|| errors::null_arg("key"));
    check_queue_name("queue", queue);
    crate::queue::citus::ensure_home(queue);
    check_lane_name("consumer_group", group);
    crate::queue::privileges::require(Some(queue), crate::queue::privileges::Privilege::Admin);
    let rate = rate.map(|r| f64::try_from(r).unwrap_or(f64::NAN));
    let limit = Limit { key: key.to_string(), rate, burst, max_in_flight };
    if let Err(v) = queen_core::limits::check(&limit) {
        errors::violation(v);
    }
    let remove = rate.is_none() && burst.is_none() && max_in_flight.is_none();
    // Pops cache whether their group has limits (`pop::group_info`), and the limits
    // (`pop::gate`).
    crate::pg::cache::invalidate();
    let removed = Spi::connect_mut(|client| {
        let (queue_id, ..) = crate::queue::privileges::ensure_queue_locked_for(
            client,
            queue,
            crate::queue::privileges::Privilege::Admin,
        );
        if remove {
            return first_value::<bool>(run(
                client,
                "DELETE FROM queen.limits WHERE queue_id = $1 AND consumer_group = $2 AND key = $3 RETURNING true",
                &[queue_id.into(), group.into(), key.into()],
            ))
            .is_some();
        }
        lookup::ensure_named_group(client, queue_id, queue, group);
        run(
            client,
            "INSERT INTO queen.limits (queue_id, consumer_group, key, rate, burst, max_in_flight)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (queue_id, consumer_group, key) DO UPDATE SET
               rate = EXCLUDED.rate, burst = EXCLUDED.burst, max_in_flight = EXCLUDED.max_in_flight,
               updated_at = now()",
            &[queue_id.into(), group.into(), key.into(), rate.into(), burst.into(), max_in_flight.into()],
        );
        // A prefix key's table bucket (used without preloading, or when shared memory has
        // no room) is made here, so that pops never make one concurrently (lane::limits).
        // It is counted for no rate yet: its first pop starts it full.
        if key != queen_core::limits::EACH {
            run(
                client,
                "INSERT INTO queen.limit_buckets (queue_id, consumer_group, key, partition_id, micro, at, rate, capacity)
                 VALUES ($1, $2, $3, NULL, 0, 0, 0, 0) ON CONFLICT DO NOTHING",
                &[queue_id.into(), group.into(), key.into()],
            );
        }
        false
    });
    let mut out = json!({"queue": queue, "consumerGroup": group, "key": key});
    if remove {
        out["removed"] = removed.into();
    } else {
        out["rate"] = rate.into();
        out["burst"] = rate.map(|_| limit.capacity()).into();
        out["maxInFlight"] = max_in_flight.into();
    }
    JsonB(out)
}
