//! Rate limits and concurrency caps at claim time (docs/concepts.md#rate-limits-and-concurrency-caps): the
//! buckets of `queen_core::limits` in shared memory, and a pop's gate over them.
//!
//! A pop of a group with limits (`queen.limits`, set by `queen.configure_limit`) passes its
//! locked candidate lanes through a `Gate` before it reads them: each lane may take at most
//! the tokens its buckets hold (taken at once, so two pops cannot spend the same token),
//! and none while its key has `max_in_flight` lanes under live leases. After the read, the
//! tokens of messages not delivered go back and lanes not claimed leave the in-flight list
//! (`Gate::settle`). A token spent by a pop that then rolls back is not given back: a limit
//! errs on the side of delivering less.
//!
//! With the library preloaded the buckets live in shared memory: `BUCKETS` slots, three
//! quarters of which may be used, half by `*` keys (`Buckets::room`); one untouched for a
//! minute with nothing in flight is reused. The **table fallback** is
//! `queen.limit_buckets`: every bucket when the library is not preloaded, and a key's
//! bucket when shared memory has no room for it. A pop
//! locks the rows it draws from (`FOR UPDATE SKIP LOCKED`: a key whose row another
//! transaction holds is held back for this pop, never waited for) and writes them back in
//! `settle`, in its own transaction: a pop that rolls back spends nothing there. The rules
//! are the same `queen_core::limits` code either way (`take`).

use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::spi::SpiClient;
use queen_core::limits::{Bucket, BucketKey, Buckets, Limit};

use crate::pg::errors::SpiExt;
use crate::pg::shmem::{Parts, Region};
use crate::pg::spi::run;

pub const TRANCHE: &CStr = c"queen limits";

/// Bucket slots in shared memory (about 640 bytes each; a power of two), three quarters
/// of which may be used (`Buckets`): 1,536 keys.
const BUCKETS: usize = 2048;

#[derive(Clone, Copy)]
struct Layout;

/// The block: how many buckets hold a key (`Buckets::used`), then the buckets.
fn buckets_at() -> usize {
    std::mem::size_of::<u32>().next_multiple_of(8)
}

impl Parts for Layout {
    type Mut<'a> = Buckets<'a>;
    type Ref<'a> = &'a [Bucket];

    unsafe fn parts_mut<'a>(self, base: *mut u8) -> Self::Mut<'a> {
        // SAFETY: `base` is the block `shmem_init` laid out as a count, then `BUCKETS`
        // buckets 8-byte aligned after it; the caller holds it exclusively
        // (`Parts::parts_mut`).
        unsafe {
            Buckets {
                used: &mut *(base as *mut u32),
                slots: std::slice::from_raw_parts_mut(base.add(buckets_at()) as *mut Bucket, BUCKETS),
            }
        }
    }

    unsafe fn parts_ref<'a>(self, base: *const u8) -> Self::Ref<'a> {
        // SAFETY: as above, with nobody writing meanwhile (`Parts::parts_ref`).
        unsafe { std::slice::from_raw_parts(base.add(buckets_at()) as *const Bucket, BUCKETS) }
    }
}

static mut SHARED: Option<Region<Layout>> = None;

pub fn shmem_size() -> usize {
    buckets_at() + BUCKETS * std::mem::size_of::<Bucket>()
}

/// Sets the buckets up (or attaches to them): `hooks` calls this once per process.
///
/// # Safety
/// Called with AddinShmemInitLock held, with the block `hooks::alloc` returned for
/// `shmem_size` bytes.
pub unsafe fn shmem_init((base, found): (*mut u8, bool)) {
    // SAFETY: the tranche was requested in `hooks::shmem_request`; the block is ours, and
    // fresh when not `found` (nobody else can use it yet while the caller holds the init
    // lock); SHARED is written once per process before any reader runs.
    unsafe {
        let lock = &raw mut (*pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr())).lock;
        let region = Region::new(lock, base, Layout);
        if !found {
            let b = region.parts_for_format();
            *b.used = 0;
            b.slots.fill(Bucket::default());
        }
        SHARED = Some(region);
    }
}

