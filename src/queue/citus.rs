//! queen on Citus: the routing guard.
//!
//! `queen.distribute()` (sql/api.sql), run on a Citus coordinator, distributes one small
//! table, `queen_citus.queue_homes`, by queue name, and makes every queen function whose
//! first argument is a queue a distributed function colocated with it. Citus then sends a
//! call such as `SELECT * FROM queen.pop('orders', 'g')` to the worker that holds the
//! shard for `'orders'`: that worker is the queue's home. queen's own tables stay local on
//! every node, so a queue lives whole on its home, with that node's shared memory, long-poll
//! wake-ups and background worker (see `docs/citus.md`).
//!
//! A call Citus does not delegate (a shape it does not push down, a volatile argument, a
//! call made straight to the wrong node) would run against the receiving node's tables and
//! shared memory: another queue of the same name. `ensure_home` refuses it.
//!
//! Calls that name no queue (`ack`, `extend_lease`, `may_start` by lease id; `dlq_replay`,
//! `dlq_delete` by partition id) are routed by that id through a second routing table,
//! `queen_citus.id_routes`, distributed by uuid. A worker mints lease and partition ids that
//! hash into a shard it holds (`routed_id`, rule in `queen_core::routing`), so Citus sends
//! their calls back to it; `ensure_id_home` refuses one that arrives elsewhere.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::pg::clock::clock_now;
use crate::pg::errors;
use crate::pg::spi::{first_row_now, with_pinned_search_path};

/// How long a backend trusts what it found out about a queue's home (microseconds). A
/// queue's home changes only when its shard moves, which needs queen stopped for that queue
/// (docs/citus.md).
const CACHE_MICROS: i64 = 5_000_000;

/// Inclusive hash ranges of the id-routing shards a node holds.
type Ranges = Rc<Vec<(i32, i32)>>;

thread_local! {
    /// queue name -> (home group, this node's group, when looked up)
    static HOMES: RefCell<HashMap<String, (i32, i32, i64)>> = RefCell::new(HashMap::new());
    /// The hash ranges of the id-routing shards this node holds (None: ids are not routed
    /// here), and when they were looked up.
    static ID_RANGES: RefCell<Option<(Option<Ranges>, i64)>> = const { RefCell::new(None) };
}

/// Whether `queen.distribute()` ran in this database: the routing schema exists (one
/// syscache lookup; nothing else is asked of a database that is not distributed).
fn distributed() -> bool {
    crate::pg::catalog::schema_exists(c"queen_citus")
}

/// The Citus node group that is `queue`'s home, and this node's group, once the database is
/// distributed (None otherwise). Cached per backend for `CACHE_MICROS`.
fn home_of(queue: &str) -> Option<(i32, i32)> {
    if !distributed() {
        return None;
    }
    let now = clock_now();
    let cached =
        HOMES.with(|h| h.borrow().get(queue).copied()).filter(|&(_, _, at)| (0..CACHE_MICROS).contains(&(now - at)));
    if let Some((home, here, _)) = cached {
        return Some((home, here));
    }
    let found = with_pinned_search_path(|| {
        Spi::connect_mut(|client| {
            first_row_now(
                client,
                "SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
                                          WHERE logicalrelid = pg_catalog.to_regclass('queen_citus.queue_homes'))
                             THEN coalesce(
                                    -- here, if a placement is here (more than one with replication)
                                    (SELECT pl.groupid FROM pg_catalog.pg_dist_placement pl
                                      WHERE pl.shardid = pg_catalog.get_shard_id_for_distribution_column(
                                                           'queen_citus.queue_homes', $1::text)
                                        AND pl.groupid = (SELECT groupid FROM pg_catalog.pg_dist_local_group)),
                                    (SELECT min(pl.groupid) FROM pg_catalog.pg_dist_placement pl
                                      WHERE pl.shardid = pg_catalog.get_shard_id_for_distribution_column(
                                                           'queen_citus.queue_homes', $1::text)))
                        END,
                        (SELECT groupid FROM pg_catalog.pg_dist_local_group)",
                &[queue.into()],
                |row| (row.get::<i32>(1), row.get::<i32>(2)),
            )
        })
    });
    // The routing table is not distributed (yet): nothing to route or guard.
    let (Some(home), Some(here)) = found.unwrap_or((None, None)) else { return None };
    HOMES.with(|h| {
        let mut h = h.borrow_mut();
        if h.len() >= 4096 {
            h.clear();
        }
        h.insert(queue.to_string(), (home, here, now));
    });
    Some((home, here))
}

/// Refuses (55000) a call about `queue` on a node that is not the queue's home, once the
/// database is distributed. A no-op anywhere else.
pub fn ensure_home(queue: &str) {
    let Some((home, here)) = home_of(queue) else { return };
    if home != here {
        errors::raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "queen: queue {queue:?} lives on Citus node group {home}, not on this node (group {here}): the call \
                 was not routed to it. Call queen through the coordinator as SELECT queen.f('{queue}', ...) or \
                 SELECT ... FROM queen.f('{queue}', ...), with the queue as a constant (docs/citus.md)"
            ),
        );
    }
}

