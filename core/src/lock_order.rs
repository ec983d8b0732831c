//! The order in which queen takes its locks (invariant 5: no deadlock between queen's own
//! calls). Every path follows it; `docs/locking.md` walks through each one.
//!
//! 1. **The queue lock** (a heavyweight lock on the queue, not a row lock; `pg_locks`
//!    shows it as an `object` lock whose `classid` is `queen.queues` and whose `objid` is
//!    the queue id). Every call that reads or writes a queue's rows takes it in share
//!    mode, for the rest of its transaction, before any row lock of that queue: push,
//!    pop, ack, extend_lease, the dead-letter calls, seek, create/drop_group.
//!    `delete_queue` takes it in exclusive mode before anything else. So `delete_queue`
//!    waits for every transaction that touched the queue, and nothing that touched it
//!    ever waits for `delete_queue` while holding one of its rows.
//!    A transaction that touches several queues takes their locks as it reaches them;
//!    push_batch reaches them in queue-name order.
//!    Without the lane registry, once after a crash of a preloaded server: the **lane
//!    journal's tables** (SHARE ROW EXCLUSIVE, while the journal is saved into the lanes'
//!    rows) right after the queue lock, before any other; a pop, a retention step and a
//!    skip group's overflow step without waiting. (The save updates lane rows of every
//!    queue: a transaction that holds lane rows of a lease and then acks may meet it in a
//!    deadlock, which PostgreSQL breaks; only once, after such a restart.)
//!    The **lane-creation lock** (a second heavyweight lock per queue) comes next:
//!    share mode to create lanes (a pop without waiting, a new group's lanes, `seek`
//!    back), exclusive by a retention step and the partition expiry (without waiting) and
//!    by `drop_partition` (waiting).
//! 2. **The queue row** (`queen.queues`): FOR KEY SHARE by the foreign keys of a new
//!    partition, group, dead letter or folded count of expired drops; FOR UPDATE by
//!    `delete_queue`; UPDATE by `configure`. (Retention takes no queue row lock.)
//!    Then group rows (`queen.groups`): FOR KEY SHARE by lane inserts (SKIP LOCKED),
//!    by `dlq_redrive` to failing groups (in name order), and by a call that finds its
//!    group there and writes for it (`ensure_group`; a pop SKIP LOCKED), FOR UPDATE by `seek`,
//!    `purge`, `drop_group`, `pause` and `resume`.
//! 3. **Partition rows**, in partition-name order within a call (pushes without the
//!    offset registry; `drop_partition`; compaction, retention and the partition expiry
//!    SKIP LOCKED).
//! 4. **Lanes**, in partition-id order (byte order of the UUID) within a lease: pop
//!    (SKIP LOCKED), ack, extend_lease, seek, drop_group; `drop_partition` locks one
//!    partition's lanes in group-name order (the expiry without waiting).
//! 5. Everything else (dedup rows, dead letters, segments, counts of expired drops) last.
//!
//! Group creation is serialized by a second heavyweight lock, keyed by (queue id, group
//! name), taken without waiting: [`group_key`] gives its key.
//!
//! Last of all, a role's **privileges lock** (an `object` lock on the role as a shared
//! object: database 0, `pg_authid`, the role, sub-id 1): `grant` takes it exclusively
//! after its grant row, before it looks for the role's membership of `queen_grantee` and
//! adds it, until the transaction ends. Two first grants of one role, in any databases,
//! thus run one after the other. After it, only when the role holds EXECUTE on queen's
//! functions directly, the **function rights lock** (`classid` `queen.queue_grants`, key
//! 0), for the REVOKE that rewrites those functions' catalog rows.
//!
//! Outside this order, and holding nothing else new meanwhile: the **load lock** of a
//! registry entry (an `object` lock whose `classid` is `queen.partitions` for a
//! partition's offsets, `queen.lanes` for a lane; [`load_key`] gives its key). A backend
//! that brings the entry into shared memory holds it exclusively from before it claims
//! the load until the load ends, whatever it holds already; one that finds the entry
//! loading waits for it in share mode and lets it go at once. While it holds it, a loader
//! waits only for prepared transactions (which wait for nothing) and for relation locks
//! that strong statements take: the worker's rotation and journal swap (which give up
//! after a short `lock_timeout`, or do not wait), a `queen.retain()` whose rotation holds
//! its tables until the caller's transaction ends, and a DBA's statement. Every wait it
//! can make is in the lock manager, and so is every wait for it: a cycle through a load
//! (a loader's read queued behind a DBA's `VACUUM FULL` of a table the waiter wrote, or
//! behind a `retain()` followed by a push in one transaction) is one the deadlock detector
//! sees and breaks, by letting the loader's read go first when it can, else by failing
//! one of them (`40P01`). A wait outside the lock manager would hang there for good.

