//! One open-addressing table for the registries (`offsets`, `lanes`, `limits`): linear probing over
//! a power-of-two slice of slots, and deletion by backward shift, so that keys coming and
//! going never leave tombstones and a probe always ends at an empty slot. A registry says
//! what its slots are (`Keyed`); the probe and the deletion plan live here once.

/// A hash of a key's bytes for `Keyed::hash` (a multiply-xorshift mix, 8 bytes at a time).
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    for chunk in bytes.chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h ^= u64::from_le_bytes(w);
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
    }
    h.wrapping_mul(0xc4ce_b9fe_1a85_ec53) ^ (h >> 29)
}

/// A slot of an open-addressing table.
pub trait Keyed {
    type Key: PartialEq + ?Sized;
    /// Whether the slot holds nothing (it ends a probe).
    fn is_empty(&self) -> bool;
    /// The key of a slot that is not empty.
    fn key(&self) -> &Self::Key;
    /// The key's hash: its home slot is `hash & (len - 1)`.
    fn hash(key: &Self::Key) -> u64;
}

/// Finds `key` in `slots` (a power-of-two length, never full): Ok(its slot) when present,
/// Err(the empty slot that ended the probe, where it would go).
pub fn find<S: Keyed>(slots: &[S], key: &S::Key) -> Result<usize, usize> {
    let mask = slots.len() - 1;
    let mut i = S::hash(key) as usize & mask;
    loop {
        let s = &slots[i];
        if s.is_empty() {
            return Err(i);
        }
        if s.key() == key {
            return Ok(i);
        }
        i = (i + 1) & mask;
    }
}

/// The plan of a backward-shift deletion of one slot: the entries after it in its cluster
/// move up into the hole, one at a time, when their probe passes it.
///
/// ```text
/// let mut r = Removal::new(i);
/// while let Some((from, to)) = r.next(slots) { /* copy slot `from` into `to`, relink */ }
/// /* empty slot r.hole() */
/// ```
pub struct Removal {
    start: usize,
    hole: usize,
    j: usize,
}

impl Removal {
    /// The deletion of slot `i`.
    pub fn new(i: usize) -> Self {
        Removal { start: i, hole: i, j: i }
    }

    /// The next move, as (from, to): the caller copies slot `from` into the hole `to`
    /// before it asks again (`from` is then the hole). None when no entry moves any more:
    /// `hole()` is the slot to empty.
    pub fn next<S: Keyed>(&mut self, slots: &[S]) -> Option<(usize, usize)> {
        let mask = slots.len() - 1;
        loop {
            self.j = (self.j + 1) & mask;
            let j = self.j;
            if j == self.start || slots[j].is_empty() {
                return None;
            }
            let home = S::hash(slots[j].key()) as usize & mask;
            if may_fill(self.hole, j, home, mask) {
                let to = self.hole;
                self.hole = j;
                return Some((j, to));
            }
        }
    }

    /// The slot to empty once `next` returned None.
    pub fn hole(&self) -> usize {
        self.hole
    }
}

/// Whether the entry at `j`, whose home is `home`, may move to the hole at `hole` in a
/// table with `mask`: when its home is not cyclically between the hole and `j` (its probe
/// passes the hole).
fn may_fill(hole: usize, j: usize, home: usize, mask: usize) -> bool {
    (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A slot of a test table: 0 is empty; the hash is the key itself, so that clusters
    /// and wrap-around are easy to make.
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct S(u64);

    impl Keyed for S {
        type Key = u64;
        fn is_empty(&self) -> bool {
            self.0 == 0
        }
        fn key(&self) -> &u64 {
            &self.0
        }
        fn hash(key: &u64) -> u64 {
            *key / 16
        }
    }

    fn insert(t: &mut [S], k: u64) {
        let i = find(t, &k).expect_err("absent");
        t[i] = S(k);
    }

    fn remove(t: &mut [S], k: u64) {
        let i = find(t, &k).expect("present");
        let mut r = Removal::new(i);
        while let Some((from, to)) = r.next(t) {
            t[to] = t[from];
        }
        t[r.hole()] = S(0);
    }

    proptest! {
        /// Any sequence of inserts and removes on an 8-slot table (colliding keys, clusters
        /// that wrap) keeps every present key findable and every removed one absent.
        #[test]
        fn prop_inserts_and_removes_keep_every_key_findable(ops in prop::collection::vec((1u64..128, any::<bool>()), 1..200)) {
            let mut t = [S(0); 8];
            let mut present = std::collections::BTreeSet::new();
            for (k, add) in ops {
                if add && !present.contains(&k) && present.len() < 7 {
                    insert(&mut t, k);
                    present.insert(k);
                } else if !add && present.contains(&k) {
                    remove(&mut t, k);
                    present.remove(&k);
                }
                for k in 1u64..128 {
                    prop_assert_eq!(find(&t, &k).is_ok(), present.contains(&k), "key {}", k);
                }
                prop_assert_eq!(t.iter().filter(|s| !s.is_empty()).count(), present.len());
            }
        }
    }

    #[test]
    fn a_cluster_that_wraps_shifts_back_across_the_end() {
        // Keys 113 and 114 hash to slot 7; 114 wraps to slot 0; 16 (home 1) sits at 1.
        let mut t = [S(0); 8];
        for k in [113, 114, 16] {
            insert(&mut t, k);
        }
        assert_eq!(t[7..], [S(113)]);
        assert_eq!(t[..2], [S(114), S(16)]);
        remove(&mut t, 113);
        assert_eq!((t[7], t[0], t[1]), (S(114), S(0), S(16)), "114 moves home; 16 stays");
        assert!(find(&t, &16).is_ok() && find(&t, &114).is_ok());
    }
}
