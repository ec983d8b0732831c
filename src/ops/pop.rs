//! Pop (docs/functions.md#pop): claim lanes, read from `committed + 1`, lease the span — one call.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use queen_core::addresses::SpanKind;
use queen_core::claim::{covered, fill};
use queen_core::lane::Lane;
use queen_core::lanes::State as LaneState;
use queen_core::policy::{self, effective_lease_micros, PopLimits, Subscription};

use crate::lane::claimable::{claimable_lanes, Tables};
use crate::lane::rows::Claims;
use crate::pg::clock::{clock_now, timestamptz};
use crate::pg::errors::{self, SpiExt};
use crate::pg::ids::to_pg_uuid;
use crate::pg::spi::run;
use crate::pg::srf::{arg, function_info_v1, ResultRows};
use crate::queue::names::{check_lane_name, check_queue_name};
use crate::{offsets, pg::durability, pg::wake, queue::lookup, storage::segments};
use queen_core::segment::Frame;

/// Validated arguments of one pop.
pub struct PopArgs<'a> {
    pub queue: &'a str,
    pub group: &'a str,
    pub batch: i32,
    pub partition: Option<&'a str>,
    pub lease_seconds: i32,
    pub auto_ack: bool,
    pub wait_ms: i32,
    pub max_partitions: i32,
    pub subscription: &'a str,
    /// The byte budget: payload bytes past it wait for the next pop, except the first
    /// message, which always comes.
    pub max_bytes: i64,
}

/// A lane this pop locked, before it knows how many messages it takes.
struct Candidate {
    partition_id: pgrx::Uuid,
    partition: String,
    committed: i64,
    /// The partition's readable end (`offsets`), read after the lock: the pop reads up to it.
    readable: i64,
    /// Offsets in (committed, readable]: messages, and gaps that aborted pushes left.
    available: i64,
    claim_start: Option<i64>,
    attempt_count: i32,
    old_lease: Option<pgrx::Uuid>,
    /// With the lane registry: the lane's state, locked by this transaction.
    registry: Option<LaneState>,
}

pub struct Delivered {
    pub lease_id: Option<pgrx::Uuid>,
    pub lease_expires_at: Option<i64>,
    pub partition_id: pgrx::Uuid,
    pub partition: String,
    pub msg_offset: i64,
    pub message_id: pgrx::Uuid,
    pub transaction_id: String,
    pub payload: Vec<u8>,
    pub created_at: TimestampWithTimeZone,
    pub attempt: i32,
    /// The headers object as jsonb bytes, opened; None: the message has none.
    pub headers: Option<Vec<u8>>,
}

impl Delivered {
    /// A stored message as a row, unclaimed (no lease, attempt 0): its offset, frame and
    /// push time, with its payload and headers opened (`encryption::open_frame`).
    pub fn new(
        partition_id: pgrx::Uuid,
        partition: String,
        msg_offset: i64,
        f: &Frame<'_>,
        created_at: TimestampWithTimeZone,
        (payload, headers): (Vec<u8>, Option<Vec<u8>>),
    ) -> Delivered {
        Delivered {
            lease_id: None,
            lease_expires_at: None,
            partition_id,
            partition,
            msg_offset,
            message_id: pgrx::Uuid::from_bytes(f.message_id),
            transaction_id: f.transaction_id.to_string(),
            payload,
            created_at,
            attempt: 0,
            headers,
        }
    }
}

extension_sql!(
    r#"
CREATE FUNCTION queen.pop(
    queue text,
    consumer_group text DEFAULT '__QUEUE_MODE__',
    batch int DEFAULT 1,
    partition text DEFAULT NULL,
    lease_seconds int DEFAULT 0,
    auto_ack bool DEFAULT false,
    wait_ms int DEFAULT 0,
    max_partitions int DEFAULT 1,
    subscription text DEFAULT 'all',
    max_bytes bigint DEFAULT 33554432
) RETURNS SETOF queen.message
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'pop_wrapper';
COMMENT ON FUNCTION queen.pop(text, text, int, text, int, bool, int, int, text, bigint) IS
  'queen: claim up to batch messages (and max_bytes of payload) under one lease (or auto_ack); returns queen.message rows';
"#,
    name = "pop"
);

function_info_v1!(pg_finfo_pop_wrapper);

/// `queen.pop(...)`: its rows, `queen.message`, all at once (`srf`). It pins its search
/// path and its two planner settings itself (`spi::with_queen_plan_settings`): no `SET`
/// clause, whose cost on every call was a tenth of a small pop's.
///
/// # Safety
/// Called by PostgreSQL only, as the function declared above.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn pop_wrapper(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: this call's fcinfo, of a function returning SETOF queen.message.
    let mut out = unsafe { ResultRows::<12>::begin(fcinfo, "queen.message") };
    // SAFETY: the arguments' SQL types are those of the declaration above.
    let args = unsafe {
        PopArgs {
            queue: arg::<&str>(fcinfo, 0).unwrap_or_else(|| errors::null_arg("queue")),
            group: arg::<&str>(fcinfo, 1).unwrap_or_else(|| errors::null_arg("consumer_group")),
            batch: arg::<i32>(fcinfo, 2).unwrap_or_else(|| errors::null_arg("batch")),
            partition: arg::<&str>(fcinfo, 3),
            lease_seconds: arg::<i32>(fcinfo, 4).unwrap_or(0),
            auto_ack: arg::<bool>(fcinfo, 5).unwrap_or(false),
            wait_ms: arg::<i32>(fcinfo, 6).unwrap_or(0),
            max_partitions: arg::<i32>(fcinfo, 7).unwrap_or(1),
            subscription: arg::<&str>(fcinfo, 8).unwrap_or(policy::Subscription::DEFAULT.as_str()),
            max_bytes: arg::<i64>(fcinfo, 9).unwrap_or_else(|| errors::null_arg("max_bytes")),
        }
    };
    let rows = crate::pg::spi::with_queen_plan_settings(|| {
        validate(&args);
        lookup::CREATED_HERE.with(|c| c.set(false));
        PASSED_HERE.with(|c| c.set(false));
        CURSOR_PASSED.with(|c| c.set(false));
        let first_writer = durability::pop_start(args.auto_ack);
        let rows = if args.wait_ms > 0 { pop_waiting(&args) } else { pop(&args) };
        // A pop that created its group, filed dead letters or moved a cursor past what it
        // could not deliver keeps the configured durability, as an ack does.
        let durable = lookup::CREATED_HERE.with(|c| c.get()) || PASSED_HERE.with(|c| c.get());
        durability::pop_done(first_writer, durable);
        lookup::CREATED_HERE.with(|c| c.set(false));
        rows
    });
    put_rows(&mut out, rows, Some(args.group), false);
    out.finish()
}

/// Stores delivered messages as `queen.message` rows: `group` in `consumer_group`, and,
/// for a read without a claim (`peeked`: peek, get), no attempt count (NULL).
pub fn put_rows(out: &mut ResultRows<12>, rows: Vec<Delivered>, group: Option<&str>, peeked: bool) {
    for d in rows {
        out.put(|| {
            let nulls = [
                d.lease_id.is_none(),
                d.lease_expires_at.is_none(),
                false,
                false,
                group.is_none(),
                false,
                false,
                false,
                false,
                false,
                peeked,
                d.headers.is_none(),
            ];
            let zero = pg_sys::Datum::from(0);
            (
                [
                    d.lease_id.and_then(IntoDatum::into_datum).unwrap_or(zero),
                    d.lease_expires_at.map_or(zero, pg_sys::Datum::from),
                    d.partition_id.into_datum().unwrap(),
                    d.partition.into_datum().unwrap(),
                    group.and_then(IntoDatum::into_datum).unwrap_or(zero),
                    pg_sys::Datum::from(d.msg_offset),
                    d.message_id.into_datum().unwrap(),
                    d.transaction_id.into_datum().unwrap(),
                    crate::pg::jsonb::jsonb_datum(&d.payload),
                    d.created_at.into_datum().unwrap(),
                    pg_sys::Datum::from(d.attempt),
                    d.headers.as_deref().map_or(zero, crate::pg::jsonb::jsonb_datum),
                ],
                nulls,
            )
        });
    }
}

