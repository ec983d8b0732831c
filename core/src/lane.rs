//! One lane — a (partition, consumer group) pair — as a state machine: when it may be
//! claimed, and what a claim, an auto-ack, an ack, an extend, a release and an expiry do to
//! it. The extension applies these transitions to the lane's row (or its registry slot);
//! this module decides them, and its property tests hold the invariants:
//! the cursor never moves backwards, nothing past the cursor is skipped, an ack that does
//! not hold the live lease changes nothing, and a batch's failed acks are bounded by the
//! queue's retry limit before its message is dead-lettered or dropped.
//!
//! Times are microseconds on PostgreSQL's clock (`clock_timestamp()`); offsets are the
//! partition's, and `committed` is the last offset the group is done with.

use crate::ack::{plan_lane, AckItem, AckStatus, LanePlan, LaneState, RetryPolicy};

/// A lease is live while its expiry is in the future; an expired lease is the same as none.
pub fn lease_live(lease_expires: Option<i64>, now: i64) -> bool {
    lease_expires.is_some_and(|e| e > now)
}

// Storage of a retry backoff (`Lane::retry_at`): a lane row (and a registry slot) keeps it
// in its lease expiry while it has no lease: `lease_id` NULL (all zero in the registry)
// with `lease_expires_at` in the future is a lane that waits out a backoff. So "no live
// lease and no backoff" is one test of one column, as before backoffs existed.

/// The SQL form of `lease_live` over a lane row aliased `$lane`, with `$now` the clock
/// (a placeholder such as `"$3"`): a string literal, for `concat!` into kept statements.
#[macro_export]
macro_rules! lease_live_sql {
    ($lane:literal, $now:literal) => {
        concat!("(", $lane, ".lease_id IS NOT NULL AND ", $lane, ".lease_expires_at > ", $now, ")")
    };
}

/// The SQL form of "neither a live lease nor a running backoff" (NULL-safe): the lane
/// may be claimed (when it has messages).
#[macro_export]
macro_rules! lease_free_sql {
    ($lane:literal, $now:literal) => {
        concat!("(", $lane, ".lease_expires_at IS NULL OR ", $lane, ".lease_expires_at <= ", $now, ")")
    };
}

/// Where a lane stands for a pop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimability {
    /// Nothing past the cursor is readable yet.
    Empty,
    /// Messages wait and no lease was ever taken, or the last one was released.
    Free,
    /// Messages wait and the last lease expired without an ack: its span is redelivered.
    Expired,
    /// Under a live lease: not claimable.
    Live,
    /// Messages wait, but a failed batch's retry backoff runs until `retry_at`: not
    /// claimable before.
    Backoff,
}

impl Claimability {
    pub fn claimable(self) -> bool {
        matches!(self, Claimability::Free | Claimability::Expired)
    }
}

/// One lane's state, as its row stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lane {
    /// The last offset the group is done with.
    pub committed: i64,
    /// The lease holding the lane and its expiry; None when released.
    pub lease: Option<(u128, i64)>,
    /// The last offset of the leased span (meaningful under a lease).
    pub batch_end: i64,
    /// The first offset of the last claim: a claim that starts there again is a redelivery.
    pub claim_start: Option<i64>,
    /// How many times the span starting at `claim_start` was delivered before.
    pub attempt_count: i32,
    /// Failed acks of the batch at the cursor (the retry budget spent).
    pub retry_count: i32,
    /// Without a lease: the lane is not claimed before this time (a retry backoff).
    pub retry_at: Option<i64>,
}

impl Lane {
    /// A lane as it is created: nothing consumed up to `committed`, nothing leased.
    pub fn new(committed: i64) -> Lane {
        Lane {
            committed,
            lease: None,
            batch_end: 0,
            claim_start: None,
            attempt_count: 0,
            retry_count: 0,
            retry_at: None,
        }
    }

