//! When the maintenance worker tries a failing step again: 5 s after the first failure,
//! twice as long after each further one in a row, at most 10 minutes. A step is keyed by
//! its pass and object ("compaction: partition …"), so one bad partition costs the others
//! nothing.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The first wait after a failure.
pub const FIRST: Duration = Duration::from_secs(5);
/// The longest wait, and how long past its due time an entry that was not tried again is
/// kept.
pub const LONGEST: Duration = Duration::from_secs(600);

/// The failing steps: failures in a row and when each may run again.
#[derive(Default, Debug)]
pub struct Backoff {
    failing: HashMap<String, (u32, Instant)>,
}

impl Backoff {
    /// Whether the step may run at `now`: it is not failing, or its wait is over.
    pub fn ready(&self, key: &str, now: Instant) -> bool {
        self.failing.get(key).is_none_or(|(_, next)| now >= *next)
    }

    /// The step failed at `now`: it waits twice as long as after its last failure. An entry
    /// whose retry fell due more than `LONGEST` ago and was not tried since is forgotten: its
    /// object is gone (a pass that runs at most every `LONGEST` would have tried it again),
    /// so the failures of deleted partitions and queues do not pile up over a worker's life.
    pub fn failed(&mut self, key: &str, now: Instant) {
        self.failing.retain(|_, (_, next)| now < *next + LONGEST);
        let n = self.failing.get(key).map_or(0, |f| f.0) + 1;
        let wait = FIRST.saturating_mul(1 << (n - 1).min(7)).min(LONGEST);
        self.failing.insert(key.to_string(), (n, now + wait));
    }

    /// The step succeeded: no longer failing.
    pub fn ok(&mut self, key: &str) {
        self.failing.remove(key);
    }

    /// The steps held now.
    pub fn len(&self) -> usize {
        self.failing.len()
    }

    /// Whether no step is failing.
    pub fn is_empty(&self) -> bool {
        self.failing.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_step_waits_twice_as_long_each_time_up_to_ten_minutes() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        assert!(b.ready("k", t0));
        let mut now = t0;
        let mut waits = Vec::new();
        for _ in 0..10 {
            b.failed("k", now);
            let mut w = 0;
            while !b.ready("k", now + Duration::from_secs(w)) {
                w += 1;
            }
            waits.push(w);
            now += Duration::from_secs(w);
        }
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 320, 600, 600, 600]);
        assert!(b.ready("other", now), "one key's failures hold back no other key");
        b.ok("k");
        assert!(b.ready("k", now));
        b.failed("k", now);
        assert!(!b.ready("k", now + Duration::from_secs(4)), "a success starts the count again");
        assert!(b.ready("k", now + Duration::from_secs(5)));
    }

    #[test]
    fn a_key_not_tried_again_is_forgotten_and_one_still_tried_is_kept() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        for i in 0..1000 {
            b.failed(&format!("gone {i}"), t0);
        }
        assert_eq!(b.len(), 1000);
        // "kept" fails again each time it is due, as a step of a live object does.
        let mut now = t0;
        for _ in 0..12 {
            b.failed("kept", now);
            now += LONGEST;
        }
        assert_eq!(b.len(), 1, "the keys never tried again are gone, the one still failing is kept");
        assert!(!b.ready("kept", now - LONGEST + Duration::from_secs(599)));
        // A key is kept until LONGEST past its due time, and forgotten from then on.
        b.failed("late", now);
        b.failed("other", now + FIRST + LONGEST - Duration::from_secs(1));
        assert!(!b.ready("late", now + FIRST - Duration::from_secs(1)), "still held, with its wait");
        b.failed("other", now + FIRST + LONGEST);
        assert!(b.ready("late", now) && b.len() == 1, "forgotten");
    }
}
