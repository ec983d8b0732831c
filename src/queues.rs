//! Queues, partitions and consumer groups: lookup and implicit creation.

use pgrx::spi::SpiClient;
use queen_core::lease::IMPLICIT_QUEUE_LEASE_SECONDS;

use crate::spi::{first_value, run, to_pg_uuid};

/// A queue's id and the options the hot paths need.
#[derive(Debug, Clone)]
pub struct QueueInfo {
    pub queue_id: i64,
    pub lease_time: i32,
    pub retry_limit: i32,
    pub dead_lettering: bool,
}

/// Finds a queue by name, or creates it with the implicit defaults (lease_time 60).
pub fn ensure_queue(client: &mut SpiClient<'_>, name: &str) -> i64 {
    // The common case first: no write, no lock.
    let found = run(client, "SELECT queue_id FROM queen.queues WHERE name = $1", &[name.into()]);
    if let Some(id) = first_value::<i64>(found) {
        return id;
    }
    run(
        client,
        "INSERT INTO queen.queues (name, lease_time) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        &[name.into(), IMPLICIT_QUEUE_LEASE_SECONDS.into()],
    );
    let found = run(client, "SELECT queue_id FROM queen.queues WHERE name = $1", &[name.into()]);
    first_value::<i64>(found).unwrap_or_else(|| {
        crate::errors::internal(format_args!("queue {name:?} vanished while being created"))
    })
}

/// Creates a partition (committed head 0 plus `reserve` offsets reserved by the caller's
/// push) and the lanes of every existing consumer group, all starting at 0: everything in
/// a partition newer than a group is new to it. Returns None when another session created
/// the partition first; the caller then reserves offsets on the existing row.
pub fn create_partition(
    client: &mut SpiClient<'_>,
    queue_id: i64,
    name: &str,
    reserve: i64,
) -> Option<(pgrx::Uuid, i64)> {
    // FOR SHARE on the queue row: a group being created (FOR UPDATE) waits for us, and we
    // wait for it, so the two never miss each other's lanes.
    run(client, "SELECT 1 FROM queen.queues WHERE queue_id = $1 FOR SHARE", &[queue_id.into()]);
    let pid = to_pg_uuid(uuid::Uuid::now_v7());
    let inserted = run(
        client,
        "INSERT INTO queen.partitions (partition_id, queue_id, name, head) VALUES ($1, $2, $3, $4)
         ON CONFLICT (queue_id, name) DO NOTHING RETURNING head",
        &[pid.into(), queue_id.into(), name.into(), reserve.into()],
    );
    let head = first_value::<i64>(inserted)?;
    run(
        client,
        "INSERT INTO queen.lanes (partition_id, consumer_group, queue_id, committed)
         SELECT $1, g.consumer_group, $2, 0 FROM queen.groups g WHERE g.queue_id = $2
         ON CONFLICT DO NOTHING",
        &[pid.into(), queue_id.into()],
    );
    Some((pid, head))
}

/// Creates the consumer group and its lanes if it does not exist yet. `subscription`
/// 'new' starts the lanes of existing partitions at their committed head, 'all' at 0.
pub fn ensure_group(client: &mut SpiClient<'_>, queue_id: i64, group: &str, subscription: &str) {
    // FOR UPDATE waits for in-flight partition creations to commit, so the lane insert
    // below sees every partition; partitions created later add their own lanes.
    run(client, "SELECT 1 FROM queen.queues WHERE queue_id = $1 FOR UPDATE", &[queue_id.into()]);
    let created = run(
        client,
        "INSERT INTO queen.groups (queue_id, consumer_group, subscription) VALUES ($1, $2, $3)
         ON CONFLICT DO NOTHING RETURNING 1",
        &[queue_id.into(), group.into(), subscription.into()],
    );
    if created.is_empty() {
        return;
    }
    run(
        client,
        "INSERT INTO queen.lanes (partition_id, consumer_group, queue_id, committed)
         SELECT p.partition_id, $2, $1, CASE WHEN $3 = 'new' THEN p.head ELSE 0 END
           FROM queen.partitions p WHERE p.queue_id = $1
         ON CONFLICT DO NOTHING",
        &[queue_id.into(), group.into(), subscription.into()],
    );
}