/// The hash ranges of the `queen_citus.id_routes` shards placed on this node, once the
/// database is distributed with id routes; None otherwise (ids are then not routed).
fn id_ranges() -> Option<Ranges> {
    if !distributed() {
        return None;
    }
    let now = clock_now();
    if let Some((ranges, _)) =
        ID_RANGES.with(|r| r.borrow().clone()).filter(|&(_, at)| (0..CACHE_MICROS).contains(&(now - at)))
    {
        return ranges;
    }
    let found = with_pinned_search_path(|| {
        Spi::connect_mut(|client| {
            first_row_now(
                client,
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
                                 WHERE logicalrelid = pg_catalog.to_regclass('queen_citus.id_routes')),
                        array_agg(s.shardminvalue::int4 ORDER BY s.shardid),
                        array_agg(s.shardmaxvalue::int4 ORDER BY s.shardid)
                   FROM pg_catalog.pg_dist_shard s
                  WHERE s.logicalrelid = pg_catalog.to_regclass('queen_citus.id_routes')
                    AND EXISTS (SELECT 1 FROM pg_catalog.pg_dist_placement pl
                                 WHERE pl.shardid = s.shardid
                                   AND pl.groupid = (SELECT groupid FROM pg_catalog.pg_dist_local_group))",
                &[],
                |row| (row.get::<bool>(1), row.get::<Vec<i32>>(2), row.get::<Vec<i32>>(3)),
            )
        })
    });
    let ranges = match found {
        Some((Some(true), mins, maxs)) => {
            let (mins, maxs) = (mins.unwrap_or_default(), maxs.unwrap_or_default());
            Some(Rc::new(mins.into_iter().zip(maxs).collect::<Vec<_>>()))
        }
        _ => None,
    };
    ID_RANGES.with(|r| *r.borrow_mut() = Some((ranges.clone(), now)));
    ranges
}

/// PostgreSQL's hash of a uuid, which Citus uses to place a uuid distribution column.
fn id_hash(id: &[u8; 16]) -> i32 {
    // SAFETY: uuid_hash reads its one non-null uuid argument and returns an int4 datum.
    unsafe {
        pgrx::direct_function_call::<i32>(pg_sys::uuid_hash, &[pgrx::Uuid::from_bytes(*id).into_datum()])
            .expect("uuid_hash returns a value")
    }
}

/// An id for a lease or a partition made on this node: `draw` itself where ids are not
/// routed, else the first draw whose hash routes to this node (`queen_core::routing`).
pub fn routed_id(mut draw: impl FnMut() -> uuid::Uuid) -> uuid::Uuid {
    match id_ranges() {
        None => draw(),
        Some(ranges) => {
            let (id, _) = queen_core::routing::mint(&ranges, || *draw().as_bytes(), id_hash);
            uuid::Uuid::from_bytes(id)
        }
    }
}

/// Refuses (55000) a call about a lease or partition `id` on a node its route does not
/// lead to, once ids are routed. A no-op anywhere else.
pub fn ensure_id_home(what: &str, id: &pgrx::Uuid) {
    let Some(ranges) = id_ranges() else { return };
    if !queen_core::routing::routes_here(&ranges, id_hash(id.as_bytes())) {
        errors::raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "queen: {what} {id} was issued by another Citus node: the call was not routed to it. Call queen \
                 through the coordinator as SELECT queen.f('{id}', ...), with the id as a constant or a parameter \
                 (docs/citus.md)"
            ),
        );
    }
}

/// The routing guard asked again right after a queue's row was created on this node.
/// A creation that waited for `queen.distribute()`'s SHARE lock on `queen.queues` must
/// not leave a queue here once the routing it committed names another home: under READ
/// COMMITTED `home_of` reads that routing now and `ensure_home` refuses. When the
/// database is distributed (the routing schema, which the catalog shows as committed) but
/// this transaction's snapshot does not see the routing table distributed (REPEATABLE
/// READ or SERIALIZABLE from before `distribute()`, or a node without Citus's metadata),
/// the home cannot be known: refused too, rather than created where it may be stranded.
pub fn recheck_created(queue: &str) {
    if distributed() && home_of(queue).is_none() {
        if errors::fixed_snapshot() {
            errors::serialization_failure(&format!(
                "queue {queue:?} is created after queen.distribute() committed, which this transaction's snapshot \
                 does not show"
            ));
        }
        errors::raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "queen: queue {queue:?} cannot be created on this node: the database is distributed, but this node \
                 has no routing for it (Citus's metadata); call queen through the coordinator (docs/citus.md)"
            ),
        );
    }
    ensure_home(queue);
}

/// Whether `queue`'s home is another node of a distributed database (false anywhere
/// else).
pub fn lives_elsewhere(queue: &str) -> bool {
    home_of(queue).is_some_and(|(home, here)| home != here)
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._ensure_home(text) IS
  'queen internal: on Citus, refuse (55000) a call about a queue on a node that is not its home (status, totals, dlq, delete_queue); not granted';
"#,
    name = "ensure_home_sql_home",
    requires = [ensure_home_sql]
);

/// `queen._ensure_home(queue)`: the routing guard (`ensure_home`) for queen's SQL functions
/// that name a queue but that Citus does not route (their queue argument has a default, or
/// they are not distributed): `status`, `totals`, `dlq` and `delete_queue`. Not granted.
#[pg_extern(name = "_ensure_home", volatile, parallel_unsafe)]
fn ensure_home_sql(queue: &str) {
    ensure_home(queue)
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._lives_elsewhere(text) IS
  'queen internal: on Citus, whether a queue''s home is another node (status, totals, dlq forward there); not granted';
"#,
    name = "lives_elsewhere_sql_home",
    requires = [lives_elsewhere_sql]
);

/// `queen._lives_elsewhere(queue)`: true on a distributed database when the queue's home is
/// another node. `status`, `totals` and `dlq` then forward the call to the home through
/// their distributed `_…_at_home` forms (sql/api.sql). Not granted.
#[pg_extern(name = "_lives_elsewhere", volatile, parallel_unsafe)]
fn lives_elsewhere_sql(queue: &str) -> bool {
    lives_elsewhere(queue)
}
