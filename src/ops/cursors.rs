//! Moving a consumer group's cursors, lane by lane: the locking and the move that
//! `seek`, `purge` and a skip group's overflow (`overflow`) share. A lane is locked in the
//! registry when it is enabled (its row carries nothing live then), else its row is locked.

use pgrx::spi::SpiClient;
use queen_core::lanes::State;

use crate::pg::clock::{clock_now, timestamptz};
use crate::pg::errors::SpiExt;
use crate::pg::spi::run;

/// One lane of the group, locked by this transaction.
pub struct Lane {
    pub partition_id: pgrx::Uuid,
    pub partition: String,
    pub retained_through: i64,
    /// The cursor and whether a live lease holds the lane.
    pub committed: i64,
    pub leased: bool,
    /// With the lane registry: its state.
    pub registry: Option<State>,
}

/// Which of a group's lanes `lock_lanes` locks.
#[derive(Clone, Copy)]
pub enum Which<'a> {
    All,
    /// The lane of the partition of this name.
    Named(&'a str),
    /// The lanes of these partitions (those that still exist).
    Ids(&'a [pgrx::Uuid]),
}

/// How `lock_lanes` meets a lane another transaction holds (a pop or an ack in flight).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    /// Waits for it (`seek`, `purge`, `drop_group`).
    Wait,
    /// Leaves it out (the maintenance worker's skip pass: a long-poll may hold a lane for
    /// minutes).
    Skip,
}

const LANES: &str = "SELECT l.partition_id, p.name, p.retained_through, l.committed, false
       FROM queen.lanes l JOIN queen.partitions p ON p.partition_id = l.partition_id
      WHERE l.queue_id = $1 AND l.consumer_group = $2 AND ($3::text IS NULL OR p.name = $3)
        AND $4::timestamptz IS NOT NULL AND ($5::uuid[] IS NULL OR l.partition_id = ANY($5))
      ORDER BY l.partition_id";

/// Without the registry: the lane rows, locked.
macro_rules! lane_rows {
    ($lock:literal) => {
        concat!(
            "SELECT l.partition_id, p.name, p.retained_through, l.committed, coalesce(",
            queen_core::lease_live_sql!("l", "$4"),
            ", false)
               FROM queen.lanes l JOIN queen.partitions p ON p.partition_id = l.partition_id
              WHERE l.queue_id = $1 AND l.consumer_group = $2 AND ($3::text IS NULL OR p.name = $3)
                AND ($5::uuid[] IS NULL OR l.partition_id = ANY($5))
              ORDER BY l.partition_id
                FOR UPDATE OF l",
            $lock
        )
    };
}

/// The group's lanes (`which`), locked in partition order. With the registry the lanes are
/// locked there (the rows carry nothing live, and locking them could wait for the worker's
/// journal rotation, which waits for us); without it, the rows are the lanes.
pub fn lock_lanes(client: &mut SpiClient<'_>, queue_id: i64, group: &str, which: Which<'_>, busy: Busy) -> Vec<Lane> {
    // (Its callers with `Busy::Wait` saved the journal right after the queue lock, so this
    // does not wait here; a skip group's overflow step skips.)
    if !crate::lane::settle_journal(client, matches!(busy, Busy::Wait)) {
        return Vec::new();
    }
    let registry = crate::lane::registry::enabled();
    let now = clock_now();
    let (partition, ids) = match which {
        Which::All => (None, None),
        Which::Named(p) => (Some(p), None),
        Which::Ids(ids) => (None, Some(ids.to_vec())),
    };
    let args = [queue_id.into(), group.into(), partition.into(), timestamptz(now).into(), ids.into()];
    let sql = match (registry, busy) {
        (true, _) => LANES,
        (false, Busy::Wait) => lane_rows!(""),
        (false, Busy::Skip) => lane_rows!(" SKIP LOCKED"),
    };
    let rows: Vec<Lane> = run(client, sql, &args)
        .map(|r| Lane {
            partition_id: r.get::<pgrx::Uuid>(1).or_raise().unwrap(),
            partition: r.get::<String>(2).or_raise().unwrap(),
            retained_through: r.get::<i64>(3).or_raise().unwrap(),
            committed: r.get::<i64>(4).or_raise().unwrap(),
            leased: r.get::<bool>(5).or_raise().unwrap(),
            registry: None,
        })
        .collect();
    if !registry {
        return rows;
    }
    rows.into_iter()
        .filter_map(|lane| {
            // None: the lane went away while this waited (its group was dropped), or, with
            // `Busy::Skip`, another transaction holds it.
            let s = crate::lane::registry::lock(lane.partition_id, group, busy == Busy::Wait)?;
            Some(Lane { committed: s.committed, leased: s.live_lease(now), registry: Some(s), ..lane })
        })
        .collect()
}

/// Sets a locked lane's cursor to `to` (`queen_core::lane::seek`: the lease, if any, ends
/// and the retry count restarts): in the registry, with its journal entry added to
/// `journal`, or in the lane row.
pub fn move_cursor(client: &mut SpiClient<'_>, l: &Lane, group: &str, to: i64, journal: &mut Vec<(pgrx::Uuid, State)>) {
    if let Some(s) = l.registry {
        let new = queen_core::lane::seek(&queen_core::lane::Lane::from_registry(&s), to).to_registry(&s);
        crate::lane::registry::set(l.partition_id, group, new, None);
        if new.journal_seq != s.journal_seq {
            journal.push((l.partition_id, new));
        }
    } else {
        crate::lane::rows::seek(client, l.partition_id, group, to);
    }
}
