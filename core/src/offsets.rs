//! Offset reservations and the readable end of a partition.
//!
//! A push reserves its offsets here, without holding any row lock until it commits, so
//! pushes to one partition run and commit in parallel (group commit). Readers must still
//! never pass an offset that may yet commit (invariant 1), so every partition keeps:
//!
//! - `head`: the last offset reserved;
//! - the reservations of transactions still in flight, in offset order;
//! - `readable`: the highest offset that a committed push wrote and below which nothing is
//!   in flight. Every offset up to `readable` is decided: it holds a committed message, or
//!   it belongs to a push that aborted (a gap that stays empty for ever). `readable` never
//!   moves backwards and always names a real message (or the partition's start).
//!
//! This is Kafka's "last stable offset". A reader reads `readable`, then takes its snapshot:
//! everything committed up to `readable` is visible to that snapshot, so an offset missing
//! from it is a gap, not a message still on its way.
//!
//! The registry lives in one fixed block of memory (PostgreSQL shared memory in the
//! extension) with no pointers in it: a hash table of partitions (open addressing, linear
//! probing, backward-shift deletion), a pool of reservation records, and one list head per
//! owner (a backend, or a prepared transaction: `prepare`). The caller serialises access
//! (one lock) and gives a reader a shared view. A partition's slot is created on first use from what the database holds (`begin_load`
//! / `finish_load`), and an idle slot is evicted when the table is full: with nothing in
//! flight, the database alone says where the partition stands.

/// No record / end of a list.
pub const NIL: u32 = u32::MAX;

const EMPTY: u32 = 0;
const LOADING: u32 = 1;
const READY: u32 = 2;

const FREE: u32 = 0;
const IN_FLIGHT: u32 = 1;
const COMMITTED: u32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Header {
    /// Hash table size (a power of two, at least twice `max_live`).
    pub slots: u32,
    /// Most partitions tracked at once.
    pub max_live: u32,
    pub records: u32,
    pub owners: u32,
    live: u32,
    free: u32,
    hand: u32,
    /// Owners below this are backends; the rest hold prepared transactions' reservations.
    backends: u32,
    evictions: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Slot {
    key: [u8; 16],
    state: u32,
    /// The backend loading this slot (state LOADING).
    loader: u32,
    first: u32,
    last: u32,
    head: i64,
    readable: i64,
    /// The highest offset a push wrote to the fresh tier (at least): a read of offsets
    /// above it need not look there. Raised when the offsets are reserved, so before any
    /// reader can see them; never lowered (compaction moves segments out, not in).
    fresh_max: i64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Record {
    key: [u8; 16],
    first: i64,
    /// Last offset reserved.
    end: i64,
    /// Last offset written (`first - 1` while nothing is).
    written: i64,
    owner: u32,
    subxact: u32,
    state: u32,
    prev: u32,
    next: u32,
    owner_next: u32,
    /// The prepared transaction that holds the record (0 while its backend holds it).
    xid: u32,
    _pad: u32,
}

/// Sizes of the registry's parts, in bytes, laid out one after another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub slots: usize,
    pub records: usize,
    pub owners: usize,
}

impl Layout {
    pub fn new(max_live: usize, records: usize, owners: usize) -> Layout {
        Layout { slots: (max_live.max(1) * 2).next_power_of_two(), records: records.max(1), owners: owners.max(1) }
    }
    pub fn slots_at(&self) -> usize {
        std::mem::size_of::<Header>()
    }
    pub fn records_at(&self) -> usize {
        self.slots_at() + self.slots * std::mem::size_of::<Slot>()
    }
    pub fn owners_at(&self) -> usize {
        self.records_at() + self.records * std::mem::size_of::<Record>()
    }
    /// Bytes the whole registry takes (8-byte aligned start).
    pub fn size(&self) -> usize {
        self.owners_at() + self.owners * std::mem::size_of::<u32>()
    }
}

/// Why a reservation could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The partition has no slot yet: load it (`begin_load`) and try again.
    Unknown,
    /// Another backend is loading the slot: wait a moment and try again.
    Loading,
    /// Every reservation record is in use.
    Full,
}

/// What `begin_load` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// The slot is ready already (someone else loaded it).
    Ready,
    /// Another backend is loading it: wait and look again.
    Loading,
    /// The caller owns the load: compute the partition's end from the database, with a
    /// snapshot taken from now on, and pass it to `finish_load`.
    Mine,
    /// Every slot holds a partition with pushes in flight (or being loaded).
    Full,
}

fn hash(key: &[u8; 16]) -> u64 {
    let a = u64::from_le_bytes(key[..8].try_into().unwrap());
    let b = u64::from_le_bytes(key[8..].try_into().unwrap());
    let mut h = a ^ b.rotate_left(29) ^ 0x9e37_79b9_7f4a_7c15;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

fn find(h: &Header, slots: &[Slot], key: &[u8; 16]) -> Result<usize, usize> {
    let mask = h.slots as usize - 1;
    let mut i = hash(key) as usize & mask;
    loop {
        let s = &slots[i];
        if s.state == EMPTY {
            return Err(i);
        }
        if &s.key == key {
            return Ok(i);
        }
        i = (i + 1) & mask;
    }
}

/// A shared (read-only) view, for readers holding the lock in shared mode.
pub struct View<'a> {
    h: &'a Header,
    slots: &'a [Slot],
    recs: &'a [Record],
}

