//! Lease budget math: the lease a consumer group's budget asks for and whether a handler
//! may still start under a lease. (The precedence of lease times is `policy`'s.) Durations are microseconds, as PostgreSQL intervals are.

pub const MICROS: i64 = 1_000_000;

/// A consumer group's stored lease budget (`queen.configure_group`), in microseconds.
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
