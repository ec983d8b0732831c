//! `queen.create_group`: create a consumer group before its consumers start
//! (docs/functions.md#create_group).

use pgrx::prelude::*;
use queen_core::policy::Subscription;

use crate::pg::errors::{null_arg, violation, SpiExt};
use crate::pg::spi::run;
use crate::queue::citus;
use crate::queue::lookup::ensure_group;
use crate::queue::names::{check_lane_name, check_queue_name};
use crate::queue::privileges::{self, Privilege};

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.create_group IS
  'queen: create a consumer group (subscription all or new) before its consumers start; a no-op if it exists';
"#,
    name = "create_group_home",
    requires = [create_group]
);

/// `queen.create_group`: creates a consumer group (and its queue, as a push would) before
/// any consumer pops, for deploy scripts. `subscription` 'all' starts at the oldest
/// message kept, 'new' at each partition's readable end. A group that exists is left as
/// it is (`created` false, and its own subscription reported). Waits for a pop that is
/// creating the same group at this moment.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn create_group(
    queue: Option<&str>,
    consumer_group: Option<&str>,
    subscription: pgrx::default!(Option<&str>, "'all'"),
) -> pgrx::JsonB {
    let queue = queue.unwrap_or_else(|| null_arg("queue"));
    let group = consumer_group.unwrap_or_else(|| null_arg("consumer_group"));
    let subscription = subscription.unwrap_or_else(|| null_arg("subscription"));
    check_queue_name("queue", queue);
    citus::ensure_home(queue);
    check_lane_name("consumer_group", group);
    privileges::require(Some(queue), Privilege::Admin);
    let subscription = Subscription::parse(subscription).unwrap_or_else(|v| violation(v)).as_str();
    pgrx::Spi::connect_mut(|client| {
        let (queue_id, ..) = privileges::ensure_queue_locked_for(client, queue, Privilege::Admin);
        let created = ensure_group(client, queue_id, group, subscription, true).unwrap_or(false);
        let row = run(
            client,
            "SELECT g.subscription, (SELECT count(*) FROM queen.lanes l
                                      WHERE l.queue_id = g.queue_id AND l.consumer_group = g.consumer_group)
               FROM queen.groups g WHERE g.queue_id = $1 AND g.consumer_group = $2",
            &[queue_id.into(), group.into()],
        );
        let row = row.first();
        pgrx::JsonB(serde_json::json!({
            "queue": queue,
            "consumerGroup": group,
            "created": created,
            "subscription": row.get::<String>(1).or_raise(),
            "lanes": row.get::<i64>(2).or_raise().unwrap_or(0),
        }))
    })
}
