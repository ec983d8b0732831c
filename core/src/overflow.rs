//! Maximum depth and the overflow policy of a group (docs/concepts.md#maximum-depth):
//! when a push is refused because the queue is full, and how far a `skip` group moves.
//!
//! - A lane's lag is the number of offsets between its cursor and the partition's
//!   readable end, not counting what retention deleted (`lag`).
//! - The queue's depth is the lag of its slowest `hold` group, summed over the
//!   partitions. Before any group exists, every stored offset counts (`depth`).
//! - A push of `n` messages is refused when the depth would pass the queue's
//!   `max_depth`, or when the lag of a `hold` group in the pushed partition would pass that
//!   group's `max_lag` (`push_refusal`).
//! - A `skip` group never holds producers back: past its `max_lag` in a partition, its
//!   cursor moves past its oldest messages there (`skip_span`), and the span is filed as
//!   one dead letter.

use crate::policy::Violation;

/// What a group does when its lag passes its `max_lag`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnOverflow {
    /// Producers are refused (the default).
    Hold,
    /// The group's oldest messages are passed over, and recorded as a dead letter.
    Skip,
}

impl OnOverflow {
    pub fn as_str(self) -> &'static str {
        match self {
            OnOverflow::Hold => "hold",
            OnOverflow::Skip => "skip",
        }
    }
}

/// Checks `configure_group`'s overflow arguments: `on_overflow` is 'hold' or 'skip';
/// `max_lag`, when given, is at least 1; 'skip' needs a `max_lag` (without one it would
/// have nothing to keep to).
pub fn check_group(max_lag: Option<i64>, on_overflow: &str) -> Result<OnOverflow, Violation> {
    let policy = match on_overflow {
        "hold" => OnOverflow::Hold,
        "skip" => OnOverflow::Skip,
        other => return Err(Violation::invalid("on_overflow", format!("{other:?} (must be 'hold' or 'skip')"))),
    };
    match max_lag {
        Some(m) if m < 1 => {
            Err(Violation::invalid("max_lag", format!("{m} (must be at least 1, or NULL for no limit)")))
        }
        None if policy == OnOverflow::Skip => {
            Err(Violation::invalid("max_lag", "NULL with on_overflow 'skip' (a skipping group needs a max_lag)"))
        }
        _ => Ok(policy),
    }
}

/// A lane's lag: the offsets after its cursor `committed` up to the readable end
/// `readable`, less those retention deleted (up to `retained_through`). A cursor never
/// stands below the retention mark (retention deletes only what every cursor passed, and
/// `seek` clamps to it), so this is `readable - committed`, as `status` and `totals`
/// show it; the mark is a guard.
pub fn lag(committed: i64, retained_through: i64, readable: i64) -> i64 {
    (readable - committed.max(retained_through)).max(0)
}

/// The SQL form of `lag` over columns or expressions (string literals), for `concat!`
/// into kept statements. Pinned to `lag` by the in-server test
/// `rule_sql_forms_agree_with_core`.
#[macro_export]
macro_rules! lag_sql {
    ($committed:literal, $retained:literal, $readable:literal) => {
        concat!("greatest(", $readable, " - greatest(", $committed, ", ", $retained, "), 0)")
    };
}

/// The queue's depth: with no group, every stored offset (`stored`); otherwise the lag of
/// the slowest `hold` group (`hold_lags`, one total per group), or 0 when every group
/// skips.
pub fn depth(stored: i64, any_group: bool, hold_lags: impl IntoIterator<Item = i64>) -> i64 {
    if any_group {
        hold_lags.into_iter().max().unwrap_or(0)
    } else {
        stored
    }
}

/// Why a push is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The queue's depth would pass its `max_depth`.
    Queue { depth: i64, max_depth: i64 },
    /// A `hold` group's lag in the pushed partition would pass its `max_lag`.
    Group { group: String, lag: i64, max_lag: i64 },
}

/// Whether a push of `n` messages is refused: by the queue's `max_depth` against its
/// `depth`, or by a `hold` group's `max_lag` against its lag in the pushed partition
/// (`groups`: name, lag there, max_lag). A push that brings the depth to exactly
/// `max_depth` is allowed.
pub fn push_refusal<'a>(
    n: i64,
    max_depth: Option<i64>,
    depth: i64,
    groups: impl IntoIterator<Item = (&'a str, i64, i64)>,
) -> Option<Refusal> {
    if let Some(max_depth) = max_depth {
        if depth.saturating_add(n) > max_depth {
            return Some(Refusal::Queue { depth, max_depth });
        }
    }
    groups
        .into_iter()
        .find(|&(_, lag, max_lag)| lag.saturating_add(n) > max_lag)
        .map(|(g, lag, max_lag)| Refusal::Group { group: g.to_string(), lag, max_lag })
}