/// What a reader learns about a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    Readable(i64),
    Loading,
    Unknown,
}

impl<'a> View<'a> {
    pub fn new(h: &'a Header, slots: &'a [Slot], recs: &'a [Record]) -> Self {
        View { h, slots, recs }
    }

    /// The readable end of a partition (see the module docs).
    pub fn readable(&self, key: &[u8; 16]) -> Seen {
        match find(self.h, self.slots, key) {
            Ok(i) if self.slots[i].state == READY => Seen::Readable(self.slots[i].readable),
            Ok(_) => Seen::Loading,
            Err(_) => Seen::Unknown,
        }
    }

    /// The readable end as `owner`'s transaction sees it: its own reservations are no
    /// reason to wait (it sees its own writes, and commits or aborts with them), so the
    /// end moves past them as long as no other transaction's reservation comes first.
    pub fn readable_for(&self, key: &[u8; 16], owner: u32) -> Seen {
        let i = match find(self.h, self.slots, key) {
            Ok(i) if self.slots[i].state == READY => i,
            Ok(_) => return Seen::Loading,
            Err(_) => return Seen::Unknown,
        };
        let mut end = self.slots[i].readable;
        let mut r = self.slots[i].first;
        while r != NIL {
            let rec = &self.recs[r as usize];
            if rec.state == IN_FLIGHT && rec.owner != owner {
                break;
            }
            if rec.written >= rec.first {
                end = end.max(rec.written);
            }
            r = rec.next;
        }
        Seen::Readable(end)
    }

    /// The highest offset that may be in the fresh tier (None while not loaded: assume any).
    pub fn fresh_max(&self, key: &[u8; 16]) -> Option<i64> {
        match find(self.h, self.slots, key) {
            Ok(i) if self.slots[i].state == READY => Some(self.slots[i].fresh_max),
            _ => None,
        }
    }

    /// Every tracked partition a push has written to the fresh tier of, with the highest
    /// offset that may be there.
    pub fn fresh_partitions(&self) -> Vec<([u8; 16], i64)> {
        self.slots.iter().filter(|s| s.state == READY && s.fresh_max > 0).map(|s| (s.key, s.fresh_max)).collect()
    }

    /// The last offset reserved (None while not loaded).
    pub fn head(&self, key: &[u8; 16]) -> Option<i64> {
        match find(self.h, self.slots, key) {
            Ok(i) if self.slots[i].state == READY => Some(self.slots[i].head),
            _ => None,
        }
    }
}

/// The registry, for a writer holding the lock exclusively.
pub struct Registry<'a> {
    h: &'a mut Header,
    slots: &'a mut [Slot],
    recs: &'a mut [Record],
    owners: &'a mut [u32],
}

impl<'a> Registry<'a> {
    /// Wraps memory laid out by `format`.
    pub fn new(h: &'a mut Header, slots: &'a mut [Slot], recs: &'a mut [Record], owners: &'a mut [u32]) -> Self {
        debug_assert_eq!(slots.len(), h.slots as usize);
        debug_assert_eq!(recs.len(), h.records as usize);
        debug_assert_eq!(owners.len(), h.owners as usize);
        Registry { h, slots, recs, owners }
    }

    /// Initialises fresh memory: every slot empty, every record free. The last `prepared`
    /// owners are for prepared transactions (`prepare`), the others for backends.
    pub fn format(
        h: &'a mut Header,
        slots: &'a mut [Slot],
        recs: &'a mut [Record],
        owners: &'a mut [u32],
        max_live: usize,
        prepared: usize,
    ) -> Self {
        assert!(slots.len().is_power_of_two() && slots.len() >= 2 * max_live.max(1));
        assert!(prepared < owners.len());
        *h = Header {
            slots: slots.len() as u32,
            max_live: max_live.max(1) as u32,
            records: recs.len() as u32,
            owners: owners.len() as u32,
            free: 0,
            backends: (owners.len() - prepared) as u32,
            ..Header::default()
        };
        slots.fill(Slot::default());
        let n = recs.len();
        for (i, r) in recs.iter_mut().enumerate() {
            *r = Record { next: if i + 1 < n { i as u32 + 1 } else { NIL }, ..Record::default() };
        }
        owners.fill(NIL);
        Registry { h, slots, recs, owners }
    }

