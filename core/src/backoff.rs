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
    /// whose retry fell due more than `LONGEST` ago and was not tried since is forgotten, so
    /// the failures of deleted partitions and queues do not pile up over a worker's life.
    /// That also forgets a live step whose pass runs less often than every `LONGEST` (a
    /// `queen.retention_interval` over 10 minutes): it then starts again at `FIRST`, which
    /// is shorter than its pass's interval anyway, so it is tried at the next pass as before.
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
            b.failed(&format!("gone {i}"), t0); // due at t0 + 5 s, never tried again
        }
        assert_eq!(b.failing.len(), 1000);
        // "kept" fails again each time its pass comes round, as a step of a live object does.
        let mut now = t0;
        for _ in 0..12 {
            b.failed("kept", now);
            now += LONGEST;
        }
        assert_eq!(b.failing.keys().collect::<Vec<_>>(), ["kept"], "the keys never tried again are gone");

        // One key, failed once at `at`: due at `at + FIRST`, forgotten from `LONGEST` past that.
        let mut b = Backoff::default();
        let at = t0;
        let due = at + FIRST;
        b.failed("late", at);
        b.failed("other", due + LONGEST - Duration::from_secs(1));
        assert!(b.failing.contains_key("late"), "kept until LONGEST past its due time");
        assert!(!b.ready("late", due - Duration::from_secs(1)), "with its wait");
        b.failed("other", due + LONGEST);
        assert!(!b.failing.contains_key("late"), "forgotten from then on");
        assert!(b.ready("late", at), "and ready at once");
    }
}