crate::pg::srf::older_sql_symbol!(
    pg_finfo_pop_sql_wrapper,
    pop_sql_wrapper,
    "The C symbol of `queen._pop`, the body of `queen.pop` up to 0.2.0 (`CREATE EXTENSION queen VERSION '0.2.0'` still finds it)."
);

fn validate(a: &PopArgs) {
    errors::refuse_read_only("pop", "claims messages");
    check_queue_name("queue", a.queue);
    crate::queue::citus::ensure_home(a.queue);
    crate::queue::privileges::require(Some(a.queue), crate::queue::privileges::Privilege::Consume);
    check_lane_name("consumer_group", a.group);
    if let Some(p) = a.partition {
        check_lane_name("partition", p);
    }
    let limits = PopLimits {
        batch: a.batch,
        lease_seconds: a.lease_seconds,
        max_lease: crate::pg::settings::max_lease(),
        wait_ms: a.wait_ms,
        max_partitions: a.max_partitions,
        max_bytes: a.max_bytes,
    };
    if let Err(v) = limits.validate().and(Subscription::parse(a.subscription).map(|_| ())) {
        errors::violation(v);
    }
}

/// Long-poll: retries the claim whenever a push commits or a lane is released on this
/// queue (see `wake`), or a retry backoff it met ends, until messages come or `wait_ms`
/// passes.
fn pop_waiting(a: &PopArgs) -> Vec<Delivered> {
    errors::read_committed_only("pop with wait_ms > 0", "the transaction's snapshot would never see a new message");
    let deadline = clock_now().saturating_add(i64::from(a.wait_ms) * 1000);
    loop {
        wake::prepare(a.queue);
        wake::take_due();
        let rows = pop(a);
        let now = clock_now();
        // A pop that passed a cursor over messages it may not deliver (expired, unreadable,
        // redriven to another group) holds those lanes until its transaction ends: it
        // returns now, empty, so that the next pop reads on past them.
        // One that saved the lane journal (`rows::settle_journal`, once after a crash and a
        // restart without preloading) returns too: other sessions' pops wait for its lock.
        if !rows.is_empty()
            || deadline <= now
            || CURSOR_PASSED.with(|c| c.get())
            || crate::lane::rows::saved_journal_here()
        {
            wake::cancel();
            return rows;
        }
        // Rounded up: a pop never returns empty before its wait is over.
        let left_ms = (deadline - now + 999) / 1000;
        // A retry backoff that ends before the deadline: nobody signals it, so wake then.
        let due_ms = wake::take_due().map_or(left_ms, |t| ((t - now + 999) / 1000).max(1));
        wake::sleep(a.queue, left_ms.min(due_ms));
    }
}