use sha2::{Digest, Sha256};

/// The key of the lock that serializes the creation of one consumer group: 48 bits of a
/// SHA-256 of the queue id and the group name. Two groups share a key with probability
/// 2^-48; if they ever did, one creation would be retried by the next pop, not lost.
pub fn group_key(queue_id: i64, group: &str) -> (u32, u16) {
    key48(|h| {
        h.update(queue_id.to_le_bytes());
        h.update(group.as_bytes());
    })
}

/// The key of a registry entry's load lock: 48 bits of a SHA-256 of the entry's key
/// (`parts`: the partition id; or the partition id and the group name). Two entries share
/// a key with probability 2^-48; if they did, a backend would wait for the other entry's
/// load as well, never skip its own.
pub fn load_key(parts: &[&[u8]]) -> (u32, u16) {
    key48(|h| {
        for p in parts {
            h.update((p.len() as u64).to_le_bytes());
            h.update(p);
        }
    })
}

/// An object lock's key (object id and sub-id): the first 48 bits of a SHA-256 of what
/// `feed` writes.
fn key48(feed: impl FnOnce(&mut Sha256)) -> (u32, u16) {
    let mut h = Sha256::new();
    feed(&mut h);
    let d = h.finalize();
    (u32::from_le_bytes([d[0], d[1], d[2], d[3]]), u16::from_le_bytes([d[4], d[5]]))
}

/// The object id of the queue lock: the low 32 bits of the queue id. Queues 2^32 apart
/// share a lock, which only makes one wait for the other's `delete_queue`.
pub fn queue_key(queue_id: i64) -> u32 {
    queue_id as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn group_keys_are_stable_and_spread() {
        assert_eq!(group_key(1, "g"), group_key(1, "g"));
        assert_ne!(group_key(1, "g"), group_key(2, "g"));
        assert_ne!(group_key(1, "g"), group_key(1, "h"));
        // Names that differ only where a naive hash (sum, xor) would collide.
        assert_ne!(group_key(1, "ab"), group_key(1, "ba"));
        let keys: HashSet<_> = (0..20_000).map(|i| group_key(7, &format!("group-{i}"))).collect();
        assert_eq!(keys.len(), 20_000);
    }

    #[test]
    fn load_keys_are_stable_and_spread() {
        let pid = [7u8; 16];
        assert_eq!(load_key(&[&pid]), load_key(&[&pid]));
        assert_ne!(load_key(&[&pid]), load_key(&[&pid, b"g"]));
        // The parts are delimited: moving a byte from one part to the next is another key.
        assert_ne!(load_key(&[b"ab", b"c"]), load_key(&[b"a", b"bc"]));
        let keys: HashSet<_> = (0..20_000u32).map(|i| load_key(&[&pid, format!("g{i}").as_bytes()])).collect();
        assert_eq!(keys.len(), 20_000);
    }

    #[test]
    fn queue_keys_are_the_low_bits() {
        assert_eq!(queue_key(5), 5);
        assert_eq!(queue_key((1 << 32) + 5), 5);
    }
}
