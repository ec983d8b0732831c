//! Rate limits and concurrency caps per key (docs/concepts.md#rate-limits-and-concurrency-caps): the rules, and
//! the shared-memory table of buckets the extension keeps them in.
//!
//! - A limit belongs to a (queue, consumer group) and names a **key**: a partition name
//!   prefix, whose partitions share one bucket, or `*`, which gives every partition a
//!   bucket of its own.
//! - `rate` (messages per second) refills a token bucket of `burst` tokens (1 when not
//!   given); a pop claims at most as many messages of the key as it holds tokens
//!   (`Bucket::take`), and gives back what it claimed but did not deliver (`refund`).
//! - `max_in_flight` caps how many of the key's lanes may be under a live lease of the
//!   group at once. A bucket remembers the lanes it let be claimed (`flight`); one whose
//!   lease ended (acked, expired, or its claim rolled back) no longer counts.

use crate::policy::Violation;
use crate::table::{self, Keyed, Removal};

/// The key that gives each partition a bucket of its own.
pub const EACH: &str = "*";
/// The most lanes a bucket tracks in flight: the highest `max_in_flight`.
pub const MAX_IN_FLIGHT: usize = 32;
/// The highest rate (messages per second) and burst.
pub const MAX_RATE: f64 = 1_000_000.0;
/// The lowest rate: one message a million seconds (about 11.6 days), a floor chosen well
/// above where the wait for a token stops fitting in a timestamp (below about 1e-13;
/// `next_token_at` saturates there anyway).
pub const MIN_RATE: f64 = 1e-6;
pub const MAX_BURST: i32 = 1_000_000;
/// Micro-tokens per token: a bucket counts in millionths, so that slow rates refill
/// smoothly.
const MICRO: i64 = 1_000_000;

/// One configured limit.
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    pub key: String,
    pub rate: Option<f64>,
    pub burst: Option<i32>,
    pub max_in_flight: Option<i32>,
}

impl Limit {
    /// Whether the limit applies to a partition of this name.
    pub fn matches(&self, partition: &str) -> bool {
        self.key == EACH || partition.starts_with(&self.key)
    }

    /// The bucket's capacity: `burst`, or 1 when only a rate is given.
    pub fn capacity(&self) -> i64 {
        i64::from(self.burst.unwrap_or(1))
    }
}

/// Checks `configure_limit`'s arguments. The key is `*` or a partition name prefix (a
/// valid partition name, `names::lane_name`); `rate` is `MIN_RATE` to `MAX_RATE`;
/// `burst` 1 to `MAX_BURST`, and only with a rate; `max_in_flight` 1 to `MAX_IN_FLIGHT`,
/// and only with a prefix (with `*` each partition is its own key, and a lane holds one
/// lease at a time: a cap would mean nothing).
pub fn check(l: &Limit) -> Result<(), Violation> {
    if l.key != EACH {
        if let Err(e) = crate::names::lane_name(&l.key) {
            return Err(Violation::invalid("key", format!("{:?} {e} (give '*' or a partition name prefix)", l.key)));
        }
    }
    if l.key == EACH && l.max_in_flight.is_some() {
        return Err(Violation::invalid(
            "max_in_flight",
            "with key '*' (each partition is a key of its own, and holds one lease at a time): give a partition name prefix",
        ));
    }
    if let Some(r) = l.rate {
        if !(MIN_RATE..=MAX_RATE).contains(&r) {
            return Err(Violation::invalid(
                "rate",
                format!("{r} (must be {MIN_RATE} to {MAX_RATE} messages per second)"),
            ));
        }
    }
    match (l.burst, l.rate) {
        (Some(b), _) if !(1..=MAX_BURST).contains(&b) => {
            return Err(Violation::invalid("burst", format!("{b} (must be 1 to {MAX_BURST})")));
        }
        (Some(_), None) => return Err(Violation::invalid("burst", "given without a rate")),
        _ => {}
    }
    if let Some(m) = l.max_in_flight {
        if !(1..=MAX_IN_FLIGHT as i32).contains(&m) {
            return Err(Violation::invalid("max_in_flight", format!("{m} (must be 1 to {MAX_IN_FLIGHT})")));
        }
    }
    Ok(())
}