    /// Whether a pop at `now` may claim this lane, given the partition's readable end.
    pub fn claimability(&self, readable: i64, now: i64) -> Claimability {
        match self.lease {
            Some((_, expires)) if lease_live(Some(expires), now) => Claimability::Live,
            _ if self.committed >= readable => Claimability::Empty,
            Some(_) => Claimability::Expired,
            None if self.retry_at.is_some_and(|t| t > now) => Claimability::Backoff,
            None => Claimability::Free,
        }
    }

    /// The redelivery counter of a claim whose span starts at `start`: one more than last
    /// time when the last claim started there too, else 0.
    pub fn attempt(&self, start: i64) -> i32 {
        redelivery(self.claim_start, self.attempt_count, start)
    }

    /// The state of `(committed, batch_end]` as `ack::plan_lane` reads it.
    pub fn ack_state(&self) -> LaneState {
        LaneState { committed: self.committed, batch_end: self.batch_end, retry_count: self.retry_count }
    }

    /// Whether `lease_id` holds this lane at `now`: the fence of every ack and extend.
    pub fn held_by(&self, lease_id: u128, now: i64) -> bool {
        matches!(self.lease, Some((id, expires)) if id == lease_id && lease_live(Some(expires), now))
    }
}

/// The redelivery counter of a claim starting at `start`, from the lane's last claim start
/// and counter: one more when it starts at the same offset again, else 0.
pub fn redelivery(claim_start: Option<i64>, attempt_count: i32, start: i64) -> i32 {
    if claim_start == Some(start) {
        attempt_count.saturating_add(1)
    } else {
        0
    }
}

/// A claim decided for one lane: it delivers `start..=end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub start: i64,
    pub end: i64,
    /// The redelivery counter each delivered message carries.
    pub attempt: i32,
}

impl Lane {
    /// The lane leased under `lease` (id, expiry) for `claim`'s span.
    pub fn leased(&self, claim: Claim, lease: (u128, i64)) -> Lane {
        Lane {
            lease: Some(lease),
            batch_end: claim.end,
            claim_start: Some(claim.start),
            attempt_count: claim.attempt,
            retry_at: None,
            ..*self
        }
    }
}

/// Claims `lane` for a pop that delivers up to `end` (from `committed + 1`; the caller read
/// the span and stopped at `end`). Under `lease` (id, expiry) the lane is leased; with
/// `None` (auto-ack) the cursor moves to `end` at once and nothing stays leased.
/// Returns None when the lane is not claimable or `end` delivers nothing.
pub fn claim(lane: &Lane, readable: i64, end: i64, lease: Option<(u128, i64)>, now: i64) -> Option<(Lane, Claim)> {
    if !lane.claimability(readable, now).claimable() || end <= lane.committed || end > readable {
        return None;
    }
    let start = lane.committed + 1;
    let attempt = lane.attempt(start);
    let claim = Claim { start, end, attempt };
    let next = match lease {
        Some(lease) => lane.leased(claim, lease),
        None => auto_ack(lane, end),
    };
    Some((next, claim))
}

/// An auto-ack pop's transition: the cursor moves to `end`, and the lane is left free with
/// its counters reset.
pub fn auto_ack(lane: &Lane, end: i64) -> Lane {
    Lane {
        committed: end.max(lane.committed),
        lease: None,
        batch_end: 0,
        claim_start: None,
        attempt_count: 0,
        retry_count: 0,
        retry_at: None,
    }
}

/// Applies an ack plan (`ack::plan_lane`), made at `now`, to the lane it was made for.
pub fn apply_ack(lane: &Lane, plan: &LanePlan, now: i64) -> Lane {
    apply_ack_effect(lane, plan.committed, plan.release, plan.retry_count, plan.reset_attempts, retry_at(plan, now))
}

/// When a lane that `plan` releases may be claimed again: after its `retry_after`.
pub fn retry_at(plan: &LanePlan, now: i64) -> Option<i64> {
    plan.retry_after.filter(|_| plan.release).map(|d| now.saturating_add(d))
}