/// Whether the buckets exist (the library is preloaded).
pub fn enabled() -> bool {
    // SAFETY: SHARED is written only in `shmem_init`, before this process runs queries.
    unsafe { (*std::ptr::addr_of!(SHARED)).is_some() }
}

fn shared() -> &'static Region<Layout> {
    // SAFETY: as `enabled`.
    unsafe { (*std::ptr::addr_of!(SHARED)).as_ref().expect("queen limits: shared memory not set up") }
}

/// The limits of (queue, group), in key order.
pub fn read_limits(client: &mut SpiClient<'_>, queue_id: i64, group: &str) -> Vec<Limit> {
    run(
        client,
        "SELECT key, rate::float8, burst, max_in_flight FROM queen.limits
          WHERE queue_id = $1 AND consumer_group = $2 ORDER BY key",
        &[queue_id.into(), group.into()],
    )
    .map(|r| Limit {
        key: r.get::<String>(1).or_raise().unwrap(),
        rate: r.get::<f64>(2).or_raise(),
        burst: r.get::<i32>(3).or_raise(),
        max_in_flight: r.get::<i32>(4).or_raise(),
    })
    .collect()
}

/// What one lane's admission took from one bucket.
struct Taken {
    key: BucketKey,
    tokens: i64,
    capacity: i64,
    /// The lane joined the bucket's in-flight list.
    flight: bool,
}

/// A bucket of `queen.limit_buckets` this pop read: written back by `settle` when `locked`.
#[derive(Clone)]
struct Row {
    key: BucketKey,
    limit_key: String,
    /// The partition, for a `*` key.
    partition: Option<pgrx::Uuid>,
    bucket: Bucket,
    /// Locked by this transaction (else read only, to see whether a lane would be held
    /// back before locking anything).
    locked: bool,
}

/// One pop's passage through its group's limits.
pub struct Gate {
    database: u32,
    /// `queen.queues`' oid: queue ids start over when the extension is created again.
    install: u32,
    queue_id: i64,
    group: String,
    limits: std::rc::Rc<Vec<Limit>>,
    /// Whether the pop leases (an auto-ack pop leaves nothing in flight).
    leases: bool,
    /// Per admitted lane: (partition, granted, what it took).
    granted: Vec<([u8; 16], i64, Vec<Taken>)>,
    /// The table buckets this pop read (`Row`), and the lanes of their in-flight lists
    /// that hold a live lease (read from `queen.lanes` without the registry).
    rows: Vec<Row>,
    live: std::collections::HashSet<[u8; 16]>,
}

/// Why `admit` let a lane take nothing, when it did not.
enum Held {
    No,
    /// Until this time (microseconds) a token is due.
    Tokens(i64),
    /// Too many lanes of the key in flight.
    Flight,
    /// The key has no bucket here: none in shared memory and no room for one there, or
    /// its table row was not read yet.
    Full(BucketKey),
    /// Another transaction holds the key's table bucket.
    Busy,
}

impl Gate {
    pub fn new(queue_id: i64, group: &str, limits: std::rc::Rc<Vec<Limit>>, leases: bool) -> Gate {
        Gate {
            database: crate::pg::dbs::my_database(),
            install: crate::pg::catalog::queen_table(c"queues").to_u32(),
            queue_id,
            group: group.to_string(),
            limits,
            leases,
            granted: Vec::new(),
            rows: Vec::new(),
            live: Default::default(),
        }
    }

