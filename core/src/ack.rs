//! Ack arithmetic: an ack is an offset commit (docs/functions.md#ack).
//!
//! `plan_lane` takes one lane's state and the ack items addressed to it, and decides
//! where the cursor goes, whether the lease is released, what happens to the retry
//! budget, and which offset (if any) is dead-lettered or dropped. It touches no storage,
//! so every rule of an ack is unit tested here.

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckStatus {
    Completed,
    Failed,
    Retry,
    Dlq,
}

impl AckStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            AckStatus::Completed => "completed",
            AckStatus::Failed => "failed",
            AckStatus::Retry => "retry",
            AckStatus::Dlq => "dlq",
        }
    }
    /// `failed`, `retry` and `dlq` are explicit signals; `completed` is not.
    pub fn is_signal(self) -> bool {
        self != AckStatus::Completed
    }
}

impl FromStr for AckStatus {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "completed" => Ok(AckStatus::Completed),
            "failed" => Ok(AckStatus::Failed),
            "retry" => Ok(AckStatus::Retry),
            "dlq" => Ok(AckStatus::Dlq),
            _ => Err(()),
        }
    }
}

impl fmt::Display for AckStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One ack item for a lane, in the order the caller sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckItem {
    pub offset: i64,
    pub status: AckStatus,
    pub error: Option<String>,
    /// With `failed` or `retry`: how long (microseconds) the lane waits before the
    /// message is delivered again, instead of the queue's backoff.
    pub retry_after: Option<i64>,
}

/// The leased state of a lane, as read under its row lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneState {
    pub committed: i64,
    pub batch_end: i64,
    pub retry_count: i32,
}

/// The queue options that decide what an exhausted `failed` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub retry_limit: i32,
    /// True when `dead_letter_queue` or `dlq_after_max_retries` is set.
    pub dead_lettering: bool,
    /// The queue's `retry_backoff` and `retry_backoff_max` (microseconds; 0: none).
    pub retry_backoff: i64,
    pub retry_backoff_max: i64,
}

/// What happened to one item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemOutcome {
    /// Committed (or the signal was applied).
    Applied,
    /// The item's offset was dead-lettered.
    DeadLettered,
    /// The item's offset was dropped (dead-lettering off, budget exhausted).
    Dropped,
    /// Outside `(committed, batch_end]`: reported, not applied.
    OutsideSpan,
    /// Above the lowest explicit signal of the call: not applied.
    AboveSignal { signal_offset: i64 },
    /// At the offset of the lowest explicit signal, with another status (a `completed`
    /// beside a `failed` of the same message, or two different signals): not applied,
    /// since the signal decides what happens to that message.
    BesideSignal { signal: AckStatus },
}

impl ItemOutcome {
    pub fn success(&self) -> bool {
        matches!(self, ItemOutcome::Applied | ItemOutcome::DeadLettered | ItemOutcome::Dropped)
    }
}

/// What to do with the signalled offset E.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposal {
    None,
    DeadLetter { offset: i64, error: String, retry_count: i32 },
    Drop { offset: i64 },
}

/// The decision for one lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanePlan {
    pub committed: i64,
    pub release: bool,
    pub retry_count: i32,
    /// True when the redelivery counter resets (clean completion or a disposal).
    pub reset_attempts: bool,
    /// When the plan releases the lane for a redelivery (`failed` within its budget, or
    /// `retry`): the pause before it, in microseconds. The item's `retry_after` if it has
    /// one, else for `failed` the queue's backoff; None for an immediate redelivery.
    pub retry_after: Option<i64>,
    pub disposal: Disposal,
    /// One outcome per input item, same order.
    pub items: Vec<ItemOutcome>,
}

pub const RETRIES_EXHAUSTED: &str = "Retries exhausted";

/// Applies the ack items of one lane. `call_error` is the first error given anywhere in
/// the ack call (any lane), the fallback for a dead-letter record.
pub fn plan_lane(lane: LaneState, items: &[AckItem], policy: RetryPolicy, call_error: Option<&str>) -> LanePlan {
    let in_span = |o: i64| o > lane.committed && o <= lane.batch_end;

    // The lowest explicit signal, first in input order among equals.
    let signal = items.iter().filter(|i| in_span(i.offset) && i.status.is_signal()).min_by_key(|i| i.offset);

    let outcomes: Vec<ItemOutcome> = items
        .iter()
        .map(|i| {
            if !in_span(i.offset) {
                ItemOutcome::OutsideSpan
            } else {
                match signal {
                    Some(e) if i.offset > e.offset => ItemOutcome::AboveSignal { signal_offset: e.offset },
                    Some(e) if i.offset == e.offset && i.status != e.status => {
                        ItemOutcome::BesideSignal { signal: e.status }
                    }
                    _ => ItemOutcome::Applied,
                }
            }
        })
        .collect();

    let Some(e) = signal else {
        let highest = items.iter().filter(|i| in_span(i.offset)).map(|i| i.offset).max().unwrap_or(lane.committed);
        let complete = highest == lane.batch_end;
        return LanePlan {
            committed: highest.max(lane.committed),
            release: complete,
            retry_count: if complete { 0 } else { lane.retry_count },
            reset_attempts: complete,
            retry_after: None,
            disposal: Disposal::None,
            items: outcomes,
        };
    };

    signal_plan(lane, items, e, outcomes, policy, call_error)
}