/// `apply_ack` from the parts of a plan that change the lane: the new cursor (never below
/// the old one), whether the lease ends, the retry count, whether the redelivery counter
/// resets, and the end of a retry backoff (`retry_at`).
pub fn apply_ack_effect(
    lane: &Lane,
    committed: i64,
    release: bool,
    retry_count: i32,
    reset: bool,
    retry_at: Option<i64>,
) -> Lane {
    let mut next = Lane { committed: committed.max(lane.committed), retry_count, ..*lane };
    if release {
        next.lease = None;
        next.batch_end = 0;
        next.retry_at = retry_at;
    }
    if reset {
        next.claim_start = None;
        next.attempt_count = 0;
    }
    next
}

/// An ack by `lease_id` at `now`: fenced by the live lease (None when it does not hold
/// the lane: nothing changes), else the plan and the lane after it.
pub fn ack(
    lane: &Lane,
    lease_id: u128,
    items: &[AckItem],
    policy: RetryPolicy,
    call_error: Option<&str>,
    now: i64,
) -> Option<(Lane, LanePlan)> {
    if !lane.held_by(lease_id, now) {
        return None;
    }
    let plan = plan_lane(lane.ack_state(), items, policy, call_error);
    Some((apply_ack(lane, &plan, now), plan))
}

/// The item of an ack that names only its lease, for one lane: `completed` at the end of
/// the leased span when the lease still holds the lane (`live`), else none.
pub fn whole_lease_item(batch_end: i64, live: bool) -> Option<AckItem> {
    live.then_some(AckItem { offset: batch_end, status: AckStatus::Completed, error: None, retry_after: None })
}

/// `whole_lease_item` for a lane and the lease that acks it.
pub fn whole_lease_items(lane: &Lane, lease_id: u128, now: i64) -> Option<AckItem> {
    whole_lease_item(lane.batch_end, lane.held_by(lease_id, now))
}

/// `extend_lease` on a lane: a live lease held by `lease_id` lasts until at least
/// `target`; it never shortens. None when the lease does not hold the lane.
pub fn extend(lane: &Lane, lease_id: u128, target: i64, now: i64) -> Option<Lane> {
    let (id, expires) = lane.lease.filter(|_| lane.held_by(lease_id, now))?;
    Some(Lane { lease: Some((id, expires.max(target))), ..*lane })
}

/// A lane whose only pending offsets up to `to` are poison (filed as dead letters): the
/// cursor passes them, and the retry count of the batch at the cursor starts again.
pub fn pass(lane: &Lane, to: i64) -> Lane {
    Lane { committed: lane.committed.max(to), retry_count: 0, ..*lane }
}

/// `seek`: the one transition that may move a cursor backwards, by an operator's explicit
/// call. The lane is left free with its counters reset; `to` is the new cursor (already
/// bounded by `lanes::seek_cursor`).
pub fn seek(_lane: &Lane, to: i64) -> Lane {
    Lane::new(to)
}

