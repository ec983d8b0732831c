//! Ids that carry their route (queen on Citus).
//!
//! On a Citus cluster a queue lives whole on one worker, its home. Calls that name a queue
//! are routed by the queue's name. Calls that name only a lease id (`ack`, `extend_lease`,
//! `may_start`) or a partition id (`dlq_replay`, `dlq_delete`) are routed by that id
//! instead: Citus hashes it and sends the call to the worker that holds the shard for the
//! hash. So a worker mints those ids so that they hash into a shard it holds itself: it
//! draws ids until one lands in one of its own hash ranges. With `w` workers holding equal
//! shares, a draw succeeds with probability 1/w.
//!
//! The hash is PostgreSQL's hash of the id (what Citus computes); the caller supplies it.

/// The most ids drawn for one route. With the node holding a share `s` of the hash space,
/// all of them miss with probability (1 - s)^MAX_DRAWS: negligible for any share above a
/// percent. If they all miss anyway, the last id is used: its calls are then refused by the
/// routing guard on this node, never run against another node's tables.
pub const MAX_DRAWS: usize = 4096;

/// Inclusive hash ranges `(min, max)` of the shards a node holds.
pub fn routes_here(ranges: &[(i32, i32)], hash: i32) -> bool {
    ranges.iter().any(|&(min, max)| (min..=max).contains(&hash))
}

/// Draws ids from `draw` until one hashes into `ranges`, and returns it with the number of
/// draws taken. With no ranges (the node holds no shard) the first id is returned: nothing
/// can route to this node.
pub fn mint(
    ranges: &[(i32, i32)],
    mut draw: impl FnMut() -> [u8; 16],
    hash: impl Fn(&[u8; 16]) -> i32,
) -> ([u8; 16], usize) {
    let mut id = draw();
    if ranges.is_empty() {
        return (id, 1);
    }
    for n in 1..MAX_DRAWS {
        if routes_here(ranges, hash(&id)) {
            return (id, n);
        }
        id = draw();
    }
    (id, MAX_DRAWS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hash(id: &[u8; 16]) -> i32 {
        i32::from_le_bytes(id[..4].try_into().unwrap())
    }

    fn counter(start: u32) -> impl FnMut() -> [u8; 16] {
        let mut n = start;
        move || {
            n = n.wrapping_mul(2_654_435_761).wrapping_add(0x9e37_79b9);
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&n.to_le_bytes());
            b
        }
    }

    #[test]
    fn ranges_are_inclusive() {
        let r = [(i32::MIN, -1), (100, 200)];
        assert!(routes_here(&r, i32::MIN));
        assert!(routes_here(&r, -1));
        assert!(!routes_here(&r, 0));
        assert!(routes_here(&r, 100));
        assert!(routes_here(&r, 200));
        assert!(!routes_here(&r, 201));
        assert!(!routes_here(&[], 0));
    }

    #[test]
    fn no_ranges_take_the_first_draw() {
        let mut first = counter(7);
        let expected = first();
        assert_eq!(mint(&[], counter(7), hash), (expected, 1));
    }

    #[test]
    fn half_the_space_takes_about_two_draws() {
        let r = [(0, i32::MAX)];
        let mut draws = 0;
        let mut gen = counter(1);
        for _ in 0..10_000 {
            let (id, n) = mint(&r, &mut gen, hash);
            assert!(routes_here(&r, hash(&id)));
            draws += n;
        }
        let mean = draws as f64 / 10_000.0;
        assert!((1.8..2.2).contains(&mean), "mean draws {mean}");
    }

    #[test]
    fn an_unreachable_range_gives_up_after_max_draws() {
        // A range no draw can hit: the generator only makes even hashes.
        let mut n = 0i32;
        let even = move || {
            n = n.wrapping_add(2);
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&n.to_le_bytes());
            b
        };
        let (id, draws) = mint(&[(1, 1)], even, hash);
        assert_eq!(draws, MAX_DRAWS);
        assert!(!routes_here(&[(1, 1)], hash(&id)));
    }

    proptest! {
        /// Whatever ranges a node holds (a share of at least 1/64), a minted id routes to it.
        #[test]
        fn minted_ids_route_here(seed in any::<u32>(), k in 0usize..64, of in 1usize..=64) {
            let k = k % of;
            // shard k of `of` equal shards of the int32 space, as Citus splits it
            let width = (1u64 << 32) / of as u64;
            let min = (i32::MIN as i64 + (k as u64 * width) as i64) as i32;
            let max = if k + 1 == of { i32::MAX } else { (min as i64 + width as i64 - 1) as i32 };
            let r = [(min, max)];
            let (id, n) = mint(&r, counter(seed), hash);
            prop_assert!(n < MAX_DRAWS);
            prop_assert!(routes_here(&r, hash(&id)));
        }
    }
}
