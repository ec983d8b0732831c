//! `queen.retain`: one retention pass, on demand (docs/functions.md#retain). The pass
//! itself is `retention`'s, which the maintenance worker also runs.

use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::json;

use crate::queue::privileges::Privilege;
use crate::storage::generations::Rotated;
use crate::storage::retention::retain_in;

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.retain(text) IS
  'queen: one retention pass: delete segments every group has committed past and older than the queue''s retention';
"#,
    name = "retain_home",
    requires = [retain]
);

/// One retention pass over `queue`, or over every queue with `retention > 0`, after the
/// queue's skip groups past their `max_lag` have moved (`skipped`: the messages they
/// passed over).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn retain(queue: default!(Option<&str>, "NULL")) -> JsonB {
    if let Some(q) = queue {
        crate::queue::names::check_queue_name("queue", q);
        crate::queue::citus::ensure_home(q);
    }
    crate::queue::privileges::require(queue, Privilege::Admin);
    // What a pass may delete is decided by the groups and cursors it reads: with an older
    // snapshot it misses a group created or a cursor moved back since, and would delete
    // what they still need. (The worker runs its passes under READ COMMITTED.)
    crate::pg::errors::read_committed_only(
        "retain",
        "the transaction's snapshot misses groups created and cursors moved back since it was taken, and the pass would delete what they still need",
    );
    let (skipped, queues, segments, bytes, rotated) = Spi::connect_mut(|client| {
        let target = match queue {
            Some(q) => match crate::queue::privileges::checked_queue_id(client, q, Privilege::Admin) {
                Some(id) => Some(id),
                None => return (0, 0, 0, 0, false),
            },
            None => None,
        };
        // Skip groups past their max_lag move first (`ops::overflow`).
        let skipping = match target {
            Some(id) => vec![id],
            None => crate::ops::overflow::queues_to_skip(client),
        };
        let skipped: i64 = skipping.into_iter().map(|id| crate::ops::overflow::skip_queue(client, id)).sum();
        let (queues, segments, bytes) = retain_in(client, target);
        // A pass over every queue also rotates the segment generations when that is due.
        let rotated = queue.is_none() && matches!(crate::storage::generations::rotate(client), Rotated::Yes { .. });
        (skipped, queues, segments, bytes, rotated)
    });
    let mut out = json!({"queues": queues, "segmentsDeleted": segments, "bytesDeleted": bytes, "skipped": skipped});
    if queue.is_none() {
        out["generationRotated"] = rotated.into();
    }
    JsonB(out)
}