/// How long a backend trusts a headroom it read (microseconds): meanwhile its pushes that
/// the headroom covers pass without reading the queue again.
pub const HEADROOM_FRESH_US: i64 = 20_000;

/// Whether a push of `n` may pass on a headroom (messages a limit still allows) read
/// `age_us` ago and lowered by every push of this backend since: only while it is fresh
/// and covers `n`. Otherwise the push reads again, and is refused only on that fresh read.
/// So a backend never refuses on stale numbers; what it may miss is other sessions'
/// pushes of the last `HEADROOM_FRESH_US`.
pub fn headroom_covers(headroom: i64, age_us: i64, n: i64) -> bool {
    (0..HEADROOM_FRESH_US).contains(&age_us) && headroom >= n
}

/// The span a `skip` group's lane passes over, first and last offset: its oldest
/// messages, so that `max_lag` are left after its cursor. None when the lane is within
/// its `max_lag`.
pub fn skip_span(committed: i64, retained_through: i64, readable: i64, max_lag: i64) -> Option<(i64, i64)> {
    if lag(committed, retained_through, readable) <= max_lag {
        return None;
    }
    Some((committed.max(retained_through) + 1, readable - max_lag))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn group_arguments() {
        assert_eq!(check_group(None, "hold"), Ok(OnOverflow::Hold));
        assert_eq!(check_group(Some(1), "skip"), Ok(OnOverflow::Skip));
        assert_eq!(check_group(None, "skip").unwrap_err().argument, "max_lag");
        assert_eq!(check_group(Some(0), "hold").unwrap_err().argument, "max_lag");
        assert_eq!(check_group(Some(5), "drop").unwrap_err().argument, "on_overflow");
    }

    #[test]
    fn depth_is_the_slowest_hold_group_or_everything_stored() {
        assert_eq!(depth(50, false, []), 50);
        assert_eq!(depth(50, true, [3, 9, 4]), 9);
        assert_eq!(depth(50, true, []), 0, "every group skips");
    }

    #[test]
    fn a_push_to_exactly_max_depth_passes() {
        assert_eq!(push_refusal(1, Some(10), 9, []), None);
        assert_eq!(push_refusal(2, Some(10), 9, []), Some(Refusal::Queue { depth: 9, max_depth: 10 }));
        assert_eq!(push_refusal(11, Some(10), 0, []), Some(Refusal::Queue { depth: 0, max_depth: 10 }));
        assert_eq!(push_refusal(1, None, i64::MAX, []), None);
        assert_eq!(
            push_refusal(1, None, 0, [("a", 2, 5), ("b", 5, 5)]),
            Some(Refusal::Group { group: "b".into(), lag: 5, max_lag: 5 })
        );
        assert_eq!(push_refusal(1, Some(100), 0, [("a", 4, 5)]), None);
    }

    #[test]
    fn a_cached_headroom_passes_only_while_fresh_and_enough() {
        assert!(headroom_covers(5, 0, 5));
        assert!(!headroom_covers(4, 0, 5));
        assert!(!headroom_covers(100, HEADROOM_FRESH_US, 1), "stale");
        assert!(!headroom_covers(100, -1, 1), "a clock that went back reads again");
    }

    #[test]
    fn skip_keeps_max_lag() {
        assert_eq!(skip_span(0, 0, 10, 10), None);
        assert_eq!(skip_span(0, 0, 11, 10), Some((1, 1)));
        assert_eq!(skip_span(5, 0, 100, 10), Some((6, 90)));
        // Retention deleted up to 50: only what is stored is skipped.
        assert_eq!(skip_span(5, 50, 100, 10), Some((51, 90)));
        assert_eq!(skip_span(5, 95, 100, 10), None);
    }

    proptest! {
        /// After a skip the lane's lag is exactly max_lag, and the span is what it passed.
        #[test]
        fn a_skip_leaves_max_lag(committed in 0i64..1000, retained in 0i64..1000, more in 0i64..1000, max_lag in 1i64..500) {
            let readable = committed.max(retained) + more;
            match skip_span(committed, retained, readable, max_lag) {
                None => prop_assert!(lag(committed, retained, readable) <= max_lag),
                Some((from, to)) => {
                    prop_assert!(from <= to);
                    prop_assert_eq!(from, committed.max(retained) + 1);
                    prop_assert_eq!(lag(to, retained, readable), max_lag);
                    prop_assert_eq!(to - from + 1 + max_lag, lag(committed, retained, readable));
                }
            }
        }
    }
}
