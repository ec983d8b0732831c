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

#[cfg(test)]
mod tests {
    use super::allocate;

    #[test]
    fn allocation_is_even_and_capped() {
        assert_eq!(allocate(10, &[100]), vec![10]);
        assert_eq!(allocate(10, &[100, 100]), vec![5, 5]);
        assert_eq!(allocate(10, &[2, 100, 100]), vec![2, 4, 4]);
        assert_eq!(allocate(2, &[5, 5, 5]), vec![1, 1, 0]);
        assert_eq!(allocate(100, &[3, 4]), vec![3, 4]);
    }
}