/// The plan of a lane whose lowest explicit signal is `e`: everything below it is
/// committed, and `e` decides the rest (a redelivery, after a backoff when asked or when
/// it failed within its retry budget; else the message at `e` is dead-lettered or
/// dropped and passed).
fn signal_plan(
    lane: LaneState,
    items: &[AckItem],
    e: &AckItem,
    mut outcomes: Vec<ItemOutcome>,
    policy: RetryPolicy,
    call_error: Option<&str>,
) -> LanePlan {
    let mut plan = LanePlan {
        committed: e.offset - 1,
        release: true,
        retry_count: lane.retry_count,
        reset_attempts: false,
        retry_after: None,
        disposal: Disposal::None,
        items: Vec::new(),
    };
    let exhausted = e.status == AckStatus::Failed && lane.retry_count >= policy.retry_limit;
    match e.status {
        AckStatus::Retry => plan.retry_after = e.retry_after.filter(|&d| d > 0),
        AckStatus::Failed if !exhausted => {
            plan.retry_count = lane.retry_count + 1;
            let backoff =
                crate::policy::backoff_delay(policy.retry_backoff, policy.retry_backoff_max, plan.retry_count);
            plan.retry_after = e.retry_after.or(Some(backoff)).filter(|&d| d > 0);
        }
        _ => {
            // dlq, or failed with no budget left
            plan.committed = e.offset;
            plan.retry_count = 0;
            plan.reset_attempts = true;
            let mark = if policy.dead_lettering {
                let error = e.error.as_deref().or(call_error).unwrap_or(RETRIES_EXHAUSTED).to_string();
                plan.disposal = Disposal::DeadLetter { offset: e.offset, error, retry_count: lane.retry_count };
                ItemOutcome::DeadLettered
            } else {
                plan.disposal = Disposal::Drop { offset: e.offset };
                ItemOutcome::Dropped
            };
            for (item, out) in items.iter().zip(outcomes.iter_mut()) {
                if item.offset == e.offset && *out == ItemOutcome::Applied {
                    *out = mark.clone();
                }
            }
        }
    }
    plan.items = outcomes;
    plan
}

/// An ack item's `offset` given as a JSON number: an integral value, `7` or `7.0` (as a
/// client that holds numbers as floats writes it). `text` is the number as jsonb writes it
/// (plain decimal: `7e0` becomes `7`). None when it is not an integer of 64 bits.
pub fn offset_from_number(text: &str) -> Option<i64> {
    let whole = match text.split_once('.') {
        Some((whole, fraction)) if !fraction.is_empty() && fraction.bytes().all(|c| c == b'0') => whole,
        Some(_) => return None,
        None => text,
    };
    if !crate::addresses::is_integer(whole) {
        return None;
    }
    whole.parse().ok()
}