    /// How many of `want` messages lane `partition` (named `name`) may take now, taking
    /// that many tokens (and a place in flight) from each bucket of a limit it matches.
    /// A key's bucket is in shared memory, or in `queen.limit_buckets` when the library is
    /// not preloaded or shared memory has no room for it (`Buckets::room`). A lane held
    /// back notes when a token is due (`wake::due_at`), so that a long-poll sleeps until
    /// then.
    pub fn admit(&mut self, client: &mut SpiClient<'_>, partition: pgrx::Uuid, name: &str, want: i64, now: i64) -> i64 {
        if want <= 0 {
            return 0;
        }
        let p = *partition.as_bytes();
        let limits = std::rc::Rc::clone(&self.limits);
        let matching: Vec<(BucketKey, &Limit)> = limits
            .iter()
            .filter(|l| l.matches(name))
            .map(|l| (BucketKey::new((self.database, self.install), self.queue_id, &self.group, l, p), l))
            .collect();
        if matching.is_empty() {
            return want;
        }
        let (n, taken, held) = self.take_anywhere(client, &matching, partition, want, now);
        match held {
            Held::No => {}
            Held::Tokens(at) => crate::pg::wake::due_at(at),
            // A lease ends by an ack (which does not wake pops) or by expiring, and a
            // bucket row another pop holds is free once it commits: look again soon.
            Held::Flight | Held::Busy | Held::Full(_) => crate::pg::wake::due_at(now + 50_000),
        }
        if n > 0 {
            self.granted.push((p, n, taken));
        }
        n
    }

    /// `admit`'s passage: `take` over the buckets of the matching limits, reading a key's
    /// table row when it has no bucket in shared memory (`Held::Full`) and trying again.
    /// Without shared memory, rows are first read without a lock: a lane held back locks
    /// nothing; one that may take locks its rows (SKIP LOCKED: `Busy` when another
    /// transaction holds one) and takes for real.
    fn take_anywhere(
        &mut self,
        client: &mut SpiClient<'_>,
        matching: &[(BucketKey, &Limit)],
        partition: pgrx::Uuid,
        want: i64,
        now: i64,
    ) -> (i64, Vec<Taken>, Held) {
        let p = *partition.as_bytes();
        let (shm, leases) = (enabled(), self.leases);
        for _ in 0..=matching.len() * 2 {
            // With shared memory a row is read only for a key that has no room there, and
            // locked at once (the shared buckets' changes cannot be tried and undone).
            let mut trial = if shm { None } else { Some(self.rows.clone()) };
            let (n, taken, held) = {
                let registry = crate::lane::registry::enabled();
                let (live, granted) = (&self.live, &self.granted);
                let flying = |b: &BucketKey, q: &[u8; 16]| {
                    granted.iter().any(|g| &g.0 == q)
                        || if registry { registry_flying(now)(b, q) } else { live.contains(q) }
                };
                let rows = trial.as_mut().unwrap_or(&mut self.rows);
                if shm {
                    shared().exclusive(|buckets| {
                        take(&mut Mixed { shm: Some(buckets), rows }, matching, p, leases, want, now, &flying)
                    })
                } else {
                    take(&mut Mixed { shm: None, rows }, matching, p, leases, want, now, &flying)
                }
            };
            if let Held::Full(key) = held {
                let l = matching.iter().find(|(k, _)| *k == key).expect("a matching key").1;
                if !self.read_row(client, key, l, partition, now, shm) {
                    return (0, Vec::new(), Held::Busy);
                }
                continue;
            }
            let Some(trial) = trial else {
                return (n, taken, held);
            };
            if n == 0 {
                // Held back: nothing locked for it, and its rows are read afresh next time.
                self.rows.retain(|r| r.locked);
                return (n, taken, held);
            }
            let unlocked: Vec<BucketKey> =
                taken.iter().map(|t| t.key).filter(|k| trial.iter().any(|r| &r.key == k && !r.locked)).collect();
            if unlocked.is_empty() {
                self.rows = trial;
                return (n, taken, held);
            }
            // It may take: lock the rows it read without a lock, and take again.
            for key in unlocked {
                let l = matching.iter().find(|(k, _)| *k == key).expect("a matching key").1;
                self.rows.retain(|r| r.key != key);
                if !self.read_row(client, key, l, partition, now, true) {
                    return (0, Vec::new(), Held::Busy);
                }
            }
        }
        debug_assert!(false, "not reached: each round reads a row it did not have");
        (0, Vec::new(), Held::Busy)
    }

