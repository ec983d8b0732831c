//! Claim math: how a pop's batch is shared among the lanes it locked.

/// Fills `batch` from the lanes in the order the pop scanned them: each lane gives what it
/// has until the batch is full, and the lanes after that get nothing and are not claimed.
/// So a pop claims the fewest lanes that fill its batch, and leaves the rest to the
/// group's other consumers. Fairness comes from the scan order, which starts just after
/// the lane the backend's previous pop claimed last (round-robin over partitions).
pub fn fill(batch: i64, available: &[i64]) -> Vec<i64> {
    let mut left = batch.max(0);
    available
        .iter()
        .map(|&a| {
            let t = a.max(0).min(left);
            left -= t;
            t
        })
        .collect()
}

/// Whether lanes that hold `available` offsets between them cover `batch`: a pop that
/// locks lanes one by one stops there (`fill` would give the next one nothing).
pub fn covered(batch: i64, available: i64) -> bool {
    available >= batch
}

/// What a lane may deliver in a pop, in the order the pop reads its lanes: its share
/// (`fill`) plus what the lanes read before it left of theirs (`carry`: their shares
/// minus what they delivered; a lane whose first message is not due leaves all of it),
/// up to what it has. So a pop still fills its batch when some lanes hold back.
pub fn take_with_carry(share: i64, carry: i64, available: i64) -> i64 {
    share.saturating_add(carry).min(available).max(0)
}

#[cfg(test)]
mod tests {
    use super::{covered, fill, take_with_carry};
    use proptest::prelude::*;

    #[test]
    fn a_lane_takes_what_earlier_lanes_left() {
        // batch 1 over 3 lanes: the first one holds back, the next takes its share.
        let shares = fill(1, &[5, 5, 5]);
        assert_eq!(shares, vec![1, 0, 0]);
        let delivered_by_first = 0;
        let carry = shares[0] - delivered_by_first;
        assert_eq!(take_with_carry(shares[1], carry, 5), 1);
        assert_eq!(take_with_carry(4, 10, 6), 6, "capped by what the lane has");
        assert_eq!(take_with_carry(0, 0, 9), 0);
    }

    #[test]
    fn lanes_fill_the_batch_in_scan_order() {
        assert_eq!(fill(10, &[100]), vec![10]);
        assert_eq!(fill(10, &[100, 100]), vec![10, 0], "the second lane is not claimed");
        assert_eq!(fill(10, &[2, 100, 100]), vec![2, 8, 0]);
        assert_eq!(fill(2, &[5, 5, 5]), vec![2, 0, 0]);
        assert_eq!(fill(100, &[3, 4]), vec![3, 4], "short of the batch: everything");
        assert_eq!(fill(5, &[0, 3, 9]), vec![0, 3, 2], "an empty lane gives nothing");
        assert!(covered(10, 10) && !covered(10, 9));
    }

    proptest! {
        #[test]
        fn fill_takes_a_prefix_up_to_the_batch(batch in 1i64..500, avail in proptest::collection::vec(0i64..200, 0..20)) {
            let t = fill(batch, &avail);
            prop_assert_eq!(t.len(), avail.len());
            let total: i64 = t.iter().sum();
            prop_assert_eq!(total, batch.min(avail.iter().sum()));
            for (i, (&ti, &ai)) in t.iter().zip(&avail).enumerate() {
                prop_assert!(ti >= 0 && ti <= ai);
                // A lane gets something only when every lane before it gave all it had.
                if ti > 0 {
                    prop_assert!(t[..i].iter().zip(&avail[..i]).all(|(x, y)| x == y));
                }
            }
            // Locking lanes until `covered` keeps every lane that `fill` gives something.
            let mut sum = 0;
            let mut locked = 0;
            for &a in &avail {
                if covered(batch, sum) { break; }
                sum += a;
                locked += 1;
            }
            prop_assert!(t[locked..].iter().all(|&x| x == 0));
        }
    }
}