/// An ack item's `offset` given as a JSON string, for clients whose numbers cannot hold
/// 64 bits: digits alone (`"7"`), no sign. None otherwise.
pub fn offset_from_string(text: &str) -> Option<i64> {
    if text.is_empty() || !text.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use AckStatus::*;

    #[test]
    fn an_offset_is_an_integral_json_number_or_a_string_of_digits() {
        assert_eq!(offset_from_number("7"), Some(7));
        assert_eq!(offset_from_number("7.0"), Some(7));
        assert_eq!(offset_from_number("7.000"), Some(7));
        assert_eq!(offset_from_number("-3"), Some(-3));
        assert_eq!(offset_from_number("9223372036854775807"), Some(i64::MAX));
        for bad in ["7.5", "7.", ".0", "", "-", "1e3", "9223372036854775808", "true", "null", "+7"] {
            assert_eq!(offset_from_number(bad), None, "{bad:?}");
        }
        assert_eq!(offset_from_string("7"), Some(7));
        for bad in ["+5", "-5", " 5", "5 ", "", "7.0", "0x10", "9223372036854775808"] {
            assert_eq!(offset_from_string(bad), None, "{bad:?}");
        }
    }

    fn item(offset: i64, status: AckStatus) -> AckItem {
        AckItem { offset, status, error: None, retry_after: None }
    }
    const POLICY: RetryPolicy =
        RetryPolicy { retry_limit: 3, dead_lettering: true, retry_backoff: 0, retry_backoff_max: 0 };
    const LANE: LaneState = LaneState { committed: 10, batch_end: 16, retry_count: 0 };

    #[test]
    fn a_redelivery_waits_for_retry_after_or_the_queue_backoff() {
        let backoff = RetryPolicy { retry_backoff: 1_000_000, retry_backoff_max: 3_000_000, ..POLICY };
        let after = |d| AckItem { retry_after: Some(d), ..item(12, Failed) };
        // No backoff and no retry_after: redelivered at once, as before.
        assert_eq!(plan_lane(LANE, &[item(12, Failed)], POLICY, None).retry_after, None);
        // The queue's backoff grows with the batch's failed acks, up to its cap.
        let delays: Vec<Option<i64>> = (0..4)
            .map(|r| plan_lane(LaneState { retry_count: r, ..LANE }, &[item(12, Failed)], backoff, None).retry_after)
            .collect();
        // (The 4th failure exhausts the budget of 3: dead-lettered, nothing to redeliver.)
        assert_eq!(delays, vec![Some(1_000_000), Some(2_000_000), Some(3_000_000), None]);
        // retry_after wins over the backoff, and applies to `retry` too (which has no backoff).
        assert_eq!(plan_lane(LANE, &[after(5)], backoff, None).retry_after, Some(5));
        assert_eq!(
            plan_lane(LANE, &[AckItem { retry_after: Some(7), ..item(12, Retry) }], POLICY, None).retry_after,
            Some(7)
        );
        assert_eq!(plan_lane(LANE, &[item(12, Retry)], backoff, None).retry_after, None);
        assert_eq!(plan_lane(LANE, &[after(0)], backoff, None).retry_after, None, "0: at once");
        // A completion or a disposal releases nothing to wait for.
        assert_eq!(plan_lane(LANE, &[item(16, Completed)], backoff, None).retry_after, None);
        assert_eq!(
            plan_lane(LANE, &[AckItem { retry_after: Some(9), ..item(12, Dlq) }], backoff, None).retry_after,
            None
        );
    }

    #[test]
    fn cumulative_commit_and_completion() {
        let p = plan_lane(LANE, &[item(12, Completed)], POLICY, None);
        assert_eq!((p.committed, p.release), (12, false));
        let p = plan_lane(LANE, &[item(16, Completed)], POLICY, None);
        assert_eq!((p.committed, p.release, p.retry_count, p.reset_attempts), (16, true, 0, true));
    }

    #[test]
    fn clean_completion_resets_budget() {
        let lane = LaneState { retry_count: 2, ..LANE };
        let p = plan_lane(lane, &[item(16, Completed)], POLICY, None);
        assert_eq!(p.retry_count, 0);
        let p = plan_lane(lane, &[item(15, Completed)], POLICY, None);
        assert_eq!(p.retry_count, 2, "partial progress keeps the counter");
    }

    #[test]
    fn outside_span_is_reported_not_applied() {
        let p = plan_lane(LANE, &[item(10, Completed), item(17, Completed)], POLICY, None);
        assert_eq!(p.items, vec![ItemOutcome::OutsideSpan, ItemOutcome::OutsideSpan]);
        assert_eq!((p.committed, p.release), (10, false));
    }

    #[test]
    fn issue_example_failed_in_the_middle() {
        // span 11..16: [completed 11, completed 12, failed 14, completed 15]
        let items = [item(11, Completed), item(12, Completed), item(14, Failed), item(15, Completed)];
        let p = plan_lane(LANE, &items, POLICY, None);
        assert_eq!(p.committed, 13);
        assert!(p.release);
        assert_eq!(p.retry_count, 1);
        assert_eq!(p.items[3], ItemOutcome::AboveSignal { signal_offset: 14 });
        assert_eq!(p.disposal, Disposal::None);
    }

    #[test]
    fn retry_never_charges() {
        let p = plan_lane(LaneState { retry_count: 3, ..LANE }, &[item(11, Retry)], POLICY, None);
        assert_eq!((p.committed, p.release, p.retry_count), (10, true, 3));
        assert_eq!(p.disposal, Disposal::None);
    }

    #[test]
    fn exhausted_failed_dead_letters_with_error_chain() {
        let lane = LaneState { retry_count: 3, ..LANE };
        let mut e = item(12, Failed);
        e.error = Some("boom".into());
        let p = plan_lane(lane, &[item(11, Completed), e.clone()], POLICY, Some("other"));
        assert_eq!(p.committed, 12);
        assert_eq!(p.disposal, Disposal::DeadLetter { offset: 12, error: "boom".into(), retry_count: 3 });
        assert_eq!((p.retry_count, p.reset_attempts), (0, true));
        let p = plan_lane(lane, &[item(12, Failed)], POLICY, Some("other"));
        assert!(matches!(p.disposal, Disposal::DeadLetter { ref error, .. } if error == "other"));
        let p = plan_lane(lane, &[item(12, Failed)], POLICY, None);
        assert!(matches!(p.disposal, Disposal::DeadLetter { ref error, .. } if error == RETRIES_EXHAUSTED));
        assert_eq!(p.items[0], ItemOutcome::DeadLettered);
    }

    #[test]
    fn dlq_ignores_budget_and_switches_off_drop() {
        let p = plan_lane(LANE, &[item(11, Dlq)], POLICY, None);
        assert!(matches!(p.disposal, Disposal::DeadLetter { offset: 11, retry_count: 0, .. }));
        let off = RetryPolicy { dead_lettering: false, ..POLICY };
        let p = plan_lane(LANE, &[item(11, Dlq)], off, None);
        assert_eq!(p.disposal, Disposal::Drop { offset: 11 });
        assert_eq!((p.committed, p.items[0].clone()), (11, ItemOutcome::Dropped));
    }

    #[test]
    fn an_item_beside_the_signal_at_its_offset_is_not_applied() {
        // A completion and a failure of the same message: the failure decides, the
        // completion is reported as not applied (the message comes again).
        let p = plan_lane(LANE, &[item(12, Completed), item(12, Failed)], POLICY, None);
        assert_eq!(p.items, vec![ItemOutcome::BesideSignal { signal: Failed }, ItemOutcome::Applied]);
        assert_eq!((p.committed, p.retry_count), (11, 1));
        // A dead letter beside a completion: only the dlq item reports the filing.
        let p = plan_lane(LANE, &[item(12, Dlq), item(12, Completed)], POLICY, None);
        assert_eq!(p.items, vec![ItemOutcome::DeadLettered, ItemOutcome::BesideSignal { signal: Dlq }]);
        // The same signal twice is one signal, applied.
        let p = plan_lane(LANE, &[item(12, Retry), item(12, Retry)], POLICY, None);
        assert_eq!(p.items, vec![ItemOutcome::Applied, ItemOutcome::Applied]);
        // Two different signals: the first in input order decides.
        let p = plan_lane(LANE, &[item(12, Retry), item(12, Dlq)], POLICY, None);
        assert_eq!(p.items, vec![ItemOutcome::Applied, ItemOutcome::BesideSignal { signal: Retry }]);
        assert_eq!(p.disposal, Disposal::None);
    }

    proptest! {
        /// Invariants for any input: the cursor never moves backwards, never passes
        /// batch_end, and never passes the lowest explicit signal.
        #[test]
        fn prop_cursor_bounds(committed in 0i64..50, len in 1i64..50, retry in 0i32..5,
                              raw in proptest::collection::vec((0i64..120, 0u8..4), 0..20)) {
            let lane = LaneState { committed, batch_end: committed + len, retry_count: retry };
            let items: Vec<AckItem> = raw.iter().map(|&(o, s)| item(o, [Completed, Failed, Retry, Dlq][s as usize])).collect();
            let p = plan_lane(lane, &items, POLICY, None);
            prop_assert!(p.committed >= lane.committed);
            prop_assert!(p.committed <= lane.batch_end);
            prop_assert_eq!(p.items.len(), items.len());
            if let Some(e) = items.iter().filter(|i| i.offset > committed && i.offset <= lane.batch_end && i.status.is_signal()).map(|i| i.offset).min() {
                prop_assert!(p.committed == e - 1 || p.committed == e);
                prop_assert!(p.release);
            }
            if p.release && p.disposal == Disposal::None && p.committed == lane.batch_end {
                prop_assert_eq!(p.retry_count, 0);
            }
            // An item reported as applied says what happened: at or above the cursor's
            // new place, only the deciding signal's own status can have been applied.
            let decided = items
                .iter()
                .filter(|i| i.offset > committed && i.offset <= lane.batch_end && i.status.is_signal())
                .min_by_key(|i| i.offset)
                .map(|i| i.status);
            for (i, out) in items.iter().zip(&p.items) {
                if out.success() && i.offset > p.committed {
                    prop_assert_eq!(Some(i.status), decided, "{:?} reported applied above the cursor", i);
                }
            }
        }
    }
}