    /// Reads the table row of `key` (making it when there is none) into `rows`, locked when
    /// `lock`; false when another transaction holds it.
    fn read_row(
        &mut self,
        client: &mut SpiClient<'_>,
        key: BucketKey,
        l: &Limit,
        partition: pgrx::Uuid,
        now: i64,
        lock: bool,
    ) -> bool {
        let each = (l.key == queen_core::limits::EACH).then_some(partition);
        let Some(bucket) = read_row(client, self.queue_id, &self.group, &l.key, each, key, l.capacity(), now, lock)
        else {
            return false;
        };
        if !crate::lane::registry::enabled() && bucket.flying > 0 {
            let listed: Vec<pgrx::Uuid> =
                bucket.flight[..bucket.flying as usize].iter().map(|b| pgrx::Uuid::from_bytes(*b)).collect();
            self.live.extend(live_leases(client, self.queue_id, &self.group, listed, now));
        }
        self.rows.push(Row { key, limit_key: l.key.clone(), partition: each, bucket, locked: lock });
        true
    }

    /// After the read: gives back the tokens of messages a lane was granted but did not
    /// deliver (`delivered(partition)`), takes a lane that claimed nothing out of flight,
    /// and writes the locked table buckets back.
    pub fn settle(mut self, client: &mut SpiClient<'_>, delivered: impl Fn(&[u8; 16]) -> i64) {
        if self.granted.is_empty() {
            return; // nothing taken (a table bucket only refilled: nothing to write)
        }
        // Counted before the lock is taken.
        let got: Vec<i64> = self.granted.iter().map(|(p, ..)| delivered(p)).collect();
        let granted = &self.granted;
        let give_back = |store: &mut Mixed<'_, '_>| {
            for ((p, granted, taken), &got) in granted.iter().zip(&got) {
                for t in taken {
                    let Some(b) = store.get(&t.key) else {
                        continue; // removed meanwhile (it was idle)
                    };
                    if t.tokens > 0 {
                        b.refund((granted - got).clamp(0, t.tokens), t.capacity);
                    }
                    if t.flight && got == 0 {
                        b.land(p);
                    }
                }
            }
        };
        let rows = &mut self.rows;
        if enabled() {
            shared().exclusive(|buckets| give_back(&mut Mixed { shm: Some(buckets), rows }));
        } else {
            give_back(&mut Mixed { shm: None, rows });
        }
        for r in self.rows.iter().filter(|r| r.locked) {
            write_row(client, self.queue_id, &self.group, r);
        }
    }
}

/// Whether a lane a bucket let in is still in flight, by the lane registry (read in shared
/// mode; under the buckets' lock, the one place queen nests two of its LWLocks, always in
/// this order, docs/locking.md).
fn registry_flying(now: i64) -> impl Fn(&BucketKey, &[u8; 16]) -> bool {
    move |b: &BucketKey, q: &[u8; 16]| {
        crate::lane::registry::maybe_in_flight(
            &queen_core::lanes::LaneKey { database: b.database, partition: *q, group: b.group },
            now,
        )
    }
}

/// Where `take` finds buckets: a key's table row when this pop read one, else its bucket
/// in shared memory (when the library is preloaded and there is room for it there).
struct Mixed<'s, 'r> {
    shm: Option<Buckets<'s>>,
    rows: &'r mut Vec<Row>,
}

impl Mixed<'_, '_> {
    fn get(&mut self, key: &BucketKey) -> Option<&mut Bucket> {
        if let Some(i) = self.rows.iter().position(|r| &r.key == key) {
            return Some(&mut self.rows[i].bucket);
        }
        self.shm.as_mut()?.get(key)
    }

    fn find_or_make(
        &mut self,
        key: &BucketKey,
        capacity: i64,
        now: i64,
        flying: &dyn Fn(&BucketKey, &[u8; 16]) -> bool,
    ) -> Option<&mut Bucket> {
        if let Some(i) = self.rows.iter().position(|r| &r.key == key) {
            return Some(&mut self.rows[i].bucket);
        }
        self.shm.as_mut()?.find_or_make(key, capacity, now, flying)
    }
}

