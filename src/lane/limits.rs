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
//! The buckets need the library preloaded. Without it, `configure_limit` refuses (0A000).
//! There are `BUCKETS` of them; one untouched for a minute with nothing in flight is
//! reused, and when none is free a lane of a limited key is held back (with a WARNING)
//! until one is.

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
}

/// Why `admit` let a lane take nothing, when it did not.
enum Held {
    No,
    /// Until this time (microseconds) a token is due.
    Tokens(i64),
    /// Too many lanes of the key in flight.
    Flight,
    /// No bucket was free.
    Full,
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
        }
    }

    /// How many of `want` messages lane `partition` (named `name`) may take now, taking
    /// that many tokens (and a place in flight) from each bucket of a limit it matches.
    /// A lane held back notes when a token is due (`wake::due_at`), so that a long-poll
    /// sleeps until then. When no bucket is free the lane is held back too, with a WARNING.
    pub fn admit(&mut self, partition: pgrx::Uuid, name: &str, want: i64, now: i64) -> i64 {
        if want <= 0 {
            return 0;
        }
        let p = *partition.as_bytes();
        let matching: Vec<(BucketKey, &Limit)> = self
            .limits
            .iter()
            .filter(|l| l.matches(name))
            .map(|l| (BucketKey::new((self.database, self.install), self.queue_id, &self.group, l, p), l))
            .collect();
        if matching.is_empty() {
            return want;
        }
        let leases = self.leases;
        let (n, taken, held) = shared().exclusive(|buckets| take(buckets, &matching, p, leases, want, now));
        match held {
            Held::No => {}
            Held::Tokens(at) => crate::pg::wake::due_at(at),
            // A lease ends by an ack (which does not wake pops) or by expiring: look again soon.
            Held::Flight => crate::pg::wake::due_at(now + 50_000),
            // The lane is held back (other keys are still served), and said so.
            Held::Full => {
                pgrx::warning!(
                    "queen: every rate-limit bucket is in use ({BUCKETS}): a lane of a limited key was not claimed; \
                     it is claimed once a bucket is free (one untouched for a minute with no lane in flight)"
                );
                crate::pg::wake::due_at(now + 1_000_000);
            }
        }
        if n > 0 {
            self.granted.push((p, n, taken));
        }
        n
    }

    /// After the read: gives back the tokens of messages a lane was granted but did not
    /// deliver (`delivered(partition)`), and takes a lane that claimed nothing out of
    /// flight.
    pub fn settle(self, delivered: impl Fn(&[u8; 16]) -> i64) {
        if self.granted.is_empty() {
            return;
        }
        // Counted before the lock is taken.
        let got: Vec<i64> = self.granted.iter().map(|(p, ..)| delivered(p)).collect();
        shared().exclusive(|mut buckets| {
            for ((p, granted, taken), &got) in self.granted.iter().zip(&got) {
                for t in taken {
                    let Some(b) = buckets.get(&t.key) else {
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
        });
    }
}

/// `Gate::admit`'s work under the buckets' lock: every matching limit's bucket lets the
/// lane in (flight) and grants tokens, or the lane takes nothing and what was taken goes
/// back. Pure Rust: no ERROR may be raised while the lock is held.
fn take(
    mut buckets: Buckets<'_>,
    matching: &[(BucketKey, &Limit)],
    p: [u8; 16],
    leases: bool,
    want: i64,
    now: i64,
) -> (i64, Vec<Taken>, Held) {
    // Whether a lane a bucket let in is still in flight (the lane registry, read in shared
    // mode under the buckets' lock: the one place queen nests two of its LWLocks, always
    // in this order, docs/locking.md).
    let flying = |b: &BucketKey, q: &[u8; 16]| {
        crate::lane::registry::maybe_in_flight(
            &queen_core::lanes::LaneKey { database: b.database, partition: *q, group: b.group },
            now,
        )
    };
    let mut n = want;
    let mut taken: Vec<Taken> = Vec::new();
    let mut held = Held::No;
    for &(key, l) in matching {
        let Some(b) = buckets.find_or_make(&key, l.capacity(), now, flying) else {
            held = Held::Full;
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