thread_local! {
    /// Set when a pop filed a dead letter or moved a cursor past messages it passed over
    /// (`file_poison`): its commit must be durable (`durability::pop_done`).
    static PASSED_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Set when a claim round moved a lane's cursor past messages it passed over and
    /// delivered nothing there: a waiting pop returns instead of sleeping.
    static CURSOR_PASSED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Set when `read_span` stopped at a message that is not due yet.
    static NOT_DUE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Set when a claim round read every claimable lane of the group (fewer than
    /// `max_partitions`): a further round would read the same ones.
    static SCANNED_ALL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Most claim rounds of one pop whose lanes held only messages not due yet: each round
/// scans the next lanes of the group (round-robin), so that due messages behind them are
/// found without waiting.
const DUE_ROUNDS: usize = 8;

/// One claim attempt: returns the delivered messages, possibly none.
pub fn pop(a: &PopArgs) -> Vec<Delivered> {
    Spi::connect_mut(|client| {
        for _ in 0..if a.partition.is_some() { 1 } else { DUE_ROUNDS } {
            NOT_DUE.with(|n| n.set(false));
            SCANNED_ALL.with(|n| n.set(false));
            let rows = pop_in(client, a);
            // Another round scans the next lanes; none when this one read all there are.
            if !rows.is_empty() || !NOT_DUE.with(|n| n.get()) || SCANNED_ALL.with(|n| n.get()) {
                return rows;
            }
        }
        Vec::new()
    })
}

/// What a pop needs of its queue and group.
#[derive(Clone, Copy)]
struct GroupInfo {
    queue_id: i64,
    lease_time: Option<i32>,
    has_group: bool,
    /// The queue lets a pop create a group (`configure(create_groups)`).
    create_groups: bool,
    /// The group's lease budget (microseconds), when it has one.
    budget_micros: Option<i64>,
    delay: i64,
    /// When the queue's options last changed (`queues.updated_at`, microseconds): the ttl
    /// counts from no earlier (`queen_core::policy::expired`).
    configured_at: i64,
    /// The queue or the group is paused (`queen.pause`): the pop returns nothing.
    paused: bool,
    /// The queue's message ttl (microseconds, 0: none) and whether it keeps a DLQ, where
    /// expired messages go (else they are dropped).
    ttl: i64,
    dead_letter_queue: bool,
    /// The group has rate limits or concurrency caps (`queen.configure_limit`).
    limited: bool,
}

thread_local! {
    /// Per backend: (queue, group) -> its info (`cache::cached`), for groups that exist:
    /// a pop of one message reads no settings row while no queue or group changed.
    static GROUPS: crate::pg::cache::Settings<(String, String), GroupInfo> = Default::default();
    /// Per backend: (queue id, group) -> its limits, for groups that have some.
    static LIMITS: crate::pg::cache::Settings<(i64, String), std::rc::Rc<Vec<queen_core::limits::Limit>>> =
        Default::default();
}

/// A pop's gate through its group's limits (`lane::limits`), when it has some.
fn gate(client: &mut SpiClient<'_>, a: &PopArgs, info: &GroupInfo) -> Option<crate::lane::limits::Gate> {
    if !info.limited {
        return None;
    }
    let read = || Some(std::rc::Rc::new(crate::lane::limits::read_limits(client, info.queue_id, a.group)));
    let limits = crate::pg::cache::cached(&LIMITS, (info.queue_id, a.group.to_string()), read, |_| true)?;
    Some(crate::lane::limits::Gate::new(info.queue_id, a.group, limits, !a.auto_ack))
}

/// The queue's and group's settings; None for an unknown queue.
fn group_info(client: &mut SpiClient<'_>, queue: &str, group: &str) -> Option<GroupInfo> {
    let read = || {
        let row = run(
            client,
            concat!(
                "SELECT q.queue_id, q.lease_time, g.queue_id IS NOT NULL,
                    (extract(epoch FROM g.queue_margin + g.handler_timeout + g.timeout_grace
                                        + g.record_margin) * 1000000)::int8,
                    (extract(epoch FROM q.delay) * 1000000)::int8, q.create_groups, ",
                queen_core::paused_sql!("q", "g"),
                ", (extract(epoch FROM q.ttl) * 1000000)::int8, q.dead_letter_queue,
                EXISTS (SELECT 1 FROM queen.limits l WHERE l.queue_id = q.queue_id AND l.consumer_group = $2),
                q.updated_at
               FROM queen.queues q
               LEFT JOIN queen.groups g ON g.queue_id = q.queue_id AND g.consumer_group = $2
              WHERE q.name = $1"
            ),
            &[queue.into(), group.into()],
        )
        .next()?;
        Some(GroupInfo {
            queue_id: row.get(1).or_raise().unwrap(),
            lease_time: row.get(2).or_raise(),
            has_group: row.get(3).or_raise().unwrap(),
            budget_micros: row.get(4).or_raise(),
            delay: row.get(5).or_raise().unwrap_or(0),
            create_groups: row.get(6).or_raise().unwrap_or(true),
            paused: row.get(7).or_raise().unwrap_or(false),
            ttl: row.get(8).or_raise().unwrap_or(0),
            dead_letter_queue: row.get(9).or_raise().unwrap_or(true),
            limited: row.get(10).or_raise().unwrap_or(false),
            configured_at: row.get::<pgrx::datum::TimestampWithTimeZone>(11).or_raise().map_or(0, i64::from),
        })
    };
    // Kept once the group exists (a pop that finds none creates it, then reads again).
    crate::pg::cache::cached(&GROUPS, (queue.to_string(), group.to_string()), read, |i| i.has_group)
}

/// One pop, in named steps: admit it (the queue, its group, the queue lock), lock the lanes
/// it may claim, read their messages within the byte budget (`Reading`), then claim what
/// it delivered.
fn pop_in(client: &mut SpiClient<'_>, a: &PopArgs) -> Vec<Delivered> {
    let Some(info) = admit(client, a) else {
        return Vec::new();
    };
    // Not while another session saves the lane journal (without the registry, after a
    // crash: the rows are not yet right); nothing is claimed, as for a held lane.
    if !crate::lane::settle_journal(client, false) {
        return Vec::new();
    }
    let registry = crate::lane::registry::enabled();
    let now = clock_now();
    let mut gate = gate(client, a, &info);
    let mut scan = registry.then(|| LaneScan::new(a, info.queue_id, now, gate.take()));
    // Lanes a concurrent partition and group creation both missed are added here, at most
    // once a second per backend and group, busy or not: a missed partition waits at most
    // about a second after both creations committed, never for the group to go idle.
    lookup::repair_lanes(client, info.queue_id, a.group);
    let candidates = match &mut scan {
        Some(scan) => scan.lock_lanes(client, i64::from(a.batch)),
        None => {
            let found = claim_candidates(client, a, info.queue_id, now);
            admit_candidates(client, gate.as_mut(), found, i64::from(a.batch), now)
        }
    };
    if candidates.is_empty() {
        return Vec::new();
    }
    let lease_micros =
        effective_lease_micros(a.lease_seconds, info.budget_micros, info.lease_time, crate::pg::settings::max_lease());
    // (lease id, expiry), None for an auto-ack pop. A lease id is a credential (random bits
    // from the OS), routed back to this node on Citus.
    let lease = (!a.auto_ack).then(|| {
        let id = crate::queue::citus::routed_id(crate::pg::ids::new_secure_id);
        (to_pg_uuid(id), now.saturating_add(lease_micros))
    });
    let due = Due {
        delay: info.delay,
        configured_at: info.configured_at,
        ttl: info.ttl,
        file_expired: info.dead_letter_queue,
        now,
        group: a.group,
    };
    let mut reading = Reading::new(client, a, candidates, due, lease);
    while reading.next_lane(client, scan.as_mut()) {}
    let rows = reading.claim(client, a, info.queue_id, registry, now);
    // Tokens of messages not delivered go back; lanes not claimed leave the in-flight list.
    if let Some(gate) = scan.and_then(|s| s.gate).or(gate) {
        let mut delivered: std::collections::HashMap<[u8; 16], i64> = std::collections::HashMap::new();
        for d in &rows {
            *delivered.entry(*d.partition_id.as_bytes()).or_default() += 1;
        }
        gate.settle(client, |p| delivered.get(p).copied().unwrap_or(0));
    }
    rows
}

/// Without the lane registry: the locked lanes `claim_candidates` found, each taking what
/// the group's limits let it (`Gate::admit`) of what the batch still needs; a lane that
/// may take none is left out (its row lock ends with the transaction).
fn admit_candidates(
    client: &mut SpiClient<'_>,
    gate: Option<&mut crate::lane::limits::Gate>,
    found: Vec<Candidate>,
    batch: i64,
    now: i64,
) -> Vec<Candidate> {
    let Some(gate) = gate else {
        return found;
    };
    let mut covering = 0i64;
    let mut admitted = Vec::new();
    for mut c in found {
        if covered(batch, covering) {
            break;
        }
        c.available = gate.admit(client, c.partition_id, &c.partition, c.available.min(batch - covering), now);
        if c.available > 0 {
            covering += c.available;
            admitted.push(c);
        }
    }
    admitted
}

/// The queue's and group's settings for a pop, once the pop may go on: the queue exists,
/// its group exists or may be created (and now is), and the queue lock is held. None: the
/// pop returns zero rows (an unknown or deleted queue, or a group another session is
/// creating right now).
fn admit(client: &mut SpiClient<'_>, a: &PopArgs) -> Option<GroupInfo> {
    // Between a restart on this library and `ALTER EXTENSION queen UPDATE`, the schema lacks
    // the columns a pop reads (0.4.0's flow control): a clean 55000, not a missing column.
    if !crate::pg::catalog::queen_column(c"queues", c"paused") {
        errors::older_sql();
    }
    let info = group_info(client, a.queue, a.group)?;
    // Checked again on the queue found, by id (privileges, module docs), before the pop
    // says anything of it (that its group is missing, or it is paused); a long-poll's
    // later rounds also see a grant revoked meanwhile. The lock below is on this id: a
    // queue deleted in between is not found again.
    crate::queue::privileges::require_id(client, info.queue_id, crate::queue::privileges::Privilege::Consume);
    if !info.has_group && !info.create_groups {
        lookup::no_group_to_create(a.queue, a.group);
    }
    if info.paused {
        return None; // paused: nothing is delivered, and a long-poll sleeps (`pop_waiting`)
    }
    // The queue lock before any lane or row of the queue (`queen_core::lock_order`).
    if !crate::pg::locks::share_queue(info.queue_id) {
        return None; // deleted while this pop waited: an unknown queue
    }
    if !info.has_group && lookup::ensure_group(client, info.queue_id, a.group, a.subscription, false).is_none() {
        return None; // another session is creating this group and claiming right now
    }
    Some(info)
}

/// A pop's read of its locked lanes, one lane at a time (`next_lane`): what each lane
/// takes of the batch, what it delivered, claimed, passed and could not open.
struct Reading<'conn, 'a> {
    candidates: Vec<Candidate>,
    /// Each candidate's share of the batch (`claim::fill`), by index.
    takes: Vec<i64>,
    /// The segment rows of every lane's share, fetched together when there are several
    /// (`segments::fetch_many`); a lane that takes more than its share (`carry`) or meets
    /// a gap reads the rest on its own.
    prefetched: std::vec::IntoIter<Option<segments::Rows<'conn>>>,
    /// The next candidate to read.
    next: usize,
    /// The shares of the lanes read so far minus what they delivered (`take_with_carry`).
    carry: i64,
    budget: Budget,
    due: Due<'a>,
    lease: Option<(pgrx::Uuid, i64)>,
    out: Vec<Delivered>,
    claims: Claims,
    poison: Vec<Poison>,
    /// Lanes where the pop found only messages it could not open: (partition, the last).
    passed: Vec<(pgrx::Uuid, i64)>,
}

impl<'conn, 'a> Reading<'conn, 'a> {
    fn new(
        client: &mut SpiClient<'conn>,
        a: &PopArgs,
        candidates: Vec<Candidate>,
        due: Due<'a>,
        lease: Option<(pgrx::Uuid, i64)>,
    ) -> Self {
        let takes = fill(a.batch as i64, &candidates.iter().map(|c| c.available).collect::<Vec<_>>());
        let shared: Vec<usize> = (0..candidates.len()).filter(|&i| takes[i] > 0).collect();
        let mut prefetched: Vec<Option<segments::Rows<'conn>>> = (0..candidates.len()).map(|_| None).collect();
        if shared.len() > 1 {
            let spans: Vec<(pgrx::Uuid, i64, i64)> = shared
                .iter()
                .map(|&i| {
                    let c = &candidates[i];
                    (c.partition_id, c.committed + 1, (c.committed + takes[i]).min(c.readable))
                })
                .collect();
            for (&i, rows) in shared.iter().zip(segments::fetch_many(client, &spans)) {
                prefetched[i] = Some(rows);
            }
        }
        Reading {
            candidates,
            takes,
            prefetched: prefetched.into_iter(),
            next: 0,
            carry: 0,
            budget: Budget::new(a.max_bytes),
            due,
            lease,
            out: Vec::new(),
            claims: Claims::default(),
            poison: Vec::new(),
            passed: Vec::new(),
        }
    }

    /// Reads the next lane's share; false once the pop is done (no lane left, or the byte
    /// budget spent).
    fn next_lane(&mut self, client: &mut SpiClient<'conn>, scan: Option<&mut LaneScan<'_>>) -> bool {
        if self.next == self.candidates.len() && !self.lock_more(client, scan) {
            return false;
        }
        if self.budget.full() {
            return false; // the byte budget is spent: the rest waits for the next pop
        }
        let (i, rows) = (self.next, self.prefetched.next().flatten());
        self.next += 1;
        let (c, share) = (&self.candidates[i], self.takes[i]);
        let take = queen_core::claim::take_with_carry(share, self.carry, c.available);
        self.carry += share;
        if take == 0 {
            return true; // locked but not claimed: the lock ends with this transaction
        }
        let start = c.committed + 1;
        let attempt = queen_core::lane::redelivery(c.claim_start, c.attempt_count, start);
        let (before, poisoned) = (self.out.len(), self.poison.len());
        let (out, lease) = (&mut self.out, self.lease);
        let span = read_span(client, c, take, rows, &self.due, &self.budget, &mut self.poison, |mut d| {
            d.lease_id = lease.map(|l| l.0);
            d.lease_expires_at = lease.map(|l| l.1);
            d.attempt = attempt;
            out.push(d);
        });
        self.carry -= (self.out.len() - before) as i64;
        let Some(end) = span.delivered else {
            debug_assert_eq!(self.out.len(), before);
            // Nothing to deliver after all (see read_span): not claimed. Messages that
            // cannot be opened were filed as dead letters: the cursor passes them.
            if self.poison.len() > poisoned {
                self.passed.push((c.partition_id, span.seen.expect("poison was seen")));
            }
            return true;
        };
        // What the read passed over beyond the last message it delivered is outside the
        // claim, so no ack of this lease moves the cursor past it: it is left for a later
        // pop (filed then, with the cursor move that passes it).
        let beyond = self.poison.split_off(poisoned);
        self.poison.extend(beyond.into_iter().filter(|p| p.last <= end));
        self.claims.add(c.partition_id, queen_core::lane::Claim { start, end, attempt }, c.old_lease);
        true
    }

    /// Every locked lane was read and lanes that held messages back (not due yet, gaps,
    /// poison) left part of the batch undelivered: with the registry the scan goes on to
    /// the next lanes, up to `max_partitions` in all. False: no more lanes.
    fn lock_more(&mut self, client: &mut SpiClient<'conn>, scan: Option<&mut LaneScan<'_>>) -> bool {
        let Some(scan) = scan.filter(|_| self.carry > 0) else {
            return false;
        };
        let more = scan.lock_lanes(client, self.carry);
        if more.is_empty() {
            return false;
        }
        self.takes.extend(fill(self.carry, &more.iter().map(|c| c.available).collect::<Vec<_>>()));
        self.candidates.extend(more);
        self.carry = 0; // now the new lanes' shares
        true
    }

    /// Files the poison, then claims what was delivered (in the registry, or in the lane
    /// rows without it) and returns the rows ordered by partition, then offset.
    fn claim(self, client: &mut SpiClient<'_>, a: &PopArgs, queue_id: i64, registry: bool, now: i64) -> Vec<Delivered> {
        let Reading { candidates, claims, poison, passed, lease, mut out, .. } = self;
        file_poison(client, a, queue_id, &candidates, poison, &passed);
        let Some(last) = claims.partition_ids.last().copied() else {
            // Nothing claimed (every lane held back, or only poison passed): no lease to write.
            return Vec::new();
        };
        if a.partition.is_none() {
            // The next pop starts just after the last lane this one claimed (`cursor`).
            move_cursor(queue_id, a.group, last);
        }
        if registry {
            apply_registry(client, a, queue_id, &candidates, &claims, lease, now);
        } else {
            match lease {
                Some((lease_id, expires)) => {
                    crate::lane::rows::claim_leased(client, queue_id, a.group, claims, lease_id, expires, now)
                }
                // auto_ack: no lease; the cursor moves to batch_end in this same call.
                None => crate::lane::rows::claim_auto_ack(client, a.group, claims, now),
            }
        }
        // Rows come ordered by partition, then offset (docs/functions.md#pop).
        out.sort_by(|x, y| (x.partition.as_str(), x.msg_offset).cmp(&(y.partition.as_str(), y.msg_offset)));
        out
    }
}

thread_local! {
    /// Without the lane registry: per (queue, group), the partition this backend claimed
    /// last (or, when a pop claimed nothing, the last one it examined).
    static CURSORS: std::cell::RefCell<std::collections::HashMap<(i64, String), [u8; 16]>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// Where a pop of (queue, group) starts its scan of the group's lanes: just after the
/// partition the last pop claimed (or examined last, when it claimed nothing), wrapping
/// around: round-robin over partitions. With the lane registry that cursor is shared by
/// every backend (`registry::shared_cursor`), so pops from new connections (one per pop, or
/// through a pooler) take their turns as one session's would. Without it each backend
/// keeps its own, and starts at a random partition id: a first pop does not always begin
/// at the oldest partition.
fn cursor(queue_id: i64, group: &str) -> pgrx::Uuid {
    if let Some(shared) = crate::lane::registry::shared_cursor(queue_id, group) {
        return shared;
    }
    let random = || {
        let mut b = [0u8; 16];
        getrandom_bytes(&mut b);
        b
    };
    // With the registry, a group's first pop starts anywhere; the shared cursor it moves
    // is the one the next pops read, so nothing is kept here.
    if crate::lane::registry::enabled() {
        return pgrx::Uuid::from_bytes(random());
    }
    let key = (queue_id, group.to_string());
    pgrx::Uuid::from_bytes(CURSORS.with(|c| {
        let mut c = c.borrow_mut();
        trim_cursors(&mut c);
        *c.entry(key).or_insert_with(random)
    }))
}

/// Most (queue, group) cursors a backend keeps without the registry: past it they all go
/// (a cursor is where the next scan starts, not state a pop needs), so a session that
/// serves ever new queues or groups does not grow without end.
const MAX_CURSORS: usize = 10_000;

fn trim_cursors(c: &mut std::collections::HashMap<(i64, String), [u8; 16]>) {
    if c.len() >= MAX_CURSORS {
        c.clear();
    }
}

/// Random bytes from PostgreSQL's strong random source (a fixed value if it has none).
fn getrandom_bytes(b: &mut [u8]) {
    // SAFETY: fills the buffer with `len` bytes; returns false when no source works.
    let _ = unsafe { pg_sys::pg_strong_random(b.as_mut_ptr().cast(), b.len()) };
}

/// Moves the cursor for (queue, group) to `partition_id`: the shared one with the lane
/// registry, else this backend's.
fn move_cursor(queue_id: i64, group: &str, partition_id: pgrx::Uuid) {
    if crate::lane::registry::enabled() {
        crate::lane::registry::set_shared_cursor(queue_id, group, partition_id);
    } else {
        CURSORS.with(|c| {
            let mut c = c.borrow_mut();
            trim_cursors(&mut c);
            c.insert((queue_id, group.to_string()), *partition_id.as_bytes())
        });
    }
}

/// Locks up to `max_partitions` claimable lanes: no live lease, messages past the cursor.
///
/// Lanes are scanned in partition-id order from the cursor (`cursor`), wrapping around,
/// so consecutive pops serve consecutive partitions (a deep partition cannot starve the
/// others) and each scan stops at the first lanes it can claim: the cost grows with the
/// lanes skipped, not with the partitions a queue has.
/// SKIP LOCKED: a lane another pop is claiming right now is not ours to wait on. Without
/// the registry every lane found is locked; `claim::fill` then claims those it needs.
fn claim_candidates(client: &mut SpiClient<'_>, a: &PopArgs, queue_id: i64, now: i64) -> Vec<Candidate> {
    let now = timestamptz(now);
    if let Some(p) = a.partition {
        return to_candidates(run(client, ONE_LANE, &[queue_id.into(), a.group.into(), p.into(), now.into()]));
    }
    let cursor_id = cursor(queue_id, a.group);
    let want = i64::from(a.max_partitions);
    let args = |limit: i64| [queue_id.into(), a.group.into(), limit.into(), now.into(), cursor_id.into()];
    let mut found = to_candidates(run(client, LANES_AFTER_CURSOR, &args(want)));
    if (found.len() as i64) < want {
        // Wrap around: the lanes at or before the cursor.
        found.extend(to_candidates(run(client, LANES_UP_TO_CURSOR, &args(want - found.len() as i64))));
    }
    if (found.len() as i64) < want {
        SCANNED_ALL.with(|f| f.set(true));
    }
    if let Some(last) = found.last() {
        move_cursor(queue_id, a.group, last.partition_id);
    }
    found
}

/// `claim_candidates`' statements (without the lane registry). $1 queue, $2 group,
/// $4 now; for one partition $3 is its name, else $3 is how many lanes and $5 the cursor.
const ONE_LANE: &str = concat!(
    "SELECT l.partition_id, p.name, l.committed, queen._readable(l.partition_id, p.head),
            l.claim_start, l.attempt_count, l.lease_id
       FROM queen.partitions p
       JOIN queen.lanes l ON l.partition_id = p.partition_id AND l.consumer_group = $2
      WHERE p.queue_id = $1 AND p.name = $3
        AND l.committed < queen._readable(l.partition_id, p.head)
        AND ",
    queen_core::lease_free_sql!("l", "$4"),
    "
        FOR UPDATE OF l SKIP LOCKED"
);
const LANES_AFTER_CURSOR: &str = concat!(
    "SELECT l.partition_id, p.name, l.committed, queen._readable(l.partition_id, p.head),
            l.claim_start, l.attempt_count, l.lease_id
       FROM queen.lanes l
       JOIN queen.partitions p ON p.partition_id = l.partition_id
      WHERE l.queue_id = $1 AND l.consumer_group = $2 AND l.partition_id > $5
        AND l.committed < queen._readable(l.partition_id, p.head)
        AND ",
    queen_core::lease_free_sql!("l", "$4"),
    "
      ORDER BY l.partition_id
      LIMIT $3
        FOR UPDATE OF l SKIP LOCKED"
);
const LANES_UP_TO_CURSOR: &str = concat!(
    "SELECT l.partition_id, p.name, l.committed, queen._readable(l.partition_id, p.head),
            l.claim_start, l.attempt_count, l.lease_id
       FROM queen.lanes l
       JOIN queen.partitions p ON p.partition_id = l.partition_id
      WHERE l.queue_id = $1 AND l.consumer_group = $2 AND l.partition_id <= $5
        AND l.committed < queen._readable(l.partition_id, p.head)
        AND ",
    queen_core::lease_free_sql!("l", "$4"),
    "
      ORDER BY l.partition_id
      LIMIT $3
        FOR UPDATE OF l SKIP LOCKED"
);

/// With the lane registry: a scan of the group's claimable lanes, in the same order as
/// `claim_candidates` (from the shared cursor, wrapping), that locks them for this
/// transaction a few at a time, only as far as a pop needs (`lock_lanes`). It reads lane
/// rows that no pop or ack updates, and asks the registry about each
/// (`lane::claimable`); a lane another pop takes meanwhile is skipped, never waited for.
struct LaneScan<'a> {
    a: &'a PopArgs<'a>,
    queue_id: i64,
    now: i64,
    /// The (lower, upper] ranges of partition ids still to read: after the cursor, then
    /// up to it. A partition id is never the nil UUID.
    spans: Vec<(pgrx::Uuid, pgrx::Uuid)>,
    /// Lanes the scan may still read (`max_partitions` in all, not counting lanes another
    /// pop took between the read and the lock).
    left: i64,
    /// Rows the next chunk reads at most: `SCAN_CHUNK`, then twice as many each time.
    chunk: i64,
    /// Rows read but not examined yet (the last chunk's rest).
    pending: std::collections::VecDeque<(pgrx::Uuid, String, i64)>,
    /// The last lane examined: where the cursor goes when the pop claims nothing.
    last_seen: Option<pgrx::Uuid>,
    /// With a `partition`: its lane was read (the scan has nothing else).
    pinned_read: bool,
    /// The group's limits: a lane they hold back is not a candidate.
    gate: Option<crate::lane::limits::Gate>,
    /// The tables the chunks read, open from the first chunk on.
    tables: Tables,
}

/// Lanes a pop's first scan chunk reads (at most `max_partitions`); each further chunk of
/// the same scan reads twice as many as the one before.
const SCAN_CHUNK: i64 = 4;

impl<'a> LaneScan<'a> {
    fn new(a: &'a PopArgs<'a>, queue_id: i64, now: i64, gate: Option<crate::lane::limits::Gate>) -> Self {
        let spans = if a.partition.is_some() {
            Vec::new() // one lane, read by name
        } else {
            let cursor = cursor(queue_id, a.group);
            vec![(cursor, pgrx::Uuid::from_bytes([0xff; 16])), (pgrx::Uuid::from_bytes([0; 16]), cursor)]
        };
        LaneScan {
            a,
            queue_id,
            now,
            spans,
            left: i64::from(a.max_partitions),
            chunk: SCAN_CHUNK,
            pending: Default::default(),
            last_seen: None,
            pinned_read: false,
            gate,
            tables: Tables::Unopened,
        }
    }

    /// Locks the next claimable lanes until they hold `need` offsets between them
    /// (`claim::covered`) or the scan ends; returns them in scan order. The cursor moves
    /// to the last lane examined (a claim moves it again, in `pop_in`).
    fn lock_lanes(&mut self, client: &mut SpiClient<'_>, need: i64) -> Vec<Candidate> {
        let mut found = Vec::new();
        let mut covering = 0i64;
        if let Some(p) = self.a.partition.filter(|_| !self.pinned_read) {
            self.pinned_read = true;
            let rows = run(
                client,
                "SELECT l.partition_id, p.name, r.readable
                   FROM queen.partitions p
                   JOIN queen.lanes l ON l.partition_id = p.partition_id AND l.consumer_group = $2
                  CROSS JOIN LATERAL (SELECT queen._claimable(l.partition_id, $2, p.head) AS readable) r
                  WHERE p.queue_id = $1 AND p.name = $3 AND r.readable IS NOT NULL",
                &[self.queue_id.into(), self.a.group.into(), p.into()],
            );
            for r in rows {
                self.pending.push_back((
                    r.get(1).or_raise().unwrap(),
                    r.get(2).or_raise().unwrap(),
                    r.get(3).or_raise().unwrap(),
                ));
            }
        }
        while !covered(need, covering) {
            let Some((partition_id, partition, readable)) = self.next_row(client) else {
                break;
            };
            self.last_seen = Some(partition_id);
            // A lane another pop took since the scan read it (its claim may still be
            // uncommitted) is not one this pop examined: it does not count against
            // `max_partitions`, so the scan reads the next lane instead of ending empty.
            let Some(s) = crate::lane::registry::lock(partition_id, self.a.group, false) else {
                self.left += 1;
                continue;
            };
            if !Lane::from_registry(&s).claimability(readable, self.now).claimable() {
                self.left += 1;
                continue;
            }
            let available = self.admit(client, partition_id, &partition, readable - s.committed, need - covering);
            if available == 0 {
                continue;
            }
            covering += available;
            found.push(Candidate {
                partition_id,
                partition,
                committed: s.committed,
                readable,
                available,
                claim_start: (s.claim_start != 0).then_some(s.claim_start),
                attempt_count: s.attempt_count,
                old_lease: None,
                registry: Some(s),
            });
        }
        if let (None, Some(last)) = (self.a.partition, self.last_seen) {
            move_cursor(self.queue_id, self.a.group, last);
        }
        found
    }

    /// What a locked lane holding `available` offsets may take of the `left` the scan still
    /// needs: all, unless the group's limits (`gate`) let it take fewer (as many as its
    /// buckets hold tokens for) or none (no token, or its key's lanes in flight at the
    /// cap). A lane that may take none is left out, and the scan goes on to the next one,
    /// so other keys are served.
    fn admit(
        &mut self,
        client: &mut SpiClient<'_>,
        partition_id: pgrx::Uuid,
        partition: &str,
        available: i64,
        left: i64,
    ) -> i64 {
        match &mut self.gate {
            Some(gate) => gate.admit(client, partition_id, partition, available.min(left), self.now),
            None => available,
        }
    }

    /// The next claimable lane the scan reads, reading a chunk (`lane::claimable`) when
    /// none is pending.
    fn next_row(&mut self, client: &mut SpiClient<'_>) -> Option<(pgrx::Uuid, String, i64)> {
        loop {
            if let Some(row) = self.pending.pop_front() {
                return Some(row);
            }
            let &(lower, upper) = self.spans.first()?;
            let limit = self.chunk.min(self.left);
            if limit <= 0 {
                return None;
            }
            let rows = claimable_lanes(client, &mut self.tables, self.queue_id, self.a.group, (lower, upper), limit);
            let n = rows.len() as i64;
            for row in rows {
                self.spans[0].0 = row.partition_id; // the next chunk reads after it
                self.pending.push_back((row.partition_id, row.partition, row.readable));
            }
            self.left -= n;
            if n < limit {
                self.spans.remove(0); // this range has no more claimable lanes
                if self.spans.is_empty() {
                    SCANNED_ALL.with(|f| f.set(true));
                }
            }
            if n > 0 {
                self.chunk = self.chunk.saturating_mul(2);
            }
        }
    }
}

/// With the lane registry: the claims take effect there (the lanes stay locked until the
/// transaction ends); an auto-ack journals its cursors.
fn apply_registry(
    client: &mut SpiClient<'_>,
    a: &PopArgs,
    queue_id: i64,
    candidates: &[Candidate],
    claims: &Claims,
    lease: Option<(pgrx::Uuid, i64)>,
    now: i64,
) {
    let mut journal = Vec::new();
    for (pid, claim) in claims.iter() {
        let c = candidates.iter().find(|c| c.partition_id == pid).expect("a claimed lane was a candidate");
        let old = c.registry.expect("locked in the registry");
        let lane = Lane::from_registry(&old);
        let next = match lease {
            Some((id, expires)) => lane.leased(claim, (u128::from_be_bytes(*id.as_bytes()), expires)),
            // auto_ack: no lease; the cursor moves to batch_end (journaled).
            None => queen_core::lane::auto_ack(&lane, claim.end),
        };
        let new = LaneState { last_claimed: now, ..next.to_registry(&old) };
        crate::lane::registry::set(pid, a.group, new, Some((queue_id, a.group)));
        if lease.is_none() {
            journal.push((pid, new));
        }
    }
    crate::lane::registry::journal(client, a.group, &journal);
}

fn to_candidates(table: pgrx::spi::SpiTupleTable<'_>) -> Vec<Candidate> {
    table
        .into_iter()
        .map(|row| {
            let committed: i64 = row.get(3).or_raise().unwrap();
            let readable: i64 = row.get(4).or_raise().unwrap();
            Candidate {
                partition_id: row.get(1).or_raise().unwrap(),
                partition: row.get(2).or_raise().unwrap(),
                committed,
                readable,
                available: readable - committed,
                claim_start: row.get(5).or_raise(),
                attempt_count: row.get(6).or_raise().unwrap(),
                old_lease: row.get(7).or_raise(),
                registry: None,
            }
        })
        .collect()
}

/// What is left of a pop's byte budget (`max_bytes`), and whether it delivered anything.
///
/// It bounds a pop's memory. What the pop gathers (`take`, payload and headers) is at most
/// `max_bytes`, or its first message alone when that is larger. What it fetches to find
/// them (`room`, see `segments::read_rows`) is held one chunk at a time and freed once
/// decoded: at most min(budget left, 1 MiB) of stored bytes, or one block when a block is
/// larger (one message, when messages are large). Once the budget is spent it fetches
/// nothing more. Cells: the read asks for `room` while the pop's `emit` takes from it.
pub struct Budget {
    left: std::cell::Cell<i64>,
    any: std::cell::Cell<bool>,
}

impl Budget {
    pub fn new(max_bytes: i64) -> Budget {
        Budget { left: max_bytes.into(), any: false.into() }
    }

    /// Whether the pop may read no further: the budget is spent, or a payload did not fit.
    pub fn full(&self) -> bool {
        self.any.get() && self.left.get() <= 0
    }

    /// Whether a payload of `n` bytes fits; the first message of a pop always does.
    pub fn take(&self, n: usize) -> bool {
        let n = n as i64;
        if self.any.get() && n > self.left.get() {
            self.left.set(0); // nothing more fits in this pop
            return false;
        }
        self.left.set(self.left.get() - n);
        self.any.set(true);
        true
    }

    /// What a read may still fetch for this pop.
    pub fn room(&self) -> segments::Room {
        segments::Room::Budget { left: self.left.get(), any: self.any.get() }
    }
}

/// A message a pop passes over instead of delivering it (`SpanRead::pass_over`): one it
/// cannot open or decode (poison), one that outlived the queue's ttl since it was due, or
/// one redriven to another group. `file_poison` files those marked `file` as dead letters.
struct Poison {
    partition_id: pgrx::Uuid,
    offset: i64,
    message_id: pgrx::Uuid,
    transaction_id: String,
    stored: Vec<u8>,
    headers: Option<Vec<u8>>,
    error: String,
    /// The last offset it covers: `offset`, or a corrupt segment's last.
    last: i64,
    /// A corrupt segment (its bytes), not one message.
    raw: bool,
    /// The dead letter's reason: 'unreadable' or 'expired'.
    reason: &'static str,
    /// Filed as a dead letter; false: passed over only (an expired message of a queue
    /// without a DLQ, or a message redriven to another group).
    file: bool,
}

/// What `read_span` got to: the last offset it delivered, and the last it passed
/// (delivered, or a message it could not open).
struct Span {
    delivered: Option<i64>,
    seen: Option<i64>,
}

/// Counts the expired messages this pop drops without a dead letter (a queue without a
/// DLQ) in `queen.expired_drops`, per partition, once each: the row keeps the offsets it
/// counted past the group's cursor (`counted`), and a message met again (its lease ended
/// before the cursor passed it; it can be met after a later offset was counted, when an
/// earlier message came back for a retry) is not counted again. A count trims the offsets
/// up to the lane's cursor, which no pop meets again unless a `seek` moves the cursor
/// back: a message dropped again after a seek back may then be counted again. In the
/// pop's transaction: a pop that rolls back counts nothing.
fn count_dropped(client: &mut SpiClient<'_>, a: &PopArgs, queue_id: i64, candidates: &[Candidate], poison: &[Poison]) {
    let mut by_partition: std::collections::BTreeMap<pgrx::Uuid, Vec<i64>> = std::collections::BTreeMap::new();
    for p in poison.iter().filter(|p| !p.file && p.reason == "expired") {
        by_partition.entry(p.partition_id).or_default().push(p.offset);
    }
    for (pid, offsets) in by_partition {
        let c = candidates.iter().find(|c| c.partition_id == pid).expect("a dropped message's lane was a candidate");
        run(
            client,
            "INSERT INTO queen.expired_drops AS e (partition_id, consumer_group, queue_id, dropped, counted)
             SELECT $1, $2, $3, count(*), range_agg(int8range(o, o, '[]')) FROM unnest($4::int8[]) o
             ON CONFLICT (partition_id, consumer_group) DO UPDATE SET
               dropped = e.dropped + (SELECT count(*) FROM unnest($4::int8[]) o WHERE NOT e.counted @> o),
               counted = (e.counted + EXCLUDED.counted) - int8multirange(int8range(NULL, $5, '[]'))",
            &[pid.into(), a.group.into(), queue_id.into(), offsets.into(), c.committed.into()],
        );
    }
}

/// Files the messages a pop could not open as dead letters of its group, with the reason
/// (once each), with a WARNING, and counts the expired ones it drops (`count_dropped`);
/// and moves past them the cursors of lanes (`passed`) where they were all the pop found.
/// Other lanes pass them with their lease's ack.
fn file_poison(
    client: &mut SpiClient<'_>,
    a: &PopArgs,
    queue_id: i64,
    candidates: &[Candidate],
    poison: Vec<Poison>,
    passed: &[(pgrx::Uuid, i64)],
) {
    if poison.iter().any(|p| p.file) || !passed.is_empty() {
        PASSED_HERE.with(|c| c.set(true));
    }
    if !passed.is_empty() {
        CURSOR_PASSED.with(|c| c.set(true));
    }
    count_dropped(client, a, queue_id, candidates, &poison);
    for p in poison.into_iter().filter(|p| p.file) {
        let filed = crate::ops::dlq::file(
            client,
            crate::ops::dlq::Filing {
                queue_id,
                partition_id: p.partition_id,
                group: a.group,
                offset: p.offset,
                message_id: p.message_id,
                transaction_id: &p.transaction_id,
                stored: p.stored,
                headers: p.headers,
                error: &p.error,
                retry_count: 0,
                raw: p.raw,
                reason: p.reason,
            },
        );
        if filed && p.reason == "unreadable" {
            pgrx::warning!(
                "queen: the message at offset {} of a partition of queue {:?} cannot be read or opened; it was filed as a dead letter: {}",
                p.offset,
                a.queue,
                p.error
            );
        }
    }
    let mut journal = Vec::new();
    for &(pid, to) in passed {
        let c = candidates.iter().find(|c| c.partition_id == pid).expect("a passed lane was a candidate");
        if let Some(old) = c.registry {
            let new = queen_core::lane::pass(&Lane::from_registry(&old), to).to_registry(&old);
            crate::lane::registry::set(pid, a.group, new, None);
            if new.journal_seq != old.journal_seq {
                journal.push((pid, new));
            }
        } else {
            crate::lane::rows::pass(client, pid, a.group, to);
        }
    }
    crate::lane::registry::journal(client, a.group, &journal);
}

/// What decides whether a message is delivered now: the queue's delay
/// (`queen_core::policy::due_at`) and ttl (`queen_core::policy::expired`), and the pop's
/// clock; and whether an expired message is filed as a dead letter (else it is dropped).
struct Due<'a> {
    delay: i64,
    configured_at: i64,
    ttl: i64,
    file_expired: bool,
    now: i64,
    /// The popping group: a redriven message for another group is passed over
    /// (`queen_core::policy::redrive_passes`).
    group: &'a str,
}

/// Delivers up to `take` messages of a lane from `committed + 1` on, never past its
/// readable end; returns the offset of the last one delivered (the claim's `batch_end`),
/// or None when there was none to deliver.
///
/// An offset up to the readable end that holds no message is a gap (a push that aborted):
/// every push that could write it has ended, and this read's snapshot, taken after the
/// readable end was read, sees every one that committed. So the read steps over it. Under
/// REPEATABLE READ or SERIALIZABLE the snapshot is the transaction's, older than the
/// readable end: a missing offset may be a message committed since. There the read asks
/// `segments::gaps_from` (a gap entry of a segment it sees, or an offset no segment holds
/// even now, is a gap for good) and steps over gaps; before a message it cannot see, it
/// stops and delivers only what comes before.
///
/// Reads within `budget`: it fetches nothing once the budget is spent, and holds at most
/// one chunk of stored bytes at a time (see `Budget`).
#[allow(clippy::too_many_arguments)]
fn read_span<'conn>(
    client: &mut SpiClient<'conn>,
    c: &Candidate,
    take: i64,
    mut prefetched: Option<segments::Rows<'conn>>,
    due: &Due<'_>,
    budget: &Budget,
    poison: &mut Vec<Poison>,
    emit: impl FnMut(Delivered),
) -> Span {
    let fixed_snapshot = errors::fixed_snapshot();
    let mut r = SpanRead {
        c,
        take,
        due,
        budget,
        poison,
        emit,
        fixed_snapshot,
        gaps_through: c.committed,
        missing: None,
        delivered: 0,
        last: None,
        seen: None,
    };
    let mut next = c.committed + 1;
    // Spans read in a row that held only gaps.
    let mut empty = 0;
    while r.delivered < take && next <= c.readable {
        // A long walk over gaps or passed messages stays cancellable.
        pgrx::check_for_interrupts!();
        // Assume no gaps; a gap costs one more (short) read.
        let mut end = (next + (take - r.delivered) - 1).min(c.readable);
        let rows = match prefetched.take() {
            Some(rows) if rows.lo == next && rows.hi >= next => {
                end = end.min(rows.hi);
                rows
            }
            _ => segments::fetch(client, c.partition_id, next, end),
        };
        let (mut stop, mut any) = (false, false);
        // A corrupt segment is filed whole, as one dead letter (its bytes, and the
        // offsets it held), and passed over like a message that cannot be opened.
        let mut corrupts: Vec<segments::Corrupt> = Vec::new();
        let mut corrupt = |k: segments::Corrupt| corrupts.push(k);
        segments::read_rows(
            rows,
            c.partition_id,
            next,
            end,
            &|| budget.room(),
            |offset, message| {
                any |= message.is_some();
                // Once this says stop, read_rows calls it no more.
                let go_on = r.offset(offset, message);
                stop = !go_on;
                go_on
            },
            Some(&mut corrupt),
        );
        let past_corrupt = corrupts.into_iter().fold(end + 1, |past, k| past.max(r.corrupt(k)));
        // A fixed snapshot found no message at `missing`: read on from there if it is a
        // gap for good, else stop before it.
        if let Some(missing) = r.missing.take() {
            match segments::gaps_from(client, c.partition_id, missing, c.readable) {
                Some(through) => {
                    r.gaps_through = through;
                    next = missing;
                    continue;
                }
                None => break,
            }
        }
        // A spent budget: the read fetched no further (`segments::read_rows`).
        if stop || budget.full() {
            break;
        }
        next = past_corrupt;
        // Two spans in a row of only gaps: on from the next stored offset
        // (`segments::next_stored`), not a span at a time. (Not after one: a short gap,
        // one aborted push, is read past as before, without the probe, which walks the
        // index entries of segments compacted since while a long snapshot keeps them.) A
        // fixed snapshot may not see segments committed since it was taken: there the jump
        // stops past the offsets known to be gaps for good.
        empty = if any { 0 } else { empty + 1 };
        if empty >= 2 && next <= c.readable {
            let stored = segments::next_stored(client, c.partition_id, next).unwrap_or(c.readable + 1);
            let to = if fixed_snapshot { stored.min(next.max(r.gaps_through + 1)) } else { stored };
            next = next.max(to);
        }
    }
    Span { delivered: r.last, seen: r.seen }
}