/// `Gate::admit`'s work on the buckets: every matching limit's bucket lets the lane in
/// (flight) and grants tokens, or the lane takes nothing and what was taken goes back.
/// Pure Rust: no ERROR may be raised while the shared-memory buckets' lock is held.
fn take(
    buckets: &mut Mixed<'_, '_>,
    matching: &[(BucketKey, &Limit)],
    p: [u8; 16],
    leases: bool,
    want: i64,
    now: i64,
    flying: &dyn Fn(&BucketKey, &[u8; 16]) -> bool,
) -> (i64, Vec<Taken>, Held) {
    let mut n = want;
    let mut taken: Vec<Taken> = Vec::new();
    let mut held = Held::No;
    for &(key, l) in matching {
        let Some(b) = buckets.find_or_make(&key, l.capacity(), now, flying) else {
            held = Held::Full(key);
            n = 0;
            break;
        };
        let mut t = Taken { key, tokens: 0, capacity: l.capacity(), flight: false };
        if let (Some(max), true) = (l.max_in_flight, leases) {
            let already = b.flight[..b.flying as usize].contains(&p);
            if !b.admit_flight(p, max as usize, |q| flying(&key, q)) {
                held = Held::Flight;
                n = 0;
                taken.push(t);
                break;
            }
            t.flight = !already;
        }
        if let Some(rate) = l.rate {
            t.tokens = b.take(n, rate, l.capacity(), now);
            if t.tokens == 0 {
                held = Held::Tokens(b.next_token_at(rate, now));
            }
            n = t.tokens;
        }
        taken.push(t);
        if n == 0 {
            break;
        }
    }
    // Buckets that granted more than the lane takes in the end give the rest back.
    for t in &mut taken {
        // (Looked up again: a later limit's new bucket may have moved it, `table::Removal`.)
        let Some(b) = buckets.get(&t.key) else { continue };
        if t.tokens > n {
            b.refund(t.tokens - n, t.capacity);
            t.tokens = n;
        }
        if n == 0 && t.flight {
            b.land(&p);
            t.flight = false;
        }
    }
    (n, taken, held)
}

/// `read_row`'s statement: the row's bucket (locked or not, by what follows).
macro_rules! bucket_columns {
    () => {
        "SELECT micro, at, rate, capacity, flight FROM queen.limit_buckets
          WHERE queue_id = $1 AND consumer_group = $2 AND key = $3"
    };
}

/// `write_row`'s statement.
macro_rules! update_bucket {
    () => {
        "UPDATE queen.limit_buckets SET micro = $5, at = $6, rate = $7, capacity = $8, flight = $9
          WHERE queue_id = $1 AND consumer_group = $2 AND key = $3"
    };
}