/// What a bucket is for: (database, install, queue, group digest, key digest, partition),
/// the partition all zero unless the key is `*`. `install` tells apart the installs of the
/// extension in one database (queue ids start over when it is created again).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BucketKey {
    pub database: u32,
    pub install: u32,
    pub queue_id: i64,
    pub group: [u8; 32],
    pub key: [u8; 32],
    pub partition: [u8; 16],
}

impl BucketKey {
    /// The bucket of `limit` that a partition's lane draws from.
    pub fn new(
        (database, install): (u32, u32),
        queue_id: i64,
        group: &str,
        limit: &Limit,
        partition: [u8; 16],
    ) -> BucketKey {
        use sha2::{Digest, Sha256};
        BucketKey {
            database,
            install,
            queue_id,
            group: crate::lanes::group_digest(group),
            key: Sha256::digest(limit.key.as_bytes()).into(),
            partition: if limit.key == EACH { partition } else { [0; 16] },
        }
    }

    /// The key's bytes, for `table::hash_bytes`.
    fn bytes(&self) -> [u8; 96] {
        let mut b = [0u8; 96];
        b[..4].copy_from_slice(&self.database.to_le_bytes());
        b[4..8].copy_from_slice(&self.install.to_le_bytes());
        b[8..16].copy_from_slice(&self.queue_id.to_le_bytes());
        b[16..48].copy_from_slice(&self.group);
        b[48..80].copy_from_slice(&self.key);
        b[80..].copy_from_slice(&self.partition);
        b
    }
}

/// One bucket: its tokens (in millionths) as of `at` (microseconds), and the lanes
/// (partition ids) it let be claimed that may still be in flight.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Bucket {
    pub used: u32,
    pub flying: u32,
    pub key: BucketKey,
    pub micro: i64,
    pub at: i64,
    /// The rate (its bits) and capacity the tokens were counted for.
    pub rate: u64,
    pub capacity: i64,
    pub flight: [[u8; 16]; MAX_IN_FLIGHT],
}

impl Bucket {
    /// A new bucket starts full.
    pub fn fresh(key: BucketKey, capacity: i64, now: i64) -> Bucket {
        Bucket { used: 1, key, micro: capacity.saturating_mul(MICRO), at: now, capacity, ..Bucket::default() }
    }

    /// A bucket whose limit changed (its rate or burst) starts over, full: a new limit
    /// applies from the next pop. Its lanes in flight stay.
    pub fn reconfigure(&mut self, rate: f64, capacity: i64, now: i64) {
        if self.rate != rate.to_bits() || self.capacity != capacity {
            self.rate = rate.to_bits();
            self.capacity = capacity;
            self.micro = capacity.saturating_mul(MICRO);
            self.at = now;
        }
    }

    /// Refills for the time since `at` at `rate` per second, up to `capacity`.
    pub fn refill(&mut self, rate: f64, capacity: i64, now: i64) {
        let cap = capacity.saturating_mul(MICRO);
        if now > self.at {
            // rate tokens per second = rate millionths per microsecond.
            let gained = ((now - self.at) as f64 * rate).min(cap as f64) as i64;
            self.micro = self.micro.saturating_add(gained).min(cap);
            self.at = now;
        }
        self.micro = self.micro.min(cap);
    }

    /// Takes up to `want` whole tokens; returns how many it took.
    pub fn take(&mut self, want: i64, rate: f64, capacity: i64, now: i64) -> i64 {
        self.reconfigure(rate, capacity, now);
        self.refill(rate, capacity, now);
        let n = want.min(self.micro / MICRO).max(0);
        self.micro -= n * MICRO;
        n
    }

    /// Gives back `n` tokens taken but not used.
    pub fn refund(&mut self, n: i64, capacity: i64) {
        self.micro = self.micro.saturating_add(n.max(0) * MICRO).min(capacity.saturating_mul(MICRO));
    }

    /// When the bucket next holds a whole token (microseconds); `now` if it does.
    pub fn next_token_at(&self, rate: f64, now: i64) -> i64 {
        let mut b = *self;
        b.refill(rate, i64::MAX / MICRO, now);
        if b.micro >= MICRO {
            return now;
        }
        // (A float too large for i64 converts to its largest value.)
        now.saturating_add(((MICRO - b.micro) as f64 / rate).ceil() as i64)
    }