    pub fn view(&self) -> View<'_> {
        View { h: self.h, slots: self.slots, recs: self.recs }
    }

    /// Partitions tracked now.
    pub fn live(&self) -> usize {
        self.h.live as usize
    }

    pub fn evictions(&self) -> u64 {
        self.h.evictions
    }

    /// Reserves `n` offsets of partition `key` for `owner`'s transaction (in subtransaction
    /// `subxact`). Returns the first. The reservation holds readers back until `finish`.
    /// `writes_all`: the caller writes every reserved offset, or its (sub)transaction fails
    /// (no `wrote` needed); otherwise it reports what it wrote with `wrote`. `fresh`: the
    /// offsets go to the fresh tier.
    pub fn reserve(
        &mut self,
        key: &[u8; 16],
        n: i64,
        owner: u32,
        subxact: u32,
        writes_all: bool,
        fresh: bool,
    ) -> Result<i64, Refusal> {
        assert!(n > 0 && owner < self.h.backends, "a backend reserves, never a prepared transaction");
        let s = match find(self.h, self.slots, key) {
            Ok(s) if self.slots[s].state == READY => s,
            Ok(_) => return Err(Refusal::Loading),
            Err(_) => return Err(Refusal::Unknown),
        };
        let first = self.slots[s].head + 1;
        let end = self.slots[s].head + n;
        if fresh {
            self.slots[s].fresh_max = self.slots[s].fresh_max.max(end);
        }
        // The owner's own reservation at the tail, in the same subtransaction, grows in
        // place: nobody reserved in between, so the range stays the owner's alone.
        let tail = self.slots[s].last;
        if tail != NIL {
            let t = &mut self.recs[tail as usize];
            if t.state == IN_FLIGHT && t.owner == owner && t.subxact == subxact {
                t.end = end;
                if writes_all {
                    t.written = end;
                }
                self.slots[s].head = end;
                return Ok(first);
            }
        }
        let r = self.h.free;
        if r == NIL {
            return Err(Refusal::Full);
        }
        self.h.free = self.recs[r as usize].next;
        self.recs[r as usize] = Record {
            key: *key,
            first,
            end,
            written: if writes_all { end } else { first - 1 },
            owner,
            subxact,
            state: IN_FLIGHT,
            prev: tail,
            next: NIL,
            owner_next: self.owners[owner as usize],
            ..Record::default()
        };
        self.owners[owner as usize] = r;
        if tail == NIL {
            self.slots[s].first = r;
        } else {
            self.recs[tail as usize].next = r;
        }
        self.slots[s].last = r;
        self.slots[s].head = end;
        Ok(first)
    }

    /// Records that `owner` wrote offset `last` of `key` (the highest it wrote so far).
    pub fn wrote(&mut self, key: &[u8; 16], owner: u32, last: i64) {
        let mut r = self.owners[owner as usize];
        while r != NIL {
            let rec = &mut self.recs[r as usize];
            if &rec.key == key && rec.first <= last && last <= rec.end {
                rec.written = rec.written.max(last);
                return;
            }
            r = rec.owner_next;
        }
    }

    /// True when `owner` holds reservations.
    pub fn holds(&self, owner: u32) -> bool {
        self.owners[owner as usize] != NIL
    }

    /// Ends `owner`'s transaction: its reservations commit (those that wrote something) or
    /// abort.
    pub fn finish(&mut self, owner: u32, committed: bool) {
        let mut r = std::mem::replace(&mut self.owners[owner as usize], NIL);
        while r != NIL {
            let next = self.recs[r as usize].owner_next;
            self.end_record(r, committed);
            r = next;
        }
    }

    /// `PREPARE TRANSACTION` of `owner`'s transaction, whose id is `xid` (not 0): its
    /// reservations pass to a free prepared-transaction owner, stay in flight (readers stop
    /// before them) and end with `finish_prepared(xid, ..)`; `owner` is free for its next
    /// transaction. False when every prepared owner is taken (nothing changes then).
    pub fn prepare(&mut self, owner: u32, xid: u32) -> bool {
        assert!(xid != 0 && owner < self.h.backends);
        let Some(p) = (self.h.backends as usize..self.owners.len()).find(|&p| self.owners[p] == NIL) else {
            return false;
        };
        let mut r = std::mem::replace(&mut self.owners[owner as usize], NIL);
        self.owners[p] = r;
        while r != NIL {
            let rec = &mut self.recs[r as usize];
            rec.owner = p as u32;
            rec.xid = xid;
            r = rec.owner_next;
        }
        true
    }

    /// `COMMIT PREPARED` or `ROLLBACK PREPARED` of `xid` took effect (its rows are visible,
    /// or gone): its reservations end as `finish` ends a backend's. False when `xid` holds
    /// none.
    pub fn finish_prepared(&mut self, xid: u32, committed: bool) -> bool {
        let found = (self.h.backends as usize..self.owners.len())
            .find(|&p| self.owners[p] != NIL && self.recs[self.owners[p] as usize].xid == xid);
        match found {
            Some(p) => {
                self.finish(p as u32, committed);
                true
            }
            None => false,
        }
    }

    /// The prepared transactions that hold reservations.
    pub fn prepared(&self) -> Vec<u32> {
        (self.h.backends as usize..self.owners.len())
            .filter(|&p| self.owners[p] != NIL)
            .map(|p| self.recs[self.owners[p] as usize].xid)
            .collect()
    }

    /// Subtransaction `subxact` (and any inside it) aborted: its reservations abort.
    pub fn abort_subxact(&mut self, owner: u32, subxact: u32) {
        self.retain_owned(owner, |rec| rec.subxact < subxact);
    }

    /// Subtransaction `subxact` committed into `parent`: its reservations now belong to it.
    pub fn commit_subxact(&mut self, owner: u32, subxact: u32, parent: u32) {
        let mut r = self.owners[owner as usize];
        while r != NIL {
            let rec = &mut self.recs[r as usize];
            if rec.subxact >= subxact {
                rec.subxact = parent;
            }
            r = rec.owner_next;
        }
    }

    /// Keeps the owner's records for which `keep` holds; aborts the others.
    fn retain_owned(&mut self, owner: u32, keep: impl Fn(&Record) -> bool) {
        let mut prev = NIL;
        let mut r = self.owners[owner as usize];
        while r != NIL {
            let next = self.recs[r as usize].owner_next;
            if keep(&self.recs[r as usize]) {
                prev = r;
            } else {
                if prev == NIL {
                    self.owners[owner as usize] = next;
                } else {
                    self.recs[prev as usize].owner_next = next;
                }
                self.end_record(r, false);
            }
            r = next;
        }
    }

    /// One reservation ends: a committed one that wrote something stays in the slot's list
    /// until nothing before it is in flight; anything else leaves a gap.
    fn end_record(&mut self, r: u32, committed: bool) {
        let key = self.recs[r as usize].key;
        let s = find(self.h, self.slots, &key).expect("a reservation's partition has a slot");
        if committed && self.recs[r as usize].written >= self.recs[r as usize].first {
            self.recs[r as usize].state = COMMITTED;
            // Merge with committed neighbours: the list alternates in flight / committed.
            let prev = self.recs[r as usize].prev;
            let r = if prev != NIL && self.recs[prev as usize].state == COMMITTED {
                self.recs[prev as usize].written = self.recs[r as usize].written;
                self.recs[prev as usize].end = self.recs[r as usize].end;
                self.unlink(s, r);
                prev
            } else {
                r
            };
            let next = self.recs[r as usize].next;
            if next != NIL && self.recs[next as usize].state == COMMITTED {
                self.recs[r as usize].written = self.recs[next as usize].written;
                self.recs[r as usize].end = self.recs[next as usize].end;
                self.unlink(s, next);
            }
        } else {
            self.unlink(s, r);
        }
        // Committed reservations with nothing in flight before them become readable.
        while self.slots[s].first != NIL && self.recs[self.slots[s].first as usize].state == COMMITTED {
            let f = self.slots[s].first;
            self.slots[s].readable = self.slots[s].readable.max(self.recs[f as usize].written);
            self.unlink(s, f);
        }
    }

    fn unlink(&mut self, s: usize, r: u32) {
        let (prev, next) = (self.recs[r as usize].prev, self.recs[r as usize].next);
        if prev == NIL {
            self.slots[s].first = next;
        } else {
            self.recs[prev as usize].next = next;
        }
        if next == NIL {
            self.slots[s].last = prev;
        } else {
            self.recs[next as usize].prev = prev;
        }
        self.free_record(r);
    }

    fn free_record(&mut self, r: u32) {
        self.recs[r as usize] = Record { state: FREE, next: self.h.free, ..Record::default() };
        self.h.free = r;
    }

    /// Starts loading partition `key` for `owner` (see `Load`). A full table evicts an idle
    /// partition (nothing in flight): its state is then what the database says.
    pub fn begin_load(&mut self, key: &[u8; 16], owner: u32) -> Load {
        let i = match find(self.h, self.slots, key) {
            Ok(i) if self.slots[i].state == READY => return Load::Ready,
            Ok(_) => return Load::Loading,
            Err(i) => i,
        };
        let i = if self.h.live >= self.h.max_live {
            if !self.evict_one() {
                return Load::Full;
            }
            // Deletion shifted entries: find the insertion point again.
            find(self.h, self.slots, key).expect_err("the key was absent")
        } else {
            i
        };
        self.slots[i] = Slot {
            key: *key,
            state: LOADING,
            loader: owner,
            first: NIL,
            last: NIL,
            head: 0,
            readable: 0,
            fresh_max: 0,
        };
        self.h.live += 1;
        Load::Mine
    }

    /// Ends a load with what the database holds, read with a snapshot taken after
    /// `begin_load`: `readable`, the highest offset a stored segment holds (every push
    /// that could write below it has ended), `head`, at least that, the highest offset
    /// anything refers to (offsets after it are handed out next), and `fresh_max`, the
    /// last offset of the fresh tier's last segment.
    pub fn finish_load(&mut self, key: &[u8; 16], owner: u32, head: i64, readable: i64, fresh_max: i64) {
        if let Ok(i) = find(self.h, self.slots, key) {
            let s = &mut self.slots[i];
            if s.state == LOADING && s.loader == owner {
                s.state = READY;
                s.head = head.max(readable);
                s.readable = readable;
                s.fresh_max = fresh_max;
            }
        }
    }

    /// Drops the slot of `key` if `owner` started loading it and did not finish (its
    /// transaction ended in an error first).
    pub fn abandon_load(&mut self, key: &[u8; 16], owner: u32) {
        if let Ok(i) = find(self.h, self.slots, key) {
            if self.slots[i].state == LOADING && self.slots[i].loader == owner {
                self.remove_slot(i);
            }
        }
    }

    /// Evicts one ready slot with nothing in flight, scanning from the clock hand.
    fn evict_one(&mut self) -> bool {
        let n = self.slots.len();
        for k in 0..n {
            let i = (self.h.hand as usize + k) % n;
            let s = &self.slots[i];
            if s.state == READY && s.first == NIL {
                self.h.hand = ((i + 1) % n) as u32;
                self.remove_slot(i);
                self.h.evictions += 1;
                return true;
            }
        }
        false
    }

    /// Backward-shift deletion: later entries of the probe run move up, so lookups never
    /// need tombstones.
    fn remove_slot(&mut self, mut i: usize) {
        let mask = self.slots.len() - 1;
        self.h.live -= 1;
        loop {
            self.slots[i] = Slot::default();
            let mut j = i;
            loop {
                j = (j + 1) & mask;
                if self.slots[j].state == EMPTY {
                    return;
                }
                let home = hash(&self.slots[j].key) as usize & mask;
                // Move j into the hole at i unless its home lies cyclically in (i, j].
                let stays = if i <= j { i < home && home <= j } else { i < home || home <= j };
                if !stays {
                    self.slots[i] = self.slots[j];
                    i = j;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    struct Mem {
        h: Header,
        slots: Vec<Slot>,
        recs: Vec<Record>,
        owners: Vec<u32>,
    }

    impl Mem {
        /// `owners` backends, and two prepared-transaction owners after them.
        fn new(max_live: usize, records: usize, owners: usize) -> Mem {
            let l = Layout::new(max_live, records, owners + 2);
            let mut m = Mem {
                h: Header::default(),
                slots: vec![Slot::default(); l.slots],
                recs: vec![Record::default(); l.records],
                owners: vec![0; l.owners],
            };
            Registry::format(&mut m.h, &mut m.slots, &mut m.recs, &mut m.owners, max_live, 2);
            m
        }
        fn reg(&mut self) -> Registry<'_> {
            Registry::new(&mut self.h, &mut self.slots, &mut self.recs, &mut self.owners)
        }
        fn readable(&mut self, k: u8) -> Seen {
            self.reg().view().readable(&key(k))
        }
        fn load(&mut self, k: u8, end: i64) {
            assert_eq!(self.reg().begin_load(&key(k), 99), Load::Mine);
            self.reg().finish_load(&key(k), 99, end, end, 0);
        }
    }

    fn key(k: u8) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0] = k;
        b[15] = k.wrapping_mul(7);
        b
    }

    #[test]
    fn commits_out_of_order_become_readable_in_order() {
        let mut m = Mem::new(4, 8, 4);
        assert_eq!(m.reg().reserve(&key(1), 1, 0, 1, false, false), Err(Refusal::Unknown));
        m.load(1, 10);
        assert_eq!(m.readable(1), Seen::Readable(10));
        assert_eq!(m.reg().reserve(&key(1), 2, 0, 1, false, false), Ok(11)); // owner 0: 11..12
        assert_eq!(m.reg().reserve(&key(1), 1, 1, 1, false, false), Ok(13)); // owner 1: 13
        m.reg().wrote(&key(1), 0, 12);
        m.reg().wrote(&key(1), 1, 13);
        m.reg().finish(1, true);
        assert_eq!(m.readable(1), Seen::Readable(10), "13 waits for 11..12");
        m.reg().finish(0, true);
        assert_eq!(m.readable(1), Seen::Readable(13));
    }

    #[test]
    fn a_transaction_reads_its_own_pushes_unless_another_comes_first() {
        let mut m = Mem::new(4, 8, 4);
        m.load(1, 0);
        m.reg().reserve(&key(1), 2, 0, 1, false, false).unwrap(); // owner 0: 1..2
        m.reg().wrote(&key(1), 0, 2);
        assert_eq!(m.reg().view().readable_for(&key(1), 0), Seen::Readable(2));
        assert_eq!(m.reg().view().readable_for(&key(1), 1), Seen::Readable(0));
        m.reg().reserve(&key(1), 1, 1, 1, false, false).unwrap(); // owner 1: 3
        m.reg().wrote(&key(1), 1, 3);
        m.reg().reserve(&key(1), 1, 0, 1, false, false).unwrap(); // owner 0 again: 4, a new record
        m.reg().wrote(&key(1), 0, 4);
        assert_eq!(m.reg().view().readable_for(&key(1), 0), Seen::Readable(2), "3 is another's, in flight");
        assert_eq!(m.reg().view().readable_for(&key(1), 1), Seen::Readable(0));
        m.reg().finish(1, true);
        assert_eq!(m.reg().view().readable_for(&key(1), 0), Seen::Readable(4));
        assert_eq!(m.readable(1), Seen::Readable(0));
    }

    #[test]
    fn an_abort_leaves_a_gap_and_an_aborted_tail_is_not_readable() {
        let mut m = Mem::new(4, 8, 4);
        m.load(1, 0);
        assert_eq!(m.reg().reserve(&key(1), 1, 0, 1, false, false), Ok(1));
        assert_eq!(m.reg().reserve(&key(1), 1, 1, 1, false, false), Ok(2));
        assert_eq!(m.reg().reserve(&key(1), 1, 2, 1, false, false), Ok(3));
        m.reg().wrote(&key(1), 0, 1);
        m.reg().wrote(&key(1), 2, 3);
        m.reg().finish(1, false); // 2 aborts: a gap
        m.reg().finish(0, true);
        assert_eq!(m.readable(1), Seen::Readable(1));
        m.reg().finish(2, false); // the tail aborts: readable stays on a real message
        assert_eq!(m.readable(1), Seen::Readable(1));
        assert_eq!(m.reg().view().head(&key(1)), Some(3), "offsets are never reused");
        assert_eq!(m.reg().reserve(&key(1), 1, 0, 1, false, false), Ok(4));
    }

    #[test]
    fn a_prepared_transaction_holds_readers_back_until_it_is_finished() {
        let mut m = Mem::new(4, 8, 2);
        m.load(1, 10);
        assert_eq!(m.reg().reserve(&key(1), 2, 0, 1, true, false), Ok(11)); // owner 0: 11..12
        assert!(m.reg().prepare(0, 700));
        assert!(!m.reg().holds(0), "the backend is free for its next transaction");
        assert_eq!(m.reg().prepared(), vec![700]);
        // The same backend pushes again, and commits: 13 waits for the prepared 11..12.
        assert_eq!(m.reg().reserve(&key(1), 1, 0, 1, true, false), Ok(13));
        m.reg().finish(0, true);
        assert_eq!(m.readable(1), Seen::Readable(10));
        assert_eq!(m.reg().view().readable_for(&key(1), 0), Seen::Readable(10), "not its own any more");
        assert!(!m.reg().finish_prepared(701, true), "another xid holds nothing");
        assert!(m.reg().finish_prepared(700, true));
        assert_eq!(m.readable(1), Seen::Readable(13));
        assert!(m.reg().prepared().is_empty());
    }

    #[test]
    fn a_rolled_back_prepared_transaction_leaves_a_gap() {
        let mut m = Mem::new(4, 8, 2);
        m.load(1, 0);
        assert_eq!(m.reg().reserve(&key(1), 1, 1, 1, true, false), Ok(1));
        assert!(m.reg().prepare(1, 9));
        assert_eq!(m.reg().reserve(&key(1), 1, 0, 1, true, false), Ok(2));
        m.reg().finish(0, true);
        assert_eq!(m.readable(1), Seen::Readable(0));
        assert!(m.reg().finish_prepared(9, false));
        assert_eq!(m.readable(1), Seen::Readable(2), "offset 1 is a gap");
        // A later reservation never reuses the gap.
        assert_eq!(m.reg().reserve(&key(1), 1, 1, 1, true, false), Ok(3));
    }

    #[test]
    fn prepared_owners_run_out_cleanly() {
        let mut m = Mem::new(4, 8, 3);
        m.load(1, 0);
        for (owner, xid) in [(0, 5), (1, 6)] {
            m.reg().reserve(&key(1), 1, owner, 1, true, false).unwrap();
            assert!(m.reg().prepare(owner, xid));
        }
        m.reg().reserve(&key(1), 1, 2, 1, true, false).unwrap();
        assert!(!m.reg().prepare(2, 7), "both prepared owners are taken");
        assert!(m.reg().holds(2), "a refused prepare changes nothing");
        assert!(m.reg().finish_prepared(5, true));
        assert!(m.reg().prepare(2, 7), "a finished one is free again");
        let mut xids = m.reg().prepared();
        xids.sort();
        assert_eq!(xids, vec![6, 7]);
    }

    #[test]
    fn a_reservation_that_wrote_nothing_commits_as_a_gap() {
        let mut m = Mem::new(4, 8, 4);
        m.load(1, 5);
        m.reg().reserve(&key(1), 3, 0, 1, false, false).unwrap();
        m.reg().finish(0, true);
        assert_eq!(m.readable(1), Seen::Readable(5));
        m.reg().reserve(&key(1), 3, 0, 1, false, false).unwrap(); // 9..11
        m.reg().wrote(&key(1), 0, 10);
        m.reg().finish(0, true);
        assert_eq!(m.readable(1), Seen::Readable(10));
    }

    #[test]
    fn subtransactions_abort_and_commit_their_reservations() {
        let mut m = Mem::new(4, 8, 4);
        m.load(1, 0);
        m.reg().reserve(&key(1), 1, 0, 1, false, false).unwrap(); // 1, top level
        m.reg().wrote(&key(1), 0, 1);
        m.reg().reserve(&key(1), 1, 0, 2, false, false).unwrap(); // 2, savepoint 2 (a new record)
        m.reg().wrote(&key(1), 0, 2);
        m.reg().abort_subxact(0, 2);
        m.reg().reserve(&key(1), 1, 0, 3, false, false).unwrap(); // 3, savepoint 3, released into 1
        m.reg().wrote(&key(1), 0, 3);
        m.reg().commit_subxact(0, 3, 1);
        m.reg().finish(0, true);
        assert_eq!(m.readable(1), Seen::Readable(3));
        // Had savepoint 2 been kept, readable would be 3 too; what matters is that an
        // aborted savepoint's write is never claimed: reserve once more and abort it.
        m.reg().reserve(&key(1), 1, 0, 4, false, false).unwrap(); // 4
        m.reg().wrote(&key(1), 0, 4);
        m.reg().abort_subxact(0, 4);
        m.reg().finish(0, true);
        assert_eq!(m.readable(1), Seen::Readable(3));
    }

    #[test]
    fn loading_is_exclusive_and_dropped_on_abort() {
        let mut m = Mem::new(2, 4, 4);
        assert_eq!(m.reg().begin_load(&key(1), 0), Load::Mine);
        assert_eq!(m.reg().begin_load(&key(1), 1), Load::Loading);
        assert_eq!(m.reg().reserve(&key(1), 1, 1, 1, false, false), Err(Refusal::Loading));
        assert_eq!(m.readable(1), Seen::Loading);
        m.reg().abandon_load(&key(1), 1); // not the loader: nothing happens
        assert_eq!(m.readable(1), Seen::Loading);
        m.reg().abandon_load(&key(1), 0);
        assert_eq!(m.readable(1), Seen::Unknown);
        assert_eq!(m.reg().begin_load(&key(1), 1), Load::Mine);
        m.reg().finish_load(&key(1), 1, 9, 7, 0);
        assert_eq!(m.readable(1), Seen::Readable(7));
        assert_eq!(m.reg().reserve(&key(1), 1, 1, 1, false, false), Ok(10), "offsets after the stored head");
    }

    #[test]
    fn a_full_table_evicts_only_idle_partitions() {
        let mut m = Mem::new(2, 4, 4);
        m.load(1, 0);
        m.load(2, 0);
        m.reg().reserve(&key(1), 1, 0, 1, false, false).unwrap();
        m.reg().reserve(&key(2), 1, 1, 1, false, false).unwrap();
        assert_eq!(m.reg().begin_load(&key(3), 2), Load::Full, "both have pushes in flight");
        m.reg().finish(1, false);
        assert_eq!(m.reg().begin_load(&key(3), 2), Load::Mine);
        assert_eq!(m.readable(2), Seen::Unknown, "the idle one was evicted");
        assert_eq!(m.reg().evictions(), 1);
        assert_eq!(m.reg().live(), 2);
    }

    #[test]
    fn fresh_max_covers_every_fresh_reservation() {
        let mut m = Mem::new(4, 8, 4);
        m.load(1, 0);
        assert_eq!(m.reg().view().fresh_max(&key(1)), Some(0));
        m.reg().reserve(&key(1), 100, 0, 1, true, false).unwrap(); // 1..100, durable
        assert_eq!(m.reg().view().fresh_max(&key(1)), Some(0));
        m.reg().reserve(&key(1), 2, 1, 1, true, true).unwrap(); // 101..102, fresh
        assert_eq!(m.reg().view().fresh_max(&key(1)), Some(102), "raised at reservation, before any commit");
        m.reg().finish(1, false);
        assert_eq!(m.reg().view().fresh_max(&key(1)), Some(102), "never lowered");
        assert_eq!(m.reg().view().fresh_max(&key(2)), None, "unknown: assume anything");
        m.load(3, 0);
        assert_eq!(m.reg().view().fresh_partitions(), vec![(key(1), 102)], "only partitions with fresh pushes");
    }

    #[test]
    fn the_record_pool_runs_out_cleanly() {
        let mut m = Mem::new(4, 2, 4);
        m.load(1, 0);
        m.reg().reserve(&key(1), 1, 0, 1, false, false).unwrap();
        m.reg().reserve(&key(1), 1, 1, 1, false, false).unwrap();
        assert_eq!(m.reg().reserve(&key(1), 1, 2, 1, false, false), Err(Refusal::Full));
        assert_eq!(m.reg().view().head(&key(1)), Some(2), "a refused reservation takes nothing");
        m.reg().finish(0, false);
        assert_eq!(m.reg().reserve(&key(1), 1, 2, 1, false, false), Ok(3));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Reserve { owner: u32, part: u8, n: i64, write: u8, all: bool },
        Finish { owner: u32, commit: bool },
        Savepoint { owner: u32 },
        Rollback { owner: u32 },
        Release { owner: u32 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u32..4, 0u8..6, 1i64..4, 0u8..4, any::<bool>()).prop_map(|(owner, part, n, write, all)| Op::Reserve { owner, part, n, write, all }),
            2 => (0u32..4, any::<bool>()).prop_map(|(owner, commit)| Op::Finish { owner, commit }),
            1 => (0u32..4).prop_map(|owner| Op::Savepoint { owner }),
            1 => (0u32..4).prop_map(|owner| Op::Rollback { owner }),
            1 => (0u32..4).prop_map(|owner| Op::Release { owner }),
        ]
    }

    /// The model: every reservation ever made, with its fate.
    #[derive(Debug, Clone)]
    struct Res {
        fresh: bool,
        part: u8,
        owner: u32,
        subxact: u32,
        first: i64,
        end: i64,
        written: Option<i64>,
        fate: Option<bool>,
    }

    proptest! {
        /// Against a model of every reservation: `readable` is exactly the highest written
        /// offset of a committed reservation with nothing in flight below it; offsets are
        /// never handed out twice; readable never moves backwards; evictions and reloads
        /// (from the model's "database") change nothing a reader sees.
        #[test]
        fn prop_readable_matches_the_model(ops in proptest::collection::vec(op(), 1..200)) {
            let mut m = Mem::new(3, 64, 4);
            let mut model: Vec<Res> = Vec::new();
            let mut last_seen: BTreeMap<u8, i64> = BTreeMap::new();
            // Per owner: the stack of open subtransaction ids (1 = top level).
            let mut stacks: Vec<Vec<u32>> = vec![vec![1]; 4];
            let mut next_sub = 2u32;
            let db_end = |model: &Vec<Res>, part: u8| -> i64 {
                // What a snapshot shows: the highest committed written offset.
                model.iter().filter(|r| r.part == part && r.fate == Some(true)).filter_map(|r| r.written).max().unwrap_or(0)
            };
            for op in ops {
                match op {
                    Op::Reserve { owner, part, n, write, all } => {
                        let sub = *stacks[owner as usize].last().unwrap();
                        let fresh = n % 2 == 0;
                        let got = loop {
                            match m.reg().reserve(&key(part), n, owner, sub, all, fresh) {
                                Err(Refusal::Unknown) => {
                                    match m.reg().begin_load(&key(part), owner) {
                                        Load::Mine => {
                                            let end = db_end(&model, part);
                                            let fresh_end = model.iter().filter(|r| r.part == part && r.fresh && r.fate == Some(true)).filter_map(|r| r.written).max().unwrap_or(0);
                                            m.reg().finish_load(&key(part), owner, end, end, fresh_end);
                                        }
                                        Load::Full => break None,
                                        other => panic!("{other:?}"),
                                    }
                                }
                                Err(Refusal::Full) => break None,
                                Err(e) => panic!("{e:?}"),
                                Ok(first) => break Some(first),
                            }
                        };
                        let Some(first) = got else { continue };
                        let end = first + n - 1;
                        // An offset is handed out again only after an eviction, and only if
                        // no committed push wrote it (an aborted tail): nothing refers to it.
                        for r in model.iter().filter(|r| r.part == part && r.end >= first) {
                            prop_assert!(r.fate.is_some(), "offset {} handed out twice while in flight", first);
                            prop_assert!(r.fate == Some(false) || r.written.is_none_or(|w| w < first),
                                "offset {} handed out again after a committed push wrote it", first);
                        }
                        // Write some of the reserved offsets (write 0: none, a dedup case).
                        let written = if all {
                            Some(end)
                        } else {
                            (write > 0).then(|| first + (i64::from(write) - 1).min(n - 1))
                        };
                        if let (Some(w), false) = (written, all) {
                            m.reg().wrote(&key(part), owner, w);
                        }
                        model.push(Res { fresh, part, owner, subxact: sub, first, end, written, fate: None });
                    }
                    Op::Finish { owner, commit } => {
                        m.reg().finish(owner, commit);
                        for r in model.iter_mut().filter(|r| r.owner == owner && r.fate.is_none()) {
                            r.fate = Some(commit);
                        }
                        stacks[owner as usize] = vec![1];
                    }
                    Op::Savepoint { owner } => {
                        stacks[owner as usize].push(next_sub);
                        next_sub += 1;
                    }
                    Op::Rollback { owner } => {
                        if stacks[owner as usize].len() > 1 {
                            let sub = stacks[owner as usize].pop().unwrap();
                            m.reg().abort_subxact(owner, sub);
                            for r in model.iter_mut().filter(|r| r.owner == owner && r.fate.is_none() && r.subxact >= sub) {
                                r.fate = Some(false);
                            }
                        }
                    }
                    Op::Release { owner } => {
                        if stacks[owner as usize].len() > 1 {
                            let sub = stacks[owner as usize].pop().unwrap();
                            let parent = *stacks[owner as usize].last().unwrap();
                            m.reg().commit_subxact(owner, sub, parent);
                            for r in model.iter_mut().filter(|r| r.owner == owner && r.fate.is_none() && r.subxact >= sub) {
                                r.subxact = parent;
                            }
                        }
                    }
                }
                // Check every partition against the model.
                for part in 0u8..6 {
                    let lowest_in_flight = model.iter().filter(|r| r.part == part && r.fate.is_none()).map(|r| r.first).min();
                    let want = model
                        .iter()
                        .filter(|r| r.part == part && r.fate == Some(true) && lowest_in_flight.is_none_or(|l| r.first < l))
                        .filter_map(|r| r.written)
                        .max()
                        .unwrap_or(0);
                    // The fresh tier's bound covers every fresh offset a reader could see.
                    if let Some(fm) = m.reg().view().fresh_max(&key(part)) {
                        let need = model.iter().filter(|r| r.part == part && r.fresh && r.fate != Some(false)).filter_map(|r| r.written).max().unwrap_or(0);
                        prop_assert!(fm >= need, "partition {}: fresh_max {} below {}", part, fm, need);
                    }
                    // What each owner sees: its own reservations count as written.
                    for me in 0u32..4 {
                        let lowest_other = model.iter().filter(|r| r.part == part && r.fate.is_none() && r.owner != me).map(|r| r.first).min();
                        let want_me = model
                            .iter()
                            .filter(|r| r.part == part && lowest_other.is_none_or(|l| r.first < l))
                            .filter(|r| r.fate == Some(true) || (r.fate.is_none() && r.owner == me))
                            .filter_map(|r| r.written)
                            .max()
                            .unwrap_or(0);
                        if let Seen::Readable(got) = m.reg().view().readable_for(&key(part), me) {
                            prop_assert_eq!(got, want_me, "partition {} as owner {}", part, me);
                        }
                    }
                    match m.readable(part) {
                        Seen::Readable(got) => {
                            prop_assert_eq!(got, want, "partition {}", part);
                            let prev = last_seen.insert(part, got).unwrap_or(0);
                            prop_assert!(got >= prev, "readable moved back from {} to {}", prev, got);
                        }
                        Seen::Unknown => {
                            // Evicted (or never loaded): nothing may be in flight.
                            prop_assert!(lowest_in_flight.is_none());
                        }
                        Seen::Loading => prop_assert!(false, "a load was left unfinished"),
                    }
                }
            }
        }
    }
}