/// Releases the lease without committing anything (a lease given back, or one whose
/// partition a `seek` moved): its span is redelivered to the next pop.
pub fn release(lane: &Lane) -> Lane {
    Lane { lease: None, batch_end: 0, retry_at: None, ..*lane }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const POLICY: RetryPolicy =
        RetryPolicy { retry_limit: 2, dead_lettering: true, retry_backoff: 5, retry_backoff_max: 20 };

    fn done(offset: i64) -> AckItem {
        AckItem { offset, status: AckStatus::Completed, error: None, retry_after: None }
    }

    #[test]
    fn claimability() {
        let l = Lane::new(5);
        assert_eq!(l.claimability(5, 0), Claimability::Empty);
        assert_eq!(l.claimability(6, 0), Claimability::Free);
        let leased = Lane { lease: Some((1, 100)), batch_end: 6, ..l };
        assert_eq!(leased.claimability(6, 99), Claimability::Live);
        assert_eq!(leased.claimability(6, 100), Claimability::Expired, "expiry is exclusive");
        assert_eq!(leased.claimability(5, 100), Claimability::Empty);
        assert!(!leased.claimability(6, 99).claimable());
        assert!(lease_live(Some(101), 100) && !lease_live(Some(100), 100) && !lease_live(None, 0));
        // A backoff: no lease, not claimable before retry_at, claimable from it on.
        let waiting = Lane { retry_at: Some(200), ..l };
        assert_eq!(waiting.claimability(6, 199), Claimability::Backoff);
        assert!(!waiting.claimability(6, 199).claimable());
        assert_eq!(waiting.claimability(6, 200), Claimability::Free);
        assert_eq!(waiting.claimability(5, 100), Claimability::Empty);
    }

    #[test]
    fn a_failed_ack_with_a_backoff_holds_the_lane_back() {
        let (l, _) = claim(&Lane::new(0), 5, 5, Some((7, 100)), 0).unwrap();
        let failed = AckItem { status: AckStatus::Failed, ..done(3) };
        let (after, plan) = ack(&l, 7, std::slice::from_ref(&failed), POLICY, None, 10).unwrap();
        assert_eq!((after.committed, after.lease, after.retry_at, plan.retry_after), (2, None, Some(15), Some(5)));
        assert!(claim(&after, 5, 5, Some((8, 200)), 14).is_none(), "backoff running");
        let (again, c) = claim(&after, 5, 5, Some((8, 200)), 15).unwrap();
        assert_eq!((c.start, c.attempt, again.retry_at), (3, 0, None), "a new span: offset 3 is its first");
        // The second failure waits twice as long; an explicit retry_after wins.
        let (after2, _) = ack(&again, 8, std::slice::from_ref(&failed), POLICY, None, 20).unwrap();
        assert_eq!(after2.retry_at, Some(30));
        let explicit = AckItem { retry_after: Some(2), status: AckStatus::Retry, ..done(3) };
        let (after3, _) = ack(&again, 8, &[explicit], POLICY, None, 20).unwrap();
        assert_eq!(after3.retry_at, Some(22));
        // A release or a seek ends it.
        assert_eq!(release(&after2).retry_at, None);
        assert_eq!(seek(&after2, 0).retry_at, None);
    }

    #[test]
    fn sql_forms() {
        assert_eq!(lease_live_sql!("l", "$3"), "(l.lease_id IS NOT NULL AND l.lease_expires_at > $3)");
        assert_eq!(lease_free_sql!("l", "$4"), "(l.lease_expires_at IS NULL OR l.lease_expires_at <= $4)");
    }

    #[test]
    fn redelivery_counts_attempts() {
        let l = Lane::new(0);
        let (l1, c1) = claim(&l, 10, 4, Some((7, 100)), 0).unwrap();
        assert_eq!((c1.start, c1.end, c1.attempt), (1, 4, 0));
        // Expired, claimed again from the same start: attempt 1.
        let (l2, c2) = claim(&l1, 10, 4, Some((8, 300)), 200).unwrap();
        assert_eq!(c2.attempt, 1);
        assert!(claim(&l2, 10, 4, Some((9, 500)), 250).is_none(), "live lease");
        // The old lease is fenced; the new one commits.
        let done = [done(4)];
        assert!(ack(&l2, 7, &done, POLICY, None, 250).is_none());
        let (l3, _) = ack(&l2, 8, &done, POLICY, None, 250).unwrap();
        assert_eq!((l3.committed, l3.lease, l3.attempt_count), (4, None, 0));
    }

    #[test]
    fn extend_never_shortens_and_needs_the_lease() {
        let (l, _) = claim(&Lane::new(0), 3, 3, Some((7, 100)), 0).unwrap();
        assert_eq!(extend(&l, 7, 50, 10).unwrap().lease, Some((7, 100)));
        assert_eq!(extend(&l, 7, 150, 10).unwrap().lease, Some((7, 150)));
        assert!(extend(&l, 8, 150, 10).is_none());
        assert!(extend(&l, 7, 150, 100).is_none(), "expired");
    }

    #[test]
    fn whole_lease_completes_the_span() {
        let (l, _) = claim(&Lane::new(2), 9, 9, Some((7, 100)), 0).unwrap();
        let item = whole_lease_items(&l, 7, 1).unwrap();
        assert_eq!(item.offset, 9);
        assert!(whole_lease_items(&l, 7, 100).is_none());
        let (after, _) = ack(&l, 7, &[item], POLICY, None, 1).unwrap();
        assert_eq!(after.committed, 9);
    }

    #[test]
    fn pass_seek_and_partial_acks() {
        let (l, _) = claim(&Lane::new(3), 10, 6, Some((7, 100)), 0).unwrap();
        let l = Lane { retry_count: 2, ..l };
        // Poison passed: the cursor moves forward only, the retry count restarts.
        assert_eq!(pass(&l, 5).committed, 5);
        assert_eq!(pass(&l, 2).committed, 3);
        assert_eq!(pass(&l, 5).retry_count, 0);
        assert_eq!(pass(&l, 5).lease, l.lease, "the lease stays");
        // Seek may move back, and frees the lane.
        assert_eq!(seek(&l, 1), Lane::new(1));
        // A partial ack keeps the lease and the redelivery counter.
        let part = apply_ack_effect(&l, 4, false, 2, false, Some(9));
        assert_eq!((part.committed, part.lease, part.claim_start, part.retry_at), (4, l.lease, l.claim_start, None));
        // A plan never lowers the cursor.
        assert_eq!(apply_ack_effect(&l, 1, true, 0, true, None).committed, 3);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push(i64),
        Tick(i64),
        Pop { take: i64, auto: bool, lease_for: i64 },
        Ack { stale: bool, offset_back: i64, status: AckStatus, retry_after: Option<i64> },
        AckWhole { stale: bool },
        Extend { stale: bool, by: i64 },
        Release,
    }

    fn op() -> impl Strategy<Value = Op> {
        let status = prop_oneof![
            Just(AckStatus::Completed),
            Just(AckStatus::Failed),
            Just(AckStatus::Retry),
            Just(AckStatus::Dlq)
        ];
        prop_oneof![
            (1i64..5).prop_map(Op::Push),
            (1i64..60).prop_map(Op::Tick),
            (1i64..6, any::<bool>(), 10i64..50).prop_map(|(take, auto, lease_for)| Op::Pop { take, auto, lease_for }),
            (any::<bool>(), 0i64..4, status, proptest::option::of(0i64..30)).prop_map(
                |(stale, offset_back, status, retry_after)| Op::Ack { stale, offset_back, status, retry_after }
            ),
            any::<bool>().prop_map(|stale| Op::AckWhole { stale }),
            (any::<bool>(), 1i64..40).prop_map(|(stale, by)| Op::Extend { stale, by }),
            Just(Op::Release),
        ]
    }

    proptest! {
        /// Random traffic on one lane: pushes, time passing, pops (leasing or auto-ack),
        /// acks of every status by the holder or by a stale lease, whole-lease acks, extends
        /// and releases. Invariants: the cursor never moves backwards and never passes the
        /// readable end; every offset at or below the cursor was delivered (nothing is
        /// skipped); an ack or extend without the live lease changes nothing; a failed
        /// batch is dead-lettered only after `retry_limit` failed acks, and each offset is
        /// disposed of at most once.
        #[test]
        fn lane_invariants(ops in proptest::collection::vec(op(), 1..80)) {
            let mut lane = Lane::new(0);
            let mut readable = 0i64;
            let mut now = 0i64;
            let mut next_id = 1u128;
            let mut last_id = 0u128;
            let mut delivered_through = 0i64;
            let mut disposed: Vec<i64> = Vec::new();
            for op in ops {
                let before = lane;
                match op {
                    Op::Push(n) => readable += n,
                    Op::Tick(d) => now += d,
                    Op::Pop { take, auto, lease_for } => {
                        let end = (lane.committed + take).min(readable);
                        let lease = (!auto).then(|| { next_id += 1; (next_id, now + lease_for) });
                        match claim(&lane, readable, end, lease, now) {
                            Some((next, c)) => {
                                prop_assert!(before.claimability(readable, now).claimable());
                                prop_assert!(before.lease.is_some() || before.retry_at.is_none_or(|t| t <= now),
                                              "claimed during a backoff: {:?} at {}", before, now);
                                prop_assert_eq!(next.retry_at, None);
                                prop_assert_eq!(c.start, before.committed + 1);
                                delivered_through = delivered_through.max(c.end);
                                if let Some((id, _)) = lease { last_id = id; }
                                lane = next;
                            }
                            None => prop_assert!(!before.claimability(readable, now).claimable() || end <= before.committed),
                        }
                    }
                    Op::Ack { stale, offset_back, status, retry_after } => {
                        let id = if stale { last_id.wrapping_add(1000) } else { last_id };
                        let offset = lane.batch_end - offset_back;
                        let item = AckItem { offset, status, error: None, retry_after };
                        match ack(&lane, id, &[item], POLICY, None, now) {
                            Some((next, plan)) => {
                                prop_assert!(!stale);
                                let (held, expires) = before.lease.expect("an ack applied to an unleased lane");
                                prop_assert!(held == id && expires > now, "fence: {:?} at {}", before, now);
                                if status == AckStatus::Failed && plan.retry_count == before.retry_count + 1 {
                                    prop_assert!(before.retry_count < POLICY.retry_limit);
                                }
                                match plan.disposal {
                                    crate::ack::Disposal::DeadLetter { offset, retry_count, .. } => {
                                        prop_assert!(status == AckStatus::Dlq || retry_count >= POLICY.retry_limit);
                                        prop_assert!(!disposed.contains(&offset));
                                        disposed.push(offset);
                                    }
                                    crate::ack::Disposal::Drop { .. } => prop_assert!(false, "dead-lettering is on"),
                                    crate::ack::Disposal::None => {}
                                }
                                // A released redelivery waits exactly its pause; nothing else waits.
                                prop_assert_eq!(next.retry_at, plan.retry_after.filter(|_| plan.release).map(|d| now + d));
                                lane = next;
                            }
                            None => prop_assert!(stale || !before.held_by(last_id, now)),
                        }
                    }
                    Op::AckWhole { stale } => {
                        let id = if stale { last_id.wrapping_add(1000) } else { last_id };
                        if let Some(item) = whole_lease_items(&lane, id, now) {
                            prop_assert!(!stale);
                            let (next, plan) = ack(&lane, id, &[item], POLICY, None, now).unwrap();
                            prop_assert_eq!(next.committed, before.batch_end);
                            prop_assert!(plan.release);
                            lane = next;
                        }
                    }
                    Op::Extend { stale, by } => {
                        let id = if stale { last_id.wrapping_add(1000) } else { last_id };
                        match extend(&lane, id, now + by, now) {
                            Some(next) => {
                                prop_assert!(!stale);
                                let (held, expires) = before.lease.expect("an extend of an unleased lane");
                                prop_assert!(held == id && expires > now, "fence: {:?} at {}", before, now);
                                prop_assert!(next.lease.unwrap().1 >= expires);
                                lane = next;
                            }
                            None => prop_assert!(stale || !before.held_by(id, now)),
                        }
                    }
                    Op::Release => lane = release(&lane),
                }
                prop_assert!(lane.committed >= before.committed, "cursor moved back: {:?} -> {:?}", before, lane);
                prop_assert!(lane.committed <= readable);
                prop_assert!(lane.committed <= delivered_through, "skipped: {:?}, delivered {}", lane, delivered_through);
            }
        }
    }
}