    /// Drops the lanes no longer in flight (`flying(partition)` false), then lets lane
    /// `partition` in when fewer than `max` remain (it is in already: yes). Returns whether
    /// it may be claimed.
    pub fn admit_flight(&mut self, partition: [u8; 16], max: usize, flying: impl Fn(&[u8; 16]) -> bool) -> bool {
        let mut kept = 0;
        for i in 0..self.flying as usize {
            let p = self.flight[i];
            if p == partition || flying(&p) {
                self.flight[kept] = p;
                kept += 1;
            }
        }
        self.flying = kept as u32;
        if self.flight[..kept].contains(&partition) {
            return true;
        }
        if kept >= max.min(MAX_IN_FLIGHT) {
            return false;
        }
        self.flight[kept] = partition;
        self.flying += 1;
        true
    }

    /// Forgets lane `partition` (its claim was not made after all).
    pub fn land(&mut self, partition: &[u8; 16]) {
        let n = self.flying as usize;
        if let Some(i) = self.flight[..n].iter().position(|p| p == partition) {
            self.flight.copy_within(i + 1..n, i);
            self.flying -= 1;
        }
    }
}

/// Buckets form one open-addressing table (`table`), keyed by `BucketKey`.
impl Keyed for Bucket {
    type Key = BucketKey;
    fn is_empty(&self) -> bool {
        self.used == 0
    }
    fn key(&self) -> &BucketKey {
        &self.key
    }
    fn hash(key: &BucketKey) -> u64 {
        table::hash_bytes(&key.bytes())
    }
}

/// The table of buckets in shared memory: `slots` (a power of two of them) and `used`, how
/// many hold a key. At most three quarters are used, so a probe always ends.
pub struct Buckets<'a> {
    pub used: &'a mut u32,
    pub slots: &'a mut [Bucket],
}

