//! `queen.compact`: one compaction pass, on demand (docs/functions.md#compact). The pass
//! itself is `compaction`'s, which the maintenance worker also runs.

use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::json;

use crate::queue::privileges::Privilege;
use crate::storage::compaction::{compact_partition, partitions_to_compact, Done};

extension_sql!(
    r#"
COMMENT ON FUNCTION queen.compact(text) IS
  'queen: one compaction pass: merge the small segments of small pushes into large ones';
"#,
    name = "compact_home",
    requires = [compact]
);

/// `queen.compact(queue)`: one compaction pass over a queue, or over every queue.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn compact(queue: default!(Option<&str>, "NULL")) -> JsonB {
    if let Some(q) = queue {
        crate::queue::names::check_queue_name("queue", q);
        crate::queue::citus::ensure_home(q);
    }
    crate::queue::privileges::require(queue, Privilege::Admin);
    // A merge must see every fresh segment of its run. A fixed snapshot may miss one
    // committed since it was taken (or copied forward by a rotation of the segment
    // generations), and the merged segment would then hold a gap at its offsets.
    crate::pg::errors::read_committed_only(
        "compact",
        "the transaction's snapshot may miss segments committed since it was taken",
    );
    let mut done = Done::default();
    Spi::connect_mut(|client| {
        let target = match queue {
            Some(q) => match crate::queue::privileges::checked_queue_id(client, q, Privilege::Admin) {
                Some(id) => Some(id),
                None => return,
            },
            None => None,
        };
        for pid in partitions_to_compact(client, target) {
            done.add(compact_partition(client, pid, 0).0);
        }
    });
    JsonB(json!({
        "partitions": done.partitions,
        "segmentsMerged": done.merged,
        "segmentsWritten": done.written,
        "messages": done.messages,
    }))
}