/// Reads the `queen.limit_buckets` row of (queue, group, limit key, partition for `*`),
/// locked when `lock`, making it (a full bucket) when there is none; None when another
/// transaction holds it and `lock` asks for it.
#[allow(clippy::too_many_arguments)]
fn read_row(
    client: &mut SpiClient<'_>,
    queue_id: i64,
    group: &str,
    limit_key: &str,
    each: Option<pgrx::Uuid>,
    key: BucketKey,
    capacity: i64,
    now: i64,
    lock: bool,
) -> Option<Bucket> {
    let read = |client: &mut SpiClient<'_>| {
        let args = [queue_id.into(), group.into(), limit_key.into(), each.into()];
        let sql = match (each, lock) {
            (Some(_), true) => concat!(bucket_columns!(), " AND partition_id = $4 FOR UPDATE SKIP LOCKED"),
            (None, true) => {
                concat!(bucket_columns!(), " AND partition_id IS NULL AND $4::uuid IS NULL FOR UPDATE SKIP LOCKED")
            }
            (Some(_), false) => concat!(bucket_columns!(), " AND partition_id = $4"),
            (None, false) => concat!(bucket_columns!(), " AND partition_id IS NULL AND $4::uuid IS NULL"),
        };
        run(client, sql, &args).next().map(|r| {
            let flight: Vec<pgrx::Uuid> = r.get(5).or_raise().unwrap_or_default();
            let mut b = Bucket {
                used: 1,
                key,
                micro: r.get(1).or_raise().unwrap(),
                at: r.get(2).or_raise().unwrap(),
                rate: r.get::<f64>(3).or_raise().unwrap().to_bits(),
                capacity: r.get(4).or_raise().unwrap(),
                ..Bucket::default()
            };
            for q in flight.iter().take(queen_core::limits::MAX_IN_FLIGHT) {
                b.flight[b.flying as usize] = *q.as_bytes();
                b.flying += 1;
            }
            b
        })
    };
    if let Some(b) = read(client) {
        return Some(b);
    }
    let fresh = Bucket::fresh(key, capacity, now);
    if !lock {
        return Some(fresh); // none yet: made when it is locked
    }
    // Another transaction holds it (it is there, unlocked), or there is none yet: then it
    // is made. The insert waits only for a transaction making the same row right now:
    // `configure_limit` makes a prefix key's row, so that happens only to a `*` key's,
    // whose lane this pop holds.
    let sql = match each {
        Some(_) => concat!(bucket_columns!(), " AND partition_id = $4"),
        None => concat!(bucket_columns!(), " AND partition_id IS NULL AND $4::uuid IS NULL"),
    };
    if run(client, sql, &[queue_id.into(), group.into(), limit_key.into(), each.into()]).next().is_some() {
        return None;
    }
    let made = run(
        client,
        "INSERT INTO queen.limit_buckets (queue_id, consumer_group, key, partition_id, micro, at, rate, capacity)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING RETURNING true",
        &[
            queue_id.into(),
            group.into(),
            limit_key.into(),
            each.into(),
            fresh.micro.into(),
            fresh.at.into(),
            f64::from_bits(fresh.rate).into(),
            fresh.capacity.into(),
        ],
    )
    .next()
    .is_some();
    made.then_some(fresh)
}

/// Of the lanes `listed`, those of (queue, group) under a live lease in `queen.lanes`
/// (without the registry, where leases are kept).
fn live_leases(
    client: &mut SpiClient<'_>,
    queue_id: i64,
    group: &str,
    listed: Vec<pgrx::Uuid>,
    now: i64,
) -> Vec<[u8; 16]> {
    run(
        client,
        concat!(
            "SELECT partition_id FROM queen.lanes
              WHERE queue_id = $1 AND consumer_group = $2 AND partition_id = ANY($3) AND NOT ",
            queen_core::lease_free_sql!("lanes", "$4")
        ),
        &[queue_id.into(), group.into(), listed.into(), crate::pg::clock::timestamptz(now).into()],
    )
    .map(|r| *r.get::<pgrx::Uuid>(1).or_raise().unwrap().as_bytes())
    .collect()
}

/// Writes a table bucket back (its row is locked by this transaction).
fn write_row(client: &mut SpiClient<'_>, queue_id: i64, group: &str, r: &Row) {
    let b = &r.bucket;
    let flight: Vec<pgrx::Uuid> = b.flight[..b.flying as usize].iter().map(|q| pgrx::Uuid::from_bytes(*q)).collect();
    let args = [
        queue_id.into(),
        group.into(),
        r.limit_key.as_str().into(),
        r.partition.into(),
        b.micro.into(),
        b.at.into(),
        f64::from_bits(b.rate).into(),
        b.capacity.into(),
        flight.into(),
    ];
    let sql = match r.partition {
        Some(_) => concat!(update_bucket!(), " AND partition_id = $4"),
        None => concat!(update_bucket!(), " AND partition_id IS NULL AND $4::uuid IS NULL"),
    };
    run(client, sql, &args);
}
