//! `queen.drop_partition`: remove an empty partition (docs/functions.md#drop_partition).
//! What "empty" means, and the expiry step that drops idle partitions, are `churn`'s.

use pgrx::prelude::*;
use pgrx::{JsonB, PgSqlErrorCode};
use serde_json::json;

use crate::pg::errors;
use crate::pg::spi::{first_value, run};
use crate::storage::churn::{try_drop, Kept};

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.drop_partition(text, text) IS
  'queen: remove an empty partition (every group consumed it, no lease, nothing in flight, no dead letters) with its segments and lanes';
"#,
    name = "drop_partition_home",
    requires = [drop_partition]
);

/// `queen.drop_partition(queue, partition)`: removes an empty partition (see the module
/// docs); `55006` when it is not empty or busy, `dropped: false` when it does not exist.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn drop_partition(queue: Option<&str>, partition: Option<&str>) -> JsonB {
    let queue = queue.unwrap_or_else(|| errors::null_arg("queue"));
    let partition = partition.unwrap_or_else(|| errors::null_arg("partition"));
    crate::queue::names::check_queue_name("queue", queue);
    crate::queue::names::check_lane_name("partition", partition);
    crate::queue::citus::ensure_home(queue);
    crate::queue::privileges::require(Some(queue), crate::queue::privileges::Privilege::Admin);
    // It waits for groups being created and for the transactions that hold the lanes, then
    // decides on what those committed (cursors, dead letters, the groups).
    errors::read_committed_only(
        "drop_partition",
        "the transaction's snapshot misses what the transactions it waits for commit",
    );
    let out = Spi::connect_mut(|client| {
        let found = crate::queue::privileges::lock_queue(client, queue, crate::queue::privileges::Privilege::Admin);
        let Some(queue_id) = found else {
            return json!({"queue": queue, "partition": partition, "dropped": false});
        };
        crate::lane::settle_journal(client, true);
        // Before the partition's row, as the lock order has it (`try_drop`).
        crate::pg::locks::lanes_creation(queue_id, true, true);
        // The partition row (waits for a push without the offset registry, a compaction
        // or a retention step of this partition).
        let pid = first_value::<pgrx::Uuid>(run(
            client,
            "SELECT partition_id FROM queen.partitions WHERE queue_id = $1 AND name = $2 FOR UPDATE",
            &[queue_id.into(), partition.into()],
        ));
        let Some(pid) = pid else {
            return json!({"queue": queue, "partition": partition, "dropped": false});
        };
        match try_drop(client, queue_id, pid, true) {
            Ok(segments) => json!({"queue": queue, "partition": partition, "dropped": true, "segments": segments}),
            Err(Kept::Busy(why)) | Err(Kept::NotEmpty(why)) => errors::raise(
                PgSqlErrorCode::ERRCODE_OBJECT_IN_USE,
                format!("queen: cannot drop partition {partition:?} of queue {queue:?}: {why}"),
            ),
        }
    });
    crate::pg::cache::invalidate();
    JsonB(out)
}
