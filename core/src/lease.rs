//! Lease math: the effective lease time of a pop (spec §4) and the consumer budget
//! (spec §8, seed 001). Durations are microseconds, as PostgreSQL intervals are.

/// Lease time when nothing else says: an unknown queue or a failed lookup.
pub const DEFAULT_LEASE_SECONDS: i64 = 60;
/// Lease time a queue gets when a push creates it implicitly.
pub const IMPLICIT_QUEUE_LEASE_SECONDS: i32 = 60;
/// Lease time `configure` stores unless told otherwise.
pub const CONFIGURED_LEASE_SECONDS: i32 = 300;

pub const MICROS: i64 = 1_000_000;

/// A consumer group's stored lease budget (spec §8), in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub handler_timeout: i64,
    pub queue_margin: i64,
    pub timeout_grace: i64,
    pub record_margin: i64,
}

impl Budget {
    /// Lease length of a claim: all four allowances, shared by every message of the claim.
    pub fn lease_micros(&self) -> i64 {
        self.queue_margin
            .saturating_add(self.handler_timeout)
            .saturating_add(self.timeout_grace)
            .saturating_add(self.record_margin)
    }

    /// Remaining lease time needed to start a handler with `handler_timeout`.
    pub fn start_requirement(&self, handler_timeout: i64) -> i64 {
        handler_timeout.saturating_add(self.timeout_grace).saturating_add(self.record_margin)
    }

    /// True when `remaining` lease time covers a handler's full timeout plus the grace and
    /// the record margin. An expired lease (`remaining <= 0`) never may start.
    pub fn may_start(&self, remaining: i64, handler_timeout: i64) -> bool {
        remaining > 0 && remaining >= self.start_requirement(handler_timeout)
    }
}

/// Effective lease of a pop, in microseconds: `lease_seconds` when > 0; else the group's
/// budget; else the queue's stored `lease_time`; else 60 s.
/// `budget_micros` is the group's stored budget as `Budget::lease_micros` (or the same sum
/// computed in SQL); None or 0 when the group has none.
pub fn effective_lease_micros(lease_seconds: i32, budget_micros: Option<i64>, queue_lease_time: Option<i32>) -> i64 {
    if lease_seconds > 0 {
        return i64::from(lease_seconds) * MICROS;
    }
    if let Some(b) = budget_micros.filter(|&b| b > 0) {
        return b;
    }
    match queue_lease_time {
        Some(s) if s > 0 => i64::from(s) * MICROS,
        _ => DEFAULT_LEASE_SECONDS * MICROS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: Budget = Budget {
        handler_timeout: 30 * MICROS,
        queue_margin: 15 * MICROS,
        timeout_grace: MICROS,
        record_margin: 2 * MICROS,
    };

    #[test]
    fn precedence() {
        assert_eq!(effective_lease_micros(2, Some(SEED.lease_micros()), Some(300)), 2 * MICROS);
        assert_eq!(effective_lease_micros(0, Some(SEED.lease_micros()), Some(300)), 48 * MICROS);
        assert_eq!(effective_lease_micros(0, Some(0), Some(300)), 300 * MICROS);
        assert_eq!(effective_lease_micros(0, None, Some(5)), 5 * MICROS);
        assert_eq!(effective_lease_micros(0, None, None), 60 * MICROS);
    }

    #[test]
    fn seed_worked_example() {
        // 48 s lease; handlers of 10 s each: message 1 starts at 48, 2 at 38, 3 at 28.
        assert_eq!(SEED.lease_micros(), 48 * MICROS);
        assert_eq!(SEED.start_requirement(SEED.handler_timeout), 33 * MICROS);
        assert!(SEED.may_start(48 * MICROS, SEED.handler_timeout));
        assert!(SEED.may_start(38 * MICROS, SEED.handler_timeout));
        assert!(!SEED.may_start(28 * MICROS, SEED.handler_timeout));
        assert!(SEED.may_start(33 * MICROS, SEED.handler_timeout), "boundary is inclusive");
        assert!(!SEED.may_start(0, 0));
    }
}
