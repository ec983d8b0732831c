//! `queen.pause` and `queen.resume` (docs/functions.md#pause): a queue's consumers, or one
//! consumer group's, stop getting messages until it is resumed. The flag is a column
//! (`queen.queues.paused`, `queen.groups.paused`), so it survives a restart; a pop reads
//! it with its group's settings (`pop::group_info`) and returns nothing while either is
//! set. Pushes, acks, `extend_lease` and the maintenance passes go on.

use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::json;

use crate::pg::errors;
use crate::pg::spi::{first_value, run};
use crate::queue::lookup;
use crate::queue::names::{check_lane_name, check_queue_name};

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.pause IS
  'queen: stop delivering a queue''s messages (or one consumer group''s) until queen.resume; pushes, acks and extend_lease go on';
COMMENT ON FUNCTION queen.resume IS
  'queen: deliver a paused queue''s (or consumer group''s) messages again, waking waiting long-polls';
"#,
    name = "pause_home",
    requires = [pause, resume]
);

/// Pauses a queue's consumers, or one group's (created if it does not exist yet, as
/// `configure_group` creates it). Returns the state and whether this call changed it.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn pause(queue: Option<&str>, consumer_group: default!(Option<&str>, "NULL")) -> JsonB {
    set_paused(queue, consumer_group, true)
}

/// Resumes what `pause` paused; a long-poll waiting on the queue wakes when this commits.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn resume(queue: Option<&str>, consumer_group: default!(Option<&str>, "NULL")) -> JsonB {
    set_paused(queue, consumer_group, false)
}

fn set_paused(queue: Option<&str>, group: Option<&str>, paused: bool) -> JsonB {
    let queue = queue.unwrap_or_else(|| errors::null_arg("queue"));
    check_queue_name("queue", queue);
    crate::queue::citus::ensure_home(queue);
    if let Some(g) = group {
        check_lane_name("consumer_group", g);
    }
    crate::queue::privileges::require(Some(queue), crate::queue::privileges::Privilege::Admin);
    let changed = Spi::connect_mut(|client| {
        let (queue_id, ..) = crate::queue::privileges::ensure_queue_locked_for(
            client,
            queue,
            crate::queue::privileges::Privilege::Admin,
        );
        let (read, write, args) = match group {
            None => (
                "SELECT paused FROM queen.queues WHERE queue_id = $1 AND $2::text IS NULL FOR UPDATE",
                "UPDATE queen.queues SET paused = $3, updated_at = clock_timestamp() WHERE queue_id = $1 AND $2::text IS NULL",
                [queue_id.into(), group.into(), paused.into()],
            ),
            Some(g) => {
                lookup::ensure_named_group(client, queue_id, queue, g);
                (
                    "SELECT paused FROM queen.groups WHERE queue_id = $1 AND consumer_group = $2 FOR UPDATE",
                    "UPDATE queen.groups SET paused = $3 WHERE queue_id = $1 AND consumer_group = $2",
                    [queue_id.into(), group.into(), paused.into()],
                )
            }
        };
        let was = first_value::<bool>(run(client, read, &args));
        run(client, write, &args);
        was.is_some_and(|w| w != paused)
    });
    // Pops keep the flag with their group's settings (`pop::group_info`): they read it again
    // once this commits. A resume wakes the long-polls waiting on the queue.
    crate::pg::cache::invalidate();
    if !paused {
        crate::pg::wake::notify_on_commit(queue);
    }
    JsonB(json!({"queue": queue, "consumerGroup": group, "paused": paused, "changed": changed}))
}
