//! A pop's scan of its group's lanes (with the lane registry): the lanes it may claim now,
//! in partition-id order, a chunk at a time (`ops::pop`'s `LaneScan` calls this).
//!
//! The lanes of the group are read in the order of the index `lanes_queue_group`; each lane
//! is asked of the registry (`registry::claimable`, also `queen._claimable`), and a lane it
//! may claim gets its partition's row (its name). Both the lanes and the partition rows are
//! read by direct index scans (`pg::scan`), not an SQL statement: on a live queue, where a
//! pop takes one to three messages, the statement's executor was a large share of a pop.
//! The statement stays for tables that are not as this library knows them (a schema older
//! or newer than it), and the in-server tests check that both find the same lanes.

use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::lane::registry;
use crate::pg::catalog::queen_table;
use crate::pg::errors::SpiExt;
use crate::pg::scan::{Key, Scan, StatementSnapshot, Table};
use crate::pg::spi::run;

/// A lane a pop may claim now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimable {
    pub partition_id: pgrx::Uuid,
    /// The partition's name.
    pub partition: String,
    /// The partition's readable end (`offsets::readable`).
    pub readable: i64,
}

/// The tables a pop's scan of its lanes reads directly, carried from chunk to chunk: opened
/// (and locked) at the scan's first chunk and kept open for its next ones, which then cost
/// no relation opens.
pub enum Tables {
    /// No chunk read yet.
    Unopened,
    Open(LaneTables),
    /// Not as this library knows them: every chunk is read by the statement.
    Unfit,
}

impl Tables {
    /// The open tables, opened on the first call; None when they are unfit.
    fn get(&mut self) -> Option<&LaneTables> {
        if let Tables::Unopened = self {
            *self = LaneTables::open().map_or(Tables::Unfit, Tables::Open);
        }
        match self {
            Tables::Open(tables) => Some(tables),
            Tables::Unopened | Tables::Unfit => None,
        }
    }
}

/// The lanes table (with the index `lanes_queue_group`) and the partitions table (with
/// its primary key), open, and where the scan's columns are.
pub struct LaneTables {
    lanes: Table,
    partitions: Table,
    lane_partition: i16,
    name: i16,
}

impl LaneTables {
    /// None when the tables are not as this library knows them (nothing is read).
    pub fn open() -> Option<LaneTables> {
        let lanes = Table::open(
            queen_table(c"lanes"),
            Some(queen_table(c"lanes_queue_group")),
            &[(c"queue_id", pg_sys::INT8OID), (c"consumer_group", pg_sys::TEXTOID), (c"partition_id", pg_sys::UUIDOID)],
        )?;
        let partitions = Table::open(queen_table(c"partitions"), None, &[(c"partition_id", pg_sys::UUIDOID)])?;
        let (lane_partition, name) =
            (lanes.column(c"partition_id", pg_sys::UUIDOID)?, partitions.column(c"name", pg_sys::TEXTOID)?);
        Some(LaneTables { lanes, partitions, lane_partition, name })
    }
}

/// The lanes of `group` of queue `queue_id` that a pop may claim now, in partition-id
/// order within `(lower, upper]`, at most `limit`, read through `tables` (the scan's,
/// from chunk to chunk).
pub fn claimable_lanes(
    client: &mut SpiClient<'_>,
    tables: &mut Tables,
    queue_id: i64,
    group: &str,
    bounds: (pgrx::Uuid, pgrx::Uuid),
    limit: i64,
) -> Vec<Claimable> {
    match tables.get() {
        Some(tables) => direct(tables, queue_id, group, bounds, limit),
        None => by_statement(client, queue_id, group, bounds, limit),
    }
}

/// `claimable_lanes` by direct index scans of the open tables.
pub(crate) fn direct(
    tables: &LaneTables,
    queue_id: i64,
    group: &str,
    (lower, upper): (pgrx::Uuid, pgrx::Uuid),
    limit: i64,
) -> Vec<Claimable> {
    let LaneTables { lanes, partitions, lane_partition, name } = tables;
    let snapshot = StatementSnapshot::take();
    let eq = pg_sys::BTEqualStrategyNumber;
    let mut scan = lanes.scan(
        &snapshot,
        &[
            Key::new(1, eq, pg_sys::F_INT8EQ, pg_sys::Datum::from(queue_id)),
            Key::new(2, eq, pg_sys::F_TEXTEQ, group.into_datum().unwrap()),
            Key::new(3, pg_sys::BTGreaterStrategyNumber, pg_sys::F_UUID_GT, lower.into_datum().unwrap()),
            Key::new(3, pg_sys::BTLessEqualStrategyNumber, pg_sys::F_UUID_LE, upper.into_datum().unwrap()),
        ],
        false,
    );
    let by_id = |pid: pgrx::Uuid| [Key::new(1, eq, pg_sys::F_UUID_EQ, pid.into_datum().unwrap())];
    // One scan of the partitions' primary key, started again for each claimable lane.
    let mut partition: Option<Scan<'_>> = None;
    let mut out = Vec::new();
    while (out.len() as i64) < limit {
        let Some(lane) = scan.next() else { break };
        // SAFETY: a non-null datum of a uuid column (the lane's key).
        let Some(pid) = lane.get(*lane_partition).and_then(|d| unsafe { pgrx::Uuid::from_datum(d, false) }) else {
            continue;
        };
        // The registry first: on a live queue most lanes a scan passes have nothing to
        // claim, and they need no probe of their partition's row.
        let Some(readable) = registry::claimable(pid, group) else { continue };
        let p = match &mut partition {
            Some(p) => {
                p.rescan(&by_id(pid));
                p
            }
            None => partition.insert(partitions.scan(&snapshot, &by_id(pid), false)),
        };
        // A lane whose partition row is gone (being deleted) is not one to claim: the
        // statement's join leaves it out too.
        let Some(row) = p.next() else { continue };
        // SAFETY: a non-null datum of a text column; `from_datum` copies it into a String.
        let Some(partition) = row.get(*name).and_then(|d| unsafe { String::from_datum(d, false) }) else {
            continue;
        };
        out.push(Claimable { partition_id: pid, partition, readable });
    }
    out
}

/// `claimable_lanes` by one SQL statement (the tables are not as this library knows them).
pub(crate) fn by_statement(
    client: &mut SpiClient<'_>,
    queue_id: i64,
    group: &str,
    (lower, upper): (pgrx::Uuid, pgrx::Uuid),
    limit: i64,
) -> Vec<Claimable> {
    run(
        client,
        "SELECT l.partition_id, p.name, r.readable
           FROM queen.lanes l
           JOIN queen.partitions p ON p.partition_id = l.partition_id
          CROSS JOIN LATERAL (SELECT queen._claimable(l.partition_id, $2, p.head) AS readable) r
          WHERE l.queue_id = $1 AND l.consumer_group = $2
            AND l.partition_id > $4 AND l.partition_id <= $5
            AND r.readable IS NOT NULL
          ORDER BY l.partition_id
          LIMIT $3",
        &[queue_id.into(), group.into(), limit.into(), lower.into(), upper.into()],
    )
    .map(|r| Claimable {
        partition_id: r.get(1).or_raise().unwrap(),
        partition: r.get(2).or_raise().unwrap(),
        readable: r.get(3).or_raise().unwrap(),
    })
    .collect()
}