/// Most messages one pop passes over (expired, unreadable, redriven elsewhere): a lane
/// with more is passed in several pops, each within bounded memory.
const PASS_MAX: usize = 10_000;

/// `read_span`'s state while it walks a lane's offsets: what it delivered and passed.
struct SpanRead<'a, E> {
    c: &'a Candidate,
    take: i64,
    due: &'a Due<'a>,
    budget: &'a Budget,
    poison: &'a mut Vec<Poison>,
    emit: E,
    /// REPEATABLE READ or SERIALIZABLE: a missing offset past `gaps_through` stops the
    /// read, at `missing`, until `segments::gaps_from` says what it is (see `read_span`).
    fixed_snapshot: bool,
    /// Offsets up to here that hold no message are gaps for good (`segments::gaps_from`).
    gaps_through: i64,
    /// The missing offset the read stopped at, for `read_span` to ask about.
    missing: Option<i64>,
    delivered: i64,
    last: Option<i64>,
    seen: Option<i64>,
}

impl<E: FnMut(Delivered)> SpanRead<'_, E> {
    /// One offset of the span: a message, or a gap (None). Returns whether the read goes on.
    fn offset(&mut self, offset: i64, message: Option<(Frame<'_>, TimestampWithTimeZone)>) -> bool {
        let Some((f, created_at)) = message else {
            if !self.fixed_snapshot || offset <= self.gaps_through {
                return true; // a gap
            }
            self.missing = Some(offset);
            return false;
        };
        let (payload, headers) = match crate::queue::encryption::open_frame(&f) {
            Ok(opened) => opened,
            // A key that is not configured stops the pop (unless
            // queen.dead_letter_missing_key): every message it sealed would otherwise be
            // dead-lettered over one missing setting.
            Err(e) if e.stops_pop() => e.raise(),
            // Poison (an envelope that does not authenticate): filed as a dead letter and
            // passed over; the lane goes on.
            Err(e) => return self.pass_over(offset, &f, "unreadable", true, e.message),
        };
        // A message redriven to another group (`queen.dlq_redrive`): passed over, never
        // filed (it is not this group's, expired or not); the lane goes on.
        let target =
            headers.as_deref().and_then(|h| crate::pg::jsonb::string_at(h, queen_core::policy::REDRIVE_HEADER));
        if queen_core::policy::redrive_passes(target.as_deref(), self.due.group) {
            return self.pass_over(offset, &f, "redriven elsewhere", false, String::new());
        }
        // When it may be delivered: its push, or later (the queue's delay, its own delivery
        // time).
        let due_at = queen_core::policy::due_at(i64::from(created_at), self.due.delay, f.deliver_at);
        // A message that waited longer than the queue's ttl since it was due is not
        // delivered: filed as a dead letter (or dropped) and passed over like poison; the
        // lane goes on. The ttl counts from no earlier than the queue's last change, nor
        // than when the message became readable, if that was late (its push, or an earlier
        // one of its partition, stayed open: asked only of a message that looks expired).
        let readable_after = || offsets::readable_after(self.c.partition_id, offset);
        if queen_core::policy::expired_once_readable(
            due_at,
            self.due.configured_at,
            readable_after,
            self.due.ttl,
            self.due.now,
        ) {
            let error = format!("expired: due more than the queue's ttl ({} s) ago", self.due.ttl as f64 / 1e6);
            return self.pass_over(offset, &f, "expired", self.due.file_expired, error);
        }
        // A message not due yet holds back the rest of its lane: offsets are delivered in
        // order.
        if due_at > self.due.now {
            crate::pg::wake::due_at(due_at);
            NOT_DUE.with(|n| n.set(true));
            return false;
        }
        // Headers count with the payload: both are held in memory for the result.
        if !self.budget.take(payload.len() + headers.as_ref().map_or(0, Vec::len)) {
            return false; // past the byte budget: this message waits for the next pop
        }
        (self.emit)(Delivered::new(
            self.c.partition_id,
            self.c.partition.clone(),
            offset,
            &f,
            created_at,
            (payload, headers),
        ));
        self.delivered += 1;
        self.last = Some(offset);
        self.seen = Some(offset);
        self.delivered < self.take
    }

    /// A message passed over instead of delivered: filed as a dead letter with `reason`
    /// when `file` (its stored bytes are kept for that), else only passed (the cursor moves
    /// past it with the lane).
    ///
    /// Returns false, recording nothing, when the pop may pass over no more: a filed
    /// message's stored bytes count against the byte budget, and one pop passes over at
    /// most `PASS_MAX` messages; the rest wait for the next pop.
    fn pass_over(&mut self, offset: i64, f: &Frame<'_>, reason: &'static str, file: bool, error: String) -> bool {
        let stored = if file { f.payload.len() + f.headers.map_or(0, <[u8]>::len) } else { 0 };
        // (Nothing to hold, nothing charged: a first message still always fits.)
        if self.poison.len() >= PASS_MAX || (stored > 0 && !self.budget.take(stored)) {
            return false;
        }
        self.poison.push(Poison {
            partition_id: self.c.partition_id,
            offset,
            last: offset,
            message_id: pgrx::Uuid::from_bytes(f.message_id),
            transaction_id: f.transaction_id.to_string(),
            stored: if file { f.payload.to_vec() } else { Vec::new() },
            headers: if file { f.headers.map(<[u8]>::to_vec) } else { None },
            error,
            raw: false,
            reason,
            file,
        });
        self.seen = Some(offset);
        true
    }

    /// A corrupt segment met on the way: filed whole as one dead letter. Returns the
    /// offset just past it.
    fn corrupt(&mut self, k: segments::Corrupt) -> i64 {
        self.seen = self.seen.max(Some(k.last));
        self.poison.push(Poison {
            partition_id: self.c.partition_id,
            offset: k.segment_first,
            last: k.last,
            message_id: pgrx::Uuid::from_bytes([0; 16]),
            transaction_id: queen_core::addresses::span_address(SpanKind::CorruptSegment, k.segment_first, k.last),
            stored: k.bytes,
            headers: None,
            error: format!("queen: offsets {}..{} cannot be read: {}", k.from, k.last, k.error),
            raw: true,
            reason: SpanKind::CorruptSegment.reason(),
            file: true,
        });
        k.last + 1
    }
}
