//! Claim math: how a pop's batch is shared among the lanes it locked.

/// Splits `batch` over lanes by water-filling: every lane gets an equal share, capped by
/// what it has; the rest goes round again. Lanes that get nothing are not claimed.
pub fn allocate(batch: i64, available: &[i64]) -> Vec<i64> {
    let mut take = vec![0i64; available.len()];
    let mut left = batch;
    loop {
        let open: Vec<usize> = (0..available.len()).filter(|&i| take[i] < available[i]).collect();
        if left <= 0 || open.is_empty() {
            return take;
        }
        let share = (left / open.len() as i64).max(1);
        for i in open {
            if left == 0 {
                break;
            }
            let t = share.min(available[i] - take[i]).min(left);
            take[i] += t;
            left -= t;
        }
    }
}

/// What a lane may deliver in a pop, in the order the pop reads its lanes: its share
/// (`allocate`) plus what the lanes read before it left of theirs (`carry`: their shares
/// minus what they delivered; a lane whose first message is not due leaves all of it),
/// up to what it has. So a pop still fills its batch when some lanes hold back.
pub fn take_with_carry(share: i64, carry: i64, available: i64) -> i64 {
    share.saturating_add(carry).min(available).max(0)
}

#[cfg(test)]
mod tests {
    use super::{allocate, take_with_carry};

    #[test]
    fn a_lane_takes_what_earlier_lanes_left() {
        // batch 1 over 3 lanes: the first one holds back, the next takes its share.
        let shares = allocate(1, &[5, 5, 5]);
        assert_eq!(shares, vec![1, 0, 0]);
        let delivered_by_first = 0;
        let carry = shares[0] - delivered_by_first;
        assert_eq!(take_with_carry(shares[1], carry, 5), 1);
        assert_eq!(take_with_carry(4, 10, 6), 6, "capped by what the lane has");
        assert_eq!(take_with_carry(0, 0, 9), 0);
    }

    #[test]
    fn allocation_is_even_and_capped() {
        assert_eq!(allocate(10, &[100]), vec![10]);
        assert_eq!(allocate(10, &[100, 100]), vec![5, 5]);
        assert_eq!(allocate(10, &[2, 100, 100]), vec![2, 4, 4]);
        assert_eq!(allocate(2, &[5, 5, 5]), vec![1, 1, 0]);
        assert_eq!(allocate(100, &[3, 4]), vec![3, 4]);
    }
}