impl Buckets<'_> {
    /// `key`'s bucket, if it has one.
    pub fn get(&mut self, key: &BucketKey) -> Option<&mut Bucket> {
        let i = table::find(self.slots, key).ok()?;
        Some(&mut self.slots[i])
    }

    /// How many buckets may be in use when `key`'s is made: three quarters of the slots for
    /// a prefix key, half for a `*` key (one per partition, so there may be thousands).
    /// The quarter between is kept for prefix keys, which are as many as the limits
    /// configured: a `*` limit over many partitions moves its own buckets to the table
    /// fallback, never a prefix key's.
    pub fn room(&self, key: &BucketKey) -> usize {
        let n = self.slots.len();
        if key.partition == [0; 16] {
            n - n / 4
        } else {
            n / 2
        }
    }

    /// `key`'s bucket, made (full) when it has none. When the table holds as many as
    /// `room` allows, an idle bucket is removed first: untouched for a minute, with no lane
    /// still in flight (`flying(bucket key, partition)`; its list is pruned only when its
    /// own key is admitted again). Nothing is lost: should its key come back, it starts
    /// full. None when no bucket is idle.
    pub fn find_or_make(
        &mut self,
        key: &BucketKey,
        capacity: i64,
        now: i64,
        flying: impl Fn(&BucketKey, &[u8; 16]) -> bool,
    ) -> Option<&mut Bucket> {
        let i = match table::find(self.slots, key) {
            Ok(i) => return Some(&mut self.slots[i]),
            Err(i) if (*self.used as usize) < self.room(key) => i,
            Err(_) => {
                let idle = self.slots.iter().position(|b| {
                    b.used != 0
                        && now - b.at > 60_000_000
                        && !b.flight[..b.flying as usize].iter().any(|p| flying(&b.key, p))
                })?;
                self.remove(idle);
                table::find(self.slots, key).expect_err("absent")
            }
        };
        self.slots[i] = Bucket::fresh(*key, capacity, now);
        *self.used += 1;
        Some(&mut self.slots[i])
    }

    /// Empties slot `i` by backward shift (`table::Removal`).
    fn remove(&mut self, i: usize) {
        let mut r = Removal::new(i);
        while let Some((from, to)) = r.next(self.slots) {
            self.slots[to] = self.slots[from];
        }
        self.slots[r.hole()] = Bucket::default();
        *self.used -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limit(key: &str, rate: Option<f64>, burst: Option<i32>, max: Option<i32>) -> Limit {
        Limit { key: key.into(), rate, burst, max_in_flight: max }
    }

    #[test]
    fn arguments() {
        assert!(check(&limit("*", Some(10.0), Some(5), None)).is_ok());
        assert!(check(&limit("t:", Some(10.0), Some(5), Some(2))).is_ok());
        assert_eq!(check(&limit("*", None, None, Some(2))).unwrap_err().argument, "max_in_flight");
        assert_eq!(check(&limit("a b", Some(1.0), None, None)).unwrap_err().argument, "key");
        assert!(check(&limit("tenant-42:", None, None, Some(1))).is_ok());
        assert_eq!(check(&limit("", Some(1.0), None, None)).unwrap_err().argument, "key");
        assert_eq!(check(&limit("*", Some(0.0), None, None)).unwrap_err().argument, "rate");
        assert_eq!(check(&limit("*", Some(f64::NAN), None, None)).unwrap_err().argument, "rate");
        // Slower than one message a million seconds: refused (its next token would lie
        // past what a timestamp holds); the slowest allowed one has a next token in time.
        assert_eq!(check(&limit("*", Some(1e-15), None, None)).unwrap_err().argument, "rate");
        assert!(check(&limit("*", Some(MIN_RATE), None, None)).is_ok());
        let now = 1_000_000_000_000_000;
        let empty = Bucket { at: now, ..Bucket::default() };
        assert_eq!(empty.next_token_at(MIN_RATE, now), now + 1_000_000 * MICRO);
        assert_eq!(empty.next_token_at(1e-300, now), i64::MAX, "saturates, never wraps");
        assert_eq!(check(&limit("*", None, Some(5), None)).unwrap_err().argument, "burst");
        assert_eq!(check(&limit("*", Some(1.0), Some(0), None)).unwrap_err().argument, "burst");
        assert_eq!(check(&limit("t:", None, None, Some(0))).unwrap_err().argument, "max_in_flight");
        assert_eq!(check(&limit("t:", None, None, Some(33))).unwrap_err().argument, "max_in_flight");
    }

    #[test]
    fn keys_match_by_prefix_or_each() {
        assert!(limit("t1:", None, None, None).matches("t1:orders"));
        assert!(!limit("t1:", None, None, None).matches("t10:orders"));
        assert!(limit("*", None, None, None).matches("anything"));
        let k = |l: &Limit, p: u8| BucketKey::new((1, 7), 2, "g", l, [p; 16]);
        let each = limit("*", None, None, None);
        let prefix = limit("t1:", None, None, None);
        assert_ne!(k(&each, 1), k(&each, 2), "each partition its own bucket");
        assert_eq!(k(&prefix, 1), k(&prefix, 2), "one bucket for the prefix");
    }

    #[test]
    fn ten_a_second_with_a_burst_of_five() {
        let key = BucketKey::default();
        let mut b = Bucket::fresh(key, 5, 0);
        // Ten seconds of pops every 10 ms wanting 10 each.
        let mut got = 0;
        let mut t = 0;
        while t <= 10_000_000 {
            got += b.take(10, 10.0, 5, t);
            t += 10_000;
        }
        assert_eq!(got, 5 + 100, "the burst, then ten a second");
        let next = b.next_token_at(10.0, t);
        assert!(next > t && next <= t + 100_000, "the next token within 100 ms: {next} at {t}");
    }

    #[test]
    fn a_changed_limit_starts_full() {
        let mut b = Bucket::fresh(BucketKey::default(), 2, 0);
        assert_eq!(b.take(10, 1.0, 2, 0), 2);
        assert_eq!(b.take(10, 1.0, 2, 1), 0);
        assert_eq!(b.take(100, 100.0, 50, 2), 50, "the new rate and burst, at once");
    }

    #[test]
    fn refunds_never_pass_the_capacity() {
        let mut b = Bucket::fresh(BucketKey::default(), 3, 0);
        assert_eq!(b.take(5, 1.0, 3, 0), 3);
        b.refund(2, 3);
        assert_eq!(b.take(5, 1.0, 3, 0), 2);
        b.refund(10, 3);
        assert_eq!(b.take(5, 1.0, 3, 0), 3);
    }

    #[test]
    fn in_flight_lanes() {
        let mut b = Bucket::default();
        let live = std::cell::RefCell::new(vec![[1u8; 16], [2u8; 16]]);
        let flying = |p: &[u8; 16]| live.borrow().contains(p);
        assert!(b.admit_flight([1; 16], 2, flying));
        assert!(b.admit_flight([2; 16], 2, flying));
        assert!(b.admit_flight([1; 16], 2, flying), "a lane in flight already is in");
        assert!(!b.admit_flight([3; 16], 2, flying), "a third lane waits while two fly");
        live.borrow_mut().retain(|p| p != &[1; 16]);
        assert!(b.admit_flight([3; 16], 2, |p: &[u8; 16]| live.borrow().contains(p)), "lane 1's lease ended");
        b.land(&[3; 16]);
        assert_eq!(b.flying, 1);
    }

    #[test]
    fn a_full_table_reuses_only_idle_buckets() {
        // Four slots: three may be used.
        let (mut used, mut slots) = (0u32, vec![Bucket::default(); 4]);
        let mut t = Buckets { used: &mut used, slots: &mut slots };
        let key = |q| BucketKey { queue_id: q, ..BucketKey::default() };
        let none = |_: &BucketKey, _: &[u8; 16]| false;
        assert!(t.find_or_make(&key(1), 1, 0, none).is_some());
        assert!(t.find_or_make(&key(4), 1, 0, none).is_some());
        let b = t.find_or_make(&key(2), 1, 0, none).unwrap();
        assert!(b.admit_flight([7; 16], 1, |_| true));
        assert!(t.find_or_make(&key(3), 1, 1_000, none).is_none(), "all were used within the minute");
        let flying2 = |k: &BucketKey, _: &[u8; 16]| k.queue_id == 2;
        assert!(t.find_or_make(&key(3), 1, 61_000_000, flying2).is_some());
        assert!(t.get(&key(2)).is_some(), "a bucket with a lane in flight is not reused");
        assert!(t.get(&key(3)).is_some());
        assert_eq!(*t.used, 3);
        // Once its lane landed, it may go too.
        assert!(t.find_or_make(&key(5), 1, 122_000_000, none).is_some(), "its lane landed since: reused");
        assert_eq!(*t.used, 3);
        assert!(t.get(&key(5)).is_some());
    }

    #[test]
    fn each_partition_keys_leave_room_for_prefix_keys() {
        // Eight slots: six may be used, four of them by '*' keys.
        let (mut used, mut slots) = (0u32, vec![Bucket::default(); 8]);
        let mut t = Buckets { used: &mut used, slots: &mut slots };
        let each = |p: u8| BucketKey { queue_id: 1, partition: [p; 16], ..BucketKey::default() };
        let prefix = |q| BucketKey { queue_id: q, ..BucketKey::default() };
        let none = |_: &BucketKey, _: &[u8; 16]| false;
        for p in 1..=4 {
            assert!(t.find_or_make(&each(p), 1, 0, none).is_some());
        }
        assert!(t.find_or_make(&each(5), 1, 0, none).is_none(), "the '*' keys' half is full");
        assert!(t.find_or_make(&prefix(2), 1, 0, none).is_some());
        assert!(t.find_or_make(&prefix(3), 1, 0, none).is_some());
        assert!(t.find_or_make(&prefix(4), 1, 0, none).is_none(), "three quarters in use");
        assert!(t.find_or_make(&each(1), 1, 0, none).is_some(), "a key that has a bucket finds it");
    }

    proptest! {
        /// Whatever the pops, a bucket never grants more than its burst plus what the rate
        /// refilled.
        #[test]
        fn never_more_than_burst_plus_rate(rate in 0.5f64..200.0, burst in 1i64..50, steps in proptest::collection::vec((0i64..200_000, 0i64..20, 0i64..5), 1..200)) {
            let mut b = Bucket::fresh(BucketKey::default(), burst, 0);
            let (mut t, mut got) = (0i64, 0i64);
            for (dt, want, back) in steps {
                t += dt;
                let n = b.take(want, rate, burst, t);
                prop_assert!(n <= want);
                let r = back.min(n);
                b.refund(r, burst);
                got += n - r;
                prop_assert!(got as f64 <= burst as f64 + rate * t as f64 / 1e6 + 1e-6);
            }
        }
    }
}
