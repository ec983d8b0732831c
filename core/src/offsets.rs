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
//! **Keys.** A partition is found by its database's OID and its partition id (`PartKey`,
//! made by `part_key`): two databases may hold the same partition id (`CREATE DATABASE`
//! copies its template's), and each has its own slot.
//!
//! **Memory.** The registry lives in one fixed block of memory (PostgreSQL shared memory
//! in the extension) with no pointers in it: a hash table of partitions (open addressing,
//! linear probing, backward-shift deletion), a pool of reservation records, and one list
//! head per owner (a backend, or a prepared transaction: `prepare`). The caller
//! serialises access (one lock) and gives a reader a shared view. A partition's slot is
//! created on first use from what the database holds (`begin_load` / `finish_load`), and
//! an idle slot is evicted when the table is full: with nothing in flight, the database
//! alone says where the partition stands. A dropped database's slots go with
//! `forget_database`.
//!
//! **Dropping a partition.** A transaction that deletes a partition first marks its slot
//! (`begin_drop`, refused while any reservation exists). Until that transaction ends
//! (`end_drop`), a push that tries to reserve there is told to wait for it
//! (`Refusal::Dropping`). A commit removes the slot; an abort makes it ready again as it
//! was. Readers see a slot being dropped as a ready one.
//!
//! **When a message became readable.** A message's time is its push's transaction start,
//! but readers see it only once the readable end passes it: at its push's commit, or later
//! when an earlier push of the partition was still in flight. A queue's ttl counts from
//! when a message could be read, so each slot keeps a few *late* moves of the readable end
//! (`LATE_POINTS`): a move that released a message pushed at least `LATE_AFTER` before it,
//! noted as "at time `at`, the readable end was still `before`". Every offset past
//! `before` became readable after `at` (`View::readable_after`). A full slot drops its
//! least late point (`note_late`): what is left is always true, only less precise (an
//! offset no point covers counts from its push). Points live in shared memory only: a
//! restart, or the slot's eviction, forgets them.
//!
//! **Updates are whole or not at all.** Every write goes through `Registry`, which keeps
//! the old value of each slot, record and owner list head it writes (an undo log), and a
//! copy of the header. If an update panics half way (a bug, or a fail point: `fail`),
//! dropping the `Registry` while unwinding puts everything back, so no other process ever
//! sees half an update.

use smallvec::SmallVec;

use crate::fail;
use crate::table::{self, Keyed, Removal};

/// No record / end of a list.
pub const NIL: u32 = u32::MAX;

const EMPTY: u32 = 0;
const LOADING: u32 = 1;
const READY: u32 = 2;
const DROPPING: u32 = 3;

/// LatePoint moves of the readable end each slot remembers (see the module docs).
pub const LATE_POINTS: usize = 4;
/// A move of the readable end is late when a message it releases was pushed at least this
/// long before (microseconds): within it, a message may count its ttl from its push. A
/// second keeps the points for the long transactions that matter, not for every commit
/// that waited for its flush.
pub const LATE_AFTER: i64 = 1_000_000;

const FREE: u32 = 0;
const IN_FLIGHT: u32 = 1;
const COMMITTED: u32 = 2;

/// A partition's key: its database's OID (4 bytes, little-endian), then its 16-byte id.
pub type PartKey = [u8; 20];

/// The key of partition `partition` of database `database`.
pub fn part_key(database: u32, partition: [u8; 16]) -> PartKey {
    let mut k = [0u8; 20];
    k[..4].copy_from_slice(&database.to_le_bytes());
    k[4..].copy_from_slice(&partition);
    k
}

/// The partition id in a key.
pub fn partition_of(key: &PartKey) -> [u8; 16] {
    key[4..].try_into().unwrap()
}

/// The database OID in a key.
pub fn database_of(key: &PartKey) -> u32 {
    u32::from_le_bytes(key[..4].try_into().unwrap())
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    key: PartKey,
    state: u32,
    /// The backend loading this slot (state LOADING) or dropping it (state DROPPING).
    holder: u32,
    /// The virtual transaction id of the backend dropping this slot (state DROPPING).
    holder_backend: i32,
    holder_local: u32,
    first: u32,
    last: u32,
    head: i64,
    readable: i64,
    /// The highest offset a push wrote to the fresh tier (at least): a read of offsets
    /// above it need not look there. Raised when the offsets are reserved, so before any
    /// reader can see them; never lowered (compaction moves segments out, not in).
    fresh_max: i64,
    /// Late moves of `readable` (see `note_late`: the latest ones, less the least late),
    /// in offset order; unused ones (`at == 0`) first.
    late: [LatePoint; LATE_POINTS],
}

/// A late move of a slot's readable end: at time `at` it was still at offset `before`, so
/// every offset after `before` became readable after `at`. `pushed_at`: the earliest push
/// time of what the move released (`at - pushed_at` is how late it was).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatePoint {
    before: i64,
    at: i64,
    pushed_at: i64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    key: PartKey,
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
    /// When its transaction started, the time its messages carry (microseconds); merged
    /// records keep the earliest.
    pushed_at: i64,
}

impl Record {
    /// Takes in the committed reservation that follows it in the slot's list (both
    /// committed: one range, readable together).
    fn absorb(&mut self, next: &Record) {
        self.written = next.written;
        self.end = next.end;
        self.pushed_at = self.pushed_at.min(next.pushed_at);
    }
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
    /// A transaction is dropping the partition (`begin_drop`): wait for it to end (its
    /// virtual transaction id, backend and local id) and try again.
    Dropping((i32, u32)),
    /// The reservation would pass `LAST_OFFSET` (`reservation_end`). Nothing was
    /// reserved; a smaller one may still fit.
    Exhausted,
}

/// The largest offset a partition gives out: 2^62 - 1, which a partition taking a million
/// messages a second reaches after about 146,000 years. A push past it is refused whole.
/// It stands well below `i64::MAX` so that a reader may add a batch, a span or another
/// offset to any offset without overflow.
pub const LAST_OFFSET: i64 = (1 << 62) - 1;

/// The last offset of a reservation of `n` after `head`, or None when it would pass
/// `LAST_OFFSET` (the push is then refused whole). Both ways of reserving use it: the
/// registry's, and the partition row's without preloading.
pub fn reservation_end(head: i64, n: i64) -> Option<i64> {
    head.checked_add(n).filter(|&end| end <= LAST_OFFSET)
}

/// What `begin_load` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// The slot is ready already (someone else loaded it).
    Ready,
    /// Another backend is loading it, or a transaction is dropping it: wait and look again.
    Loading,
    /// The caller owns the load: compute the partition's end from the database, with a
    /// snapshot taken from now on, and pass it to `finish_load`.
    Mine,
    /// Every slot holds a partition with pushes in flight (or being loaded or dropped).
    Full,
}

/// Why `begin_drop` refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropRefusal {
    /// The partition has no slot: load it (`begin_load`) and try again.
    Unknown,
    /// Another backend is loading the slot: wait a moment and try again.
    Loading,
    /// Pushes hold reservations in the partition (in flight, or committed and not yet
    /// readable).
    InFlight,
    /// Another transaction is dropping it (its virtual transaction id).
    Dropping((i32, u32)),
}

fn hash(key: &PartKey) -> u64 {
    let a = u64::from_le_bytes(key[..8].try_into().unwrap());
    let b = u64::from_le_bytes(key[8..16].try_into().unwrap());
    let c = u64::from(u32::from_le_bytes(key[16..].try_into().unwrap()));
    let mut h = a ^ b.rotate_left(29) ^ c.rotate_left(47) ^ 0x9e37_79b9_7f4a_7c15;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Whether readers and reservations may use a slot in this state (a slot being dropped
/// reads as a ready one).
fn usable(state: u32) -> bool {
    state == READY || state == DROPPING
}

/// Partition slots form the registry's open-addressing table (`table`).
impl Keyed for Slot {
    type Key = PartKey;
    fn is_empty(&self) -> bool {
        self.state == EMPTY
    }
    fn key(&self) -> &PartKey {
        &self.key
    }
    fn hash(key: &PartKey) -> u64 {
        hash(key)
    }
}

/// A shared (read-only) view, for readers holding the lock in shared mode.
pub struct View<'a> {
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
        // The table is the slot slice: its length is the header's slot count.
        debug_assert_eq!(slots.len(), h.slots as usize);
        View { slots, recs }
    }

    /// The slot of a partition a reader may use.
    fn usable(&self, key: &PartKey) -> Result<usize, Seen> {
        match table::find(self.slots, key) {
            Ok(i) if usable(self.slots[i].state) => Ok(i),
            Ok(_) => Err(Seen::Loading),
            Err(_) => Err(Seen::Unknown),
        }
    }

    /// The readable end of a partition (see the module docs).
    pub fn readable(&self, key: &PartKey) -> Seen {
        match self.usable(key) {
            Ok(i) => Seen::Readable(self.slots[i].readable),
            Err(seen) => seen,
        }
    }

    /// The readable end as `owner`'s transaction sees it: its own reservations are no
    /// reason to wait (it sees its own writes, and commits or aborts with them), so the
    /// end moves past them as long as no other transaction's reservation comes first.
    pub fn readable_for(&self, key: &PartKey, owner: u32) -> Seen {
        let i = match self.usable(key) {
            Ok(i) => i,
            Err(seen) => return seen,
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
    pub fn fresh_max(&self, key: &PartKey) -> Option<i64> {
        self.usable(key).ok().map(|i| self.slots[i].fresh_max)
    }

    /// Every tracked partition of `database` a push has written to the fresh tier of (its
    /// id), with the highest offset that may be there.
    pub fn fresh_partitions(&self, database: u32) -> Vec<([u8; 16], i64)> {
        self.slots
            .iter()
            .filter(|s| usable(s.state) && s.fresh_max > 0 && database_of(&s.key) == database)
            .map(|s| (partition_of(&s.key), s.fresh_max))
            .collect()
    }

    /// The last offset reserved (None while not loaded).
    pub fn head(&self, key: &PartKey) -> Option<i64> {
        self.usable(key).ok().map(|i| self.slots[i].head)
    }

    /// A time after which `offset` became readable, when a late move of the readable end
    /// says so: the time of the point with the highest `before` below `offset`. None when
    /// no point does: the offset became readable within `LATE_AFTER` of its push, or the
    /// slot no longer keeps the point, or is not loaded. Only for an offset up to the
    /// readable end a reader read before asking (a later move says nothing of it). A
    /// transaction reading its own pushes (`readable_for`) may have seen an offset before
    /// the point says: the point is about every other reader.
    pub fn readable_after(&self, key: &PartKey, offset: i64) -> Option<i64> {
        let i = self.usable(key).ok()?;
        self.slots[i].late.iter().rev().find(|p| p.at != 0 && p.before < offset).map(|p| p.at)
    }
}

/// The old values of what an update wrote, to put back if it panics. Kept inline (on the
/// heap past that) for the few writes of a usual update: a reservation or its end writes a
/// slot or two, a few records and an owner's list head.
#[derive(Default)]
struct Undo {
    slots: SmallVec<[(usize, Slot); 4]>,
    recs: SmallVec<[(u32, Record); 4]>,
    owners: SmallVec<[(u32, u32); 2]>,
}

/// The registry, for a writer holding the lock exclusively. Dropped while a panic
/// unwinds, it puts back everything written through it (see the module docs).
pub struct Registry<'a> {
    h: &'a mut Header,
    slots: &'a mut [Slot],
    recs: &'a mut [Record],
    owners: &'a mut [u32],
    header: Header,
    undo: Undo,
}

impl Drop for Registry<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for (i, s) in self.undo.slots.drain(..).rev() {
            self.slots[i] = s;
        }
        for (r, rec) in self.undo.recs.drain(..).rev() {
            self.recs[r as usize] = rec;
        }
        for (o, head) in self.undo.owners.drain(..).rev() {
            self.owners[o as usize] = head;
        }
        *self.h = self.header;
    }
}

impl<'a> Registry<'a> {
    /// Wraps memory laid out by `format`.
    pub fn new(h: &'a mut Header, slots: &'a mut [Slot], recs: &'a mut [Record], owners: &'a mut [u32]) -> Self {
        debug_assert_eq!(slots.len(), h.slots as usize);
        debug_assert_eq!(recs.len(), h.records as usize);
        debug_assert_eq!(owners.len(), h.owners as usize);
        let header = *h;
        Registry { h, slots, recs, owners, header, undo: Undo::default() }
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
        Registry::new(h, slots, recs, owners)
    }

    /// Slot `i`, for writing: its old value goes to the undo log first.
    fn slot_mut(&mut self, i: usize) -> &mut Slot {
        self.undo.slots.push((i, self.slots[i]));
        &mut self.slots[i]
    }

    /// Record `r`, for writing (undo logged).
    fn rec_mut(&mut self, r: u32) -> &mut Record {
        self.undo.recs.push((r, self.recs[r as usize]));
        &mut self.recs[r as usize]
    }

    /// The list head of owner `o`, for writing (undo logged).
    fn owner_mut(&mut self, o: u32) -> &mut u32 {
        self.undo.owners.push((o, self.owners[o as usize]));
        &mut self.owners[o as usize]
    }

    pub fn view(&self) -> View<'_> {
        View { slots: self.slots, recs: self.recs }
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
    /// offsets go to the fresh tier. `pushed_at`: the time the messages carry (their
    /// transaction's start, microseconds), to tell a late release (`LATE_AFTER`).
    #[allow(clippy::too_many_arguments)]
    pub fn reserve(
        &mut self,
        key: &PartKey,
        n: i64,
        owner: u32,
        subxact: u32,
        writes_all: bool,
        fresh: bool,
        pushed_at: i64,
    ) -> Result<i64, Refusal> {
        assert!(n > 0 && owner < self.h.backends, "a backend reserves, never a prepared transaction");
        let s = self.ready_slot(key)?;
        let head = self.slots[s].head;
        let Some(end) = reservation_end(head, n) else { return Err(Refusal::Exhausted) };
        let first = head + 1;
        self.extend_or_append(s, key, (first, end), (owner, subxact), writes_all, pushed_at)?;
        fail::point("offsets.reserve");
        let slot = self.slot_mut(s);
        slot.head = end;
        if fresh {
            slot.fresh_max = slot.fresh_max.max(end);
        }
        Ok(first)
    }

    /// The slot of a partition that takes reservations, or why it does not.
    fn ready_slot(&self, key: &PartKey) -> Result<usize, Refusal> {
        match table::find(self.slots, key) {
            Ok(s) if self.slots[s].state == READY => Ok(s),
            Ok(s) if self.slots[s].state == DROPPING => {
                let slot = &self.slots[s];
                Err(Refusal::Dropping((slot.holder_backend, slot.holder_local)))
            }
            Ok(_) => Err(Refusal::Loading),
            Err(_) => Err(Refusal::Unknown),
        }
    }

    /// Records the reservation `first..=end` of slot `s` for `owner`: the owner's own
    /// reservation at the tail, in the same subtransaction, grows in place (nobody
    /// reserved in between, so the range stays the owner's alone); else a free record is
    /// appended to the slot's list and the owner's. `Full` when no record is free.
    fn extend_or_append(
        &mut self,
        s: usize,
        key: &PartKey,
        (first, end): (i64, i64),
        (owner, subxact): (u32, u32),
        writes_all: bool,
        pushed_at: i64,
    ) -> Result<(), Refusal> {
        let tail = self.slots[s].last;
        let grows = tail != NIL && {
            let t = &self.recs[tail as usize];
            t.state == IN_FLIGHT && t.owner == owner && t.subxact == subxact
        };
        if grows {
            let t = self.rec_mut(tail);
            t.end = end;
            t.pushed_at = t.pushed_at.min(pushed_at);
            if writes_all {
                t.written = end;
            }
            return Ok(());
        }
        let r = self.h.free;
        if r == NIL {
            return Err(Refusal::Full);
        }
        self.h.free = self.recs[r as usize].next;
        let owner_next = self.owners[owner as usize];
        *self.rec_mut(r) = Record {
            key: *key,
            first,
            end,
            written: if writes_all { end } else { first - 1 },
            owner,
            subxact,
            state: IN_FLIGHT,
            prev: tail,
            next: NIL,
            owner_next,
            pushed_at,
            ..Record::default()
        };
        *self.owner_mut(owner) = r;
        if tail == NIL {
            self.slot_mut(s).first = r;
        } else {
            self.rec_mut(tail).next = r;
        }
        self.slot_mut(s).last = r;
        Ok(())
    }

    /// Records that `owner` wrote offset `last` of `key` (the highest it wrote so far).
    pub fn wrote(&mut self, key: &PartKey, owner: u32, last: i64) {
        let mut r = self.owners[owner as usize];
        while r != NIL {
            let rec = self.recs[r as usize];
            if &rec.key == key && rec.first <= last && last <= rec.end {
                self.rec_mut(r).written = rec.written.max(last);
                fail::point("offsets.wrote");
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
    /// abort. `now`: when readers see its end (microseconds), the time of a late release.
    pub fn finish(&mut self, owner: u32, committed: bool, now: i64) {
        let mut r = self.owners[owner as usize];
        if r == NIL {
            return;
        }
        *self.owner_mut(owner) = NIL;
        while r != NIL {
            fail::point("offsets.finish");
            let next = self.recs[r as usize].owner_next;
            self.end_record(r, committed, now);
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
        let mut r = self.owners[owner as usize];
        if r == NIL {
            return true;
        }
        *self.owner_mut(owner) = NIL;
        *self.owner_mut(p as u32) = r;
        fail::point("offsets.prepare");
        while r != NIL {
            let rec = self.rec_mut(r);
            rec.owner = p as u32;
            rec.xid = xid;
            r = rec.owner_next;
        }
        true
    }

    /// `COMMIT PREPARED` or `ROLLBACK PREPARED` of `xid` took effect (its rows are visible,
    /// or gone): its reservations end as `finish` ends a backend's. False when `xid` holds
    /// none.
    pub fn finish_prepared(&mut self, xid: u32, committed: bool, now: i64) -> bool {
        let found = (self.h.backends as usize..self.owners.len())
            .find(|&p| self.owners[p] != NIL && self.recs[self.owners[p] as usize].xid == xid);
        match found {
            Some(p) => {
                self.finish(p as u32, committed, now);
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

    /// Subtransaction `subxact` (and any inside it) aborted: its reservations abort (`now`
    /// as for `finish`).
    pub fn abort_subxact(&mut self, owner: u32, subxact: u32, now: i64) {
        self.retain_owned(owner, |rec| rec.subxact < subxact, now);
    }

    /// Subtransaction `subxact` committed into `parent`: its reservations now belong to it.
    pub fn commit_subxact(&mut self, owner: u32, subxact: u32, parent: u32) {
        let mut r = self.owners[owner as usize];
        while r != NIL {
            let rec = self.recs[r as usize];
            if rec.subxact >= subxact {
                self.rec_mut(r).subxact = parent;
                fail::point("offsets.subxact");
            }
            r = rec.owner_next;
        }
    }

    /// Keeps the owner's records for which `keep` holds; aborts the others.
    fn retain_owned(&mut self, owner: u32, keep: impl Fn(&Record) -> bool, now: i64) {
        let mut prev = NIL;
        let mut r = self.owners[owner as usize];
        while r != NIL {
            let rec = self.recs[r as usize];
            if keep(&rec) {
                prev = r;
            } else {
                if prev == NIL {
                    *self.owner_mut(owner) = rec.owner_next;
                } else {
                    self.rec_mut(prev).owner_next = rec.owner_next;
                }
                fail::point("offsets.subxact");
                self.end_record(r, false, now);
            }
            r = rec.owner_next;
        }
    }

    /// One reservation ends: a committed one that wrote something stays in the slot's list
    /// until nothing before it is in flight; anything else leaves a gap.
    fn end_record(&mut self, r: u32, committed: bool, now: i64) {
        let rec = self.recs[r as usize];
        let s = table::find(self.slots, &rec.key).expect("a reservation's partition has a slot");
        if committed && rec.written >= rec.first {
            self.rec_mut(r).state = COMMITTED;
            // Merge with committed neighbours.
            let r = if rec.prev != NIL && self.recs[rec.prev as usize].state == COMMITTED {
                self.rec_mut(rec.prev).absorb(&rec);
                self.unlink(s, r);
                rec.prev
            } else {
                r
            };
            let next = self.recs[r as usize].next;
            if next != NIL && self.recs[next as usize].state == COMMITTED {
                let n = self.recs[next as usize];
                self.rec_mut(r).absorb(&n);
                self.unlink(s, next);
            }
        } else {
            self.unlink(s, r);
        }
        // Committed reservations with nothing in flight before them become readable.
        let before = self.slots[s].readable;
        let mut pushed_at = i64::MAX;
        while self.slots[s].first != NIL && self.recs[self.slots[s].first as usize].state == COMMITTED {
            let f = self.slots[s].first;
            let rec = self.recs[f as usize];
            pushed_at = pushed_at.min(rec.pushed_at);
            let slot = self.slot_mut(s);
            slot.readable = slot.readable.max(rec.written);
            self.unlink(s, f);
        }
        if self.slots[s].readable > before && now.saturating_sub(pushed_at) >= LATE_AFTER {
            self.note_late(s, LatePoint { before, at: now, pushed_at });
        }
    }

    /// Notes a late move of slot `s`'s readable end. The newest point is always kept; when
    /// the slot is full, the least late of the others goes, so that a long hold-back is
    /// not forgotten behind ordinary slow commits, and a partition that once had long ones
    /// still notes the next. The offsets a dropped point covered count from the point
    /// before it, or from their push: dropping a point only makes what is left less
    /// precise, never wrong.
    fn note_late(&mut self, s: usize, point: LatePoint) {
        let lateness = |p: &LatePoint| p.at.saturating_sub(p.pushed_at);
        let (least, _) = self.slots[s]
            .late
            .iter()
            .enumerate()
            .min_by_key(|(_, p)| if p.at == 0 { i64::MIN } else { lateness(p) })
            .expect("LATE_POINTS > 0");
        let slot = self.slot_mut(s);
        // Out with the least late (an unused one first), in offset order, the new one last.
        slot.late.copy_within(least + 1.., least);
        slot.late[LATE_POINTS - 1] = point;
    }

    fn unlink(&mut self, s: usize, r: u32) {
        let Record { prev, next, .. } = self.recs[r as usize];
        if prev == NIL {
            self.slot_mut(s).first = next;
        } else {
            self.rec_mut(prev).next = next;
        }
        if next == NIL {
            self.slot_mut(s).last = prev;
        } else {
            self.rec_mut(next).prev = prev;
        }
        self.free_record(r);
    }

    fn free_record(&mut self, r: u32) {
        let next = self.h.free;
        *self.rec_mut(r) = Record { state: FREE, next, ..Record::default() };
        self.h.free = r;
    }

    /// Starts loading partition `key` for `owner` (see `Load`). A full table evicts an idle
    /// partition (ready, nothing in flight): its state is then what the database says.
    pub fn begin_load(&mut self, key: &PartKey, owner: u32) -> Load {
        match table::find(self.slots, key) {
            Ok(i) if self.slots[i].state == READY => return Load::Ready,
            Ok(_) => return Load::Loading,
            Err(_) => {}
        }
        if self.h.live >= self.h.max_live && !self.evict_one() {
            return Load::Full;
        }
        // (An eviction may have moved the free slot.)
        let i = table::find(self.slots, key).expect_err("the key was absent");
        *self.slot_mut(i) = Slot { key: *key, state: LOADING, holder: owner, first: NIL, last: NIL, ..Slot::default() };
        fail::point("offsets.begin_load");
        self.h.live += 1;
        Load::Mine
    }

    /// Ends a load with what the database holds, read with a snapshot taken after
    /// `begin_load`: `readable`, the highest offset a stored segment holds (every push
    /// that could write below it has ended), `head`, at least that, the highest offset
    /// anything refers to (offsets after it are handed out next), and `fresh_max`, the
    /// last offset of the fresh tier's last segment.
    pub fn finish_load(&mut self, key: &PartKey, owner: u32, head: i64, readable: i64, fresh_max: i64) {
        let Ok(i) = table::find(self.slots, key) else { return };
        if self.slots[i].state != LOADING || self.slots[i].holder != owner {
            return;
        }
        self.slot_mut(i).state = READY;
        fail::point("offsets.finish_load");
        let s = self.slot_mut(i);
        s.holder = NIL;
        s.head = head.max(readable);
        s.readable = readable;
        s.fresh_max = fresh_max;
    }

    /// Drops the slot of `key` if `owner` started loading it and did not finish (its
    /// transaction ended in an error first).
    pub fn abandon_load(&mut self, key: &PartKey, owner: u32) {
        if let Ok(i) = table::find(self.slots, key) {
            if self.slots[i].state == LOADING && self.slots[i].holder == owner {
                self.remove_slot(i);
            }
        }
    }

    /// Starts dropping partition `key` in `owner`'s transaction, whose virtual transaction
    /// id is `vxid`: until `end_drop`, no push may reserve there (`Refusal::Dropping`).
    /// Refused while the partition has no slot, is being loaded, has reservations, or is
    /// being dropped by another owner. The owner already dropping it may ask again.
    pub fn begin_drop(&mut self, key: &PartKey, owner: u32, vxid: (i32, u32)) -> Result<(), DropRefusal> {
        let i = table::find(self.slots, key).map_err(|_| DropRefusal::Unknown)?;
        let s = self.slots[i];
        match s.state {
            LOADING => return Err(DropRefusal::Loading),
            DROPPING if s.holder != owner => return Err(DropRefusal::Dropping((s.holder_backend, s.holder_local))),
            DROPPING if (s.holder_backend, s.holder_local) == vxid => return Ok(()),
            DROPPING => {}
            _ if s.first != NIL => return Err(DropRefusal::InFlight),
            _ => {}
        }
        self.slot_mut(i).state = DROPPING;
        fail::point("offsets.drop");
        let slot = self.slot_mut(i);
        slot.holder = owner;
        (slot.holder_backend, slot.holder_local) = vxid;
        Ok(())
    }

    /// Ends `owner`'s drop of partition `key` (its transaction ended): a commit removes the
    /// slot, an abort makes it ready again, as it was. Nothing happens unless `owner` is
    /// dropping it.
    pub fn end_drop(&mut self, key: &PartKey, owner: u32, committed: bool) {
        let Ok(i) = table::find(self.slots, key) else { return };
        if self.slots[i].state != DROPPING || self.slots[i].holder != owner {
            return;
        }
        if committed {
            self.remove_slot(i);
            return;
        }
        self.slot_mut(i).state = READY;
        fail::point("offsets.drop");
        let slot = self.slot_mut(i);
        slot.holder = NIL;
        (slot.holder_backend, slot.holder_local) = (0, 0);
    }

    /// Forgets the partitions of a database: each ready slot of it with nothing in flight
    /// goes (a slot being loaded stays). For a database that no longer exists, and for one
    /// whose tables changed under the registry (a new install, rows copied in). Returns how
    /// many went.
    pub fn forget_database(&mut self, database: u32) -> usize {
        let keys: Vec<PartKey> = self
            .slots
            .iter()
            .filter(|s| s.state == READY && s.first == NIL && database_of(&s.key) == database)
            .map(|s| s.key)
            .collect();
        for k in &keys {
            let i = table::find(self.slots, k).expect("listed above");
            self.remove_slot(i);
        }
        keys.len()
    }

    /// How many partitions of a database the registry still holds, in any state (after
    /// `forget_database`: those with a push in flight, or being loaded or dropped).
    pub fn count_database(&self, database: u32) -> usize {
        self.slots.iter().filter(|s| s.state != EMPTY && database_of(&s.key) == database).count()
    }

    /// Evicts one ready slot with nothing in flight, scanning from the clock hand (never
    /// one being loaded or dropped).
    fn evict_one(&mut self) -> bool {
        let n = self.slots.len();
        for k in 0..n {
            let i = (self.h.hand as usize + k) % n;
            let s = &self.slots[i];
            if s.state == READY && s.first == NIL {
                self.h.hand = ((i + 1) % n) as u32;
                self.h.evictions += 1;
                self.remove_slot(i);
                return true;
            }
        }
        false
    }

    /// Empties slot `i` by backward-shift deletion: the entries after it in its cluster move
    /// up when their probe passes the hole, so lookups never need tombstones. (Records name
    /// their partition by key, never by slot, so a move relinks nothing.)
    fn remove_slot(&mut self, i: usize) {
        let mut removal = Removal::new(i);
        while let Some((from, to)) = removal.next(self.slots) {
            let moved = self.slots[from];
            *self.slot_mut(to) = moved;
            fail::point("offsets.remove");
        }
        *self.slot_mut(removal.hole()) = Slot::default();
        self.h.live -= 1;
    }

    /// (Tests) The structure: every slot found where it is and counted; every slot's list
    /// linked both ways, of its key, in offset order, and its records in no other list;
    /// the free list and the used records cover the pool once; every owner list holds
    /// exactly that owner's records in flight.
    #[cfg(test)]
    fn check(&self) -> Result<(), String> {
        let n = self.recs.len();
        let mut seen = vec![false; n];
        let mut live = 0;
        for (i, s) in self.slots.iter().enumerate() {
            if s.state == EMPTY {
                continue;
            }
            live += 1;
            if table::find(self.slots, &s.key) != Ok(i) {
                return Err(format!("slot {i} is not where a lookup finds it"));
            }
            if ![LOADING, READY, DROPPING].contains(&s.state) {
                return Err(format!("slot {i}: state {}", s.state));
            }
            if s.state != READY && s.first != NIL {
                return Err(format!("slot {i} (state {}) holds reservations", s.state));
            }
            if s.readable > s.head {
                return Err(format!("slot {i}: readable {} past head {}", s.readable, s.head));
            }
            let points: Vec<&LatePoint> = s.late.iter().skip_while(|p| p.at == 0).collect();
            if points.iter().any(|p| p.at == 0 || p.before >= s.readable)
                || points.windows(2).any(|w| w[0].before >= w[1].before)
            {
                return Err(format!("slot {i}: late points {:?} out of order (readable {})", s.late, s.readable));
            }
            let (mut r, mut prev, mut after) = (s.first, NIL, s.readable);
            while r != NIL {
                let rec = self.recs.get(r as usize).ok_or(format!("slot {i}: record {r} out of range"))?;
                if std::mem::replace(&mut seen[r as usize], true) {
                    return Err(format!("slot {i}: record {r} listed twice"));
                }
                if rec.prev != prev || rec.key != s.key {
                    return Err(format!("slot {i}: record {r} linked wrong or of another key"));
                }
                if rec.state != IN_FLIGHT && rec.state != COMMITTED {
                    return Err(format!("slot {i}: record {r} in state {}", rec.state));
                }
                if prev == NIL && rec.state == COMMITTED {
                    return Err(format!("slot {i}: record {r} first and committed, yet not readable"));
                }
                if rec.first <= after || rec.end < rec.first || rec.end > s.head {
                    return Err(format!("slot {i}: record {r} ({}..{}) out of order", rec.first, rec.end));
                }
                if rec.written < rec.first - 1 || rec.written > rec.end {
                    return Err(format!("slot {i}: record {r} wrote {} outside its range", rec.written));
                }
                (prev, after, r) = (r, rec.end, rec.next);
            }
            if s.last != prev {
                return Err(format!("slot {i}: last is {}, the list ends at {prev}", s.last));
            }
        }
        if live != self.h.live || live > self.h.max_live {
            return Err(format!("{live} slots, counted {} (at most {})", self.h.live, self.h.max_live));
        }
        let mut r = self.h.free;
        while r != NIL {
            let rec = self.recs.get(r as usize).ok_or(format!("free record {r} out of range"))?;
            if std::mem::replace(&mut seen[r as usize], true) {
                return Err(format!("free record {r} is used, or listed twice"));
            }
            if rec.state != FREE {
                return Err(format!("free record {r} in state {}", rec.state));
            }
            r = rec.next;
        }
        if let Some(r) = seen.iter().position(|s| !s) {
            return Err(format!("record {r} is neither free nor in a slot's list"));
        }
        let mut owned = vec![false; n];
        for o in 0..self.owners.len() {
            let mut r = self.owners[o];
            let mut xid = None;
            while r != NIL {
                let rec = self.recs.get(r as usize).ok_or(format!("owner {o}: record {r} out of range"))?;
                if std::mem::replace(&mut owned[r as usize], true) {
                    return Err(format!("owner {o}: record {r} listed twice"));
                }
                if rec.owner != o as u32 || rec.state != IN_FLIGHT {
                    return Err(format!("owner {o}: record {r} of owner {} in state {}", rec.owner, rec.state));
                }
                let prepared = o as u32 >= self.h.backends;
                if prepared != (rec.xid != 0) || *xid.get_or_insert(rec.xid) != rec.xid {
                    return Err(format!("owner {o}: record {r} has xid {}", rec.xid));
                }
                r = rec.owner_next;
            }
        }
        for (r, rec) in self.recs.iter().enumerate() {
            if rec.state == IN_FLIGHT && !owned[r] {
                return Err(format!("record {r} is in flight and no owner lists it"));
            }
        }
        Ok(())
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
        /// What readers see of partition `k`: its readable end, head and fresh_max.
        fn ends(&mut self, k: u8) -> (Seen, Option<i64>, Option<i64>) {
            let r = self.reg();
            let v = r.view();
            (v.readable(&key(k)), v.head(&key(k)), v.fresh_max(&key(k)))
        }
        fn load(&mut self, k: u8, end: i64) {
            assert_eq!(self.reg().begin_load(&key(k), 99), Load::Mine);
            self.reg().finish_load(&key(k), 99, end, end, 0);
        }
    }

    /// Partition id `k`.
    fn id(k: u8) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0] = k;
        b[15] = k.wrapping_mul(7);
        b
    }

    /// Partition `k` of database 1.
    fn key(k: u8) -> PartKey {
        part_key(1, id(k))
    }

    #[test]
    fn commits_out_of_order_become_readable_in_order() {
        let mut m = Mem::new(4, 8, 4);
        assert_eq!(m.reg().reserve(&key(1), 1, 0, 1, false, false, 0), Err(Refusal::Unknown));
        m.load(1, 10);
        assert_eq!(m.readable(1), Seen::Readable(10));
        assert_eq!(m.reg().reserve(&key(1), 2, 0, 1, false, false, 0), Ok(11)); // owner 0: 11..12
        assert_eq!(m.reg().reserve(&key(1), 1, 1, 1, false, false, 0), Ok(13)); // owner 1: 13
        m.reg().wrote(&key(1), 0, 12);
        m.reg().wrote(&key(1), 1, 13);
        m.reg().finish(1, true, 0);
        assert_eq!(m.readable(1), Seen::Readable(10), "13 waits for 11..12");
        m.reg().finish(0, true, 0);
        assert_eq!(m.readable(1), Seen::Readable(13));
    }

    #[test]
    fn a_reservation_past_the_last_offset_is_refused_whole() {
        let mut m = Mem::new(4, 8, 4);
        m.load(1, LAST_OFFSET - 2);
        assert_eq!(m.reg().reserve(&key(1), 3, 0, 1, true, false, 0), Err(Refusal::Exhausted));
        assert_eq!(m.reg().reserve(&key(1), i64::MAX, 0, 1, true, false, 0), Err(Refusal::Exhausted));
        assert_eq!(m.reg().reserve(&key(1), 2, 0, 1, true, false, 0), Ok(LAST_OFFSET - 1));
        assert_eq!(m.reg().reserve(&key(1), 1, 1, 1, true, false, 0), Err(Refusal::Exhausted));
        m.reg().finish(0, true, 0);
        m.reg().finish(1, true, 0);
        assert_eq!(m.readable(1), Seen::Readable(LAST_OFFSET), "the refused reservations left nothing behind");
    }

    #[test]
    fn a_slot_takes_what_docs_offsets_md_says() {
        // docs/offsets.md, "When a message became readable": 168 bytes, 72 before the
        // points; a reservation record 88.
        assert_eq!(std::mem::size_of::<Slot>(), 168);
        assert_eq!(std::mem::size_of::<Slot>() - std::mem::size_of::<[LatePoint; LATE_POINTS]>(), 72);
        assert_eq!(std::mem::size_of::<Record>(), 88, "a record, with its push time");
    }

    /// Microseconds of a test's clock: `s` seconds.
    const SEC: i64 = 1_000_000;

    #[test]
    fn a_late_move_of_the_readable_end_is_remembered() {
        let mut m = Mem::new(4, 8, 4);
        m.load(1, 10);
        let after = |m: &mut Mem, o: i64| m.reg().view().readable_after(&key(1), o);
        // A push that commits at once: no point.
        m.reg().reserve(&key(1), 1, 0, 1, true, false, 100 * SEC).unwrap(); // 11
        m.reg().finish(0, true, 100 * SEC + LATE_AFTER - 1);
        assert_eq!(after(&mut m, 11), None, "released within LATE_AFTER of its push");
        // A long push (12, started at 200 s) holds back a short one (13, at 250 s); both
        // become readable when the long one commits, at 400 s.
        m.reg().reserve(&key(1), 1, 0, 1, true, false, 200 * SEC).unwrap(); // 12
        m.reg().reserve(&key(1), 1, 1, 1, true, false, 250 * SEC).unwrap(); // 13
        m.reg().finish(1, true, 250 * SEC);
        assert_eq!(m.readable(1), Seen::Readable(11));
        m.reg().finish(0, true, 400 * SEC);
        assert_eq!(m.readable(1), Seen::Readable(13));
        assert_eq!(after(&mut m, 11), None, "11 was readable before");
        assert_eq!(after(&mut m, 12), Some(400 * SEC));
        assert_eq!(after(&mut m, 13), Some(400 * SEC), "held back by 12");
        // The long push aborts instead: what waited behind it is released late all the same.
        m.reg().reserve(&key(1), 1, 0, 1, true, false, 500 * SEC).unwrap(); // 14
        m.reg().reserve(&key(1), 1, 1, 1, true, false, 501 * SEC).unwrap(); // 15
        m.reg().finish(1, true, 501 * SEC);
        m.reg().finish(0, false, 600 * SEC);
        assert_eq!(m.readable(1), Seen::Readable(15));
        assert_eq!(after(&mut m, 13), Some(400 * SEC));
        assert_eq!(after(&mut m, 15), Some(600 * SEC));
        // So does an aborted savepoint.
        m.reg().reserve(&key(1), 1, 0, 2, true, false, 700 * SEC).unwrap(); // 16
        m.reg().reserve(&key(1), 1, 1, 1, true, false, 701 * SEC).unwrap(); // 17
        m.reg().finish(1, true, 701 * SEC);
        m.reg().abort_subxact(0, 2, 800 * SEC);
        assert_eq!(m.readable(1), Seen::Readable(17));
        assert_eq!(after(&mut m, 17), Some(800 * SEC));
        // Past LATE_POINTS the newest point stays and the least late of the others goes:
        // two ordinary slow commits (a second late each) do not push the long hold-backs
        // out. The first of them goes for the second, and its offset (18) counts from the
        // point before it (less precise, never later than the truth).
        for t in [900, 1000] {
            m.reg().reserve(&key(1), 1, 0, 1, true, false, t * SEC).unwrap(); // 18, 19
            m.reg().finish(0, true, t * SEC + LATE_AFTER);
        }
        assert_eq!(after(&mut m, 12), Some(400 * SEC), "the longest hold-back is kept");
        assert_eq!(after(&mut m, 18), Some(800 * SEC));
        assert_eq!(after(&mut m, 19), Some(1000 * SEC + LATE_AFTER));
        // A partition that only had long hold-backs still notes the next, less late one:
        // three more of 100 s, then one of 2 s.
        for (o, t) in [(20, 1100), (21, 1300), (22, 1500)] {
            m.reg().reserve(&key(1), 1, 0, 1, true, false, t * SEC).unwrap();
            m.reg().finish(0, true, (t + 100) * SEC);
            assert_eq!(after(&mut m, o), Some((t + 100) * SEC));
        }
        m.reg().reserve(&key(1), 1, 0, 1, true, false, 1700 * SEC).unwrap(); // 23
        m.reg().finish(0, true, 1702 * SEC);
        assert_eq!(after(&mut m, 23), Some(1702 * SEC), "the newest is kept");
        assert_eq!(after(&mut m, 12), Some(400 * SEC), "and the longest");
        m.reg().check().unwrap();
    }

    #[test]
    fn merged_reservations_keep_their_earliest_push() {
        let mut m = Mem::new(4, 8, 4);
        m.load(1, 0);
        // 1 in flight holds back 2 (pushed at 10 s) and 3 (at 300 s), merged once committed.
        m.reg().reserve(&key(1), 1, 0, 1, true, false, 299 * SEC).unwrap();
        m.reg().reserve(&key(1), 1, 1, 1, true, false, 10 * SEC).unwrap();
        m.reg().reserve(&key(1), 1, 2, 1, true, false, 300 * SEC).unwrap();
        m.reg().finish(1, true, 300 * SEC);
        m.reg().finish(2, true, 300 * SEC);
        // 1 commits half a second after its push: it alone would not be late, 2 is.
        m.reg().finish(0, true, 299 * SEC + 500_000);
        assert_eq!(m.readable(1), Seen::Readable(3));
        assert_eq!(m.reg().view().readable_after(&key(1), 1), Some(299 * SEC + 500_000));
        m.reg().check().unwrap();
    }

    #[test]
    fn a_transaction_reads_its_own_pushes_unless_another_comes_first() {
        let mut m = Mem::new(4, 8, 4);
        m.load(1, 0);
        m.reg().reserve(&key(1), 2, 0, 1, false, false, 0).unwrap(); // owner 0: 1..2
        m.reg().wrote(&key(1), 0, 2);
        assert_eq!(m.reg().view().readable_for(&key(1), 0), Seen::Readable(2));
        assert_eq!(m.reg().view().readable_for(&key(1), 1), Seen::Readable(0));
        m.reg().reserve(&key(1), 1, 1, 1, false, false, 0).unwrap(); // owner 1: 3
        m.reg().wrote(&key(1), 1, 3);
        m.reg().reserve(&key(1), 1, 0, 1, false, false, 0).unwrap(); // owner 0 again: 4, a new record
        m.reg().wrote(&key(1), 0, 4);
        assert_eq!(m.reg().view().readable_for(&key(1), 0), Seen::Readable(2), "3 is another's, in flight");
        assert_eq!(m.reg().view().readable_for(&key(1), 1), Seen::Readable(0));
        m.reg().finish(1, true, 0);
        assert_eq!(m.reg().view().readable_for(&key(1), 0), Seen::Readable(4));
        assert_eq!(m.readable(1), Seen::Readable(0));
    }

    #[test]
    fn an_abort_leaves_a_gap_and_an_aborted_tail_is_not_readable() {
        let mut m = Mem::new(4, 8, 4);
        m.load(1, 0);
        assert_eq!(m.reg().reserve(&key(1), 1, 0, 1, false, false, 0), Ok(1));
        assert_eq!(m.reg().reserve(&key(1), 1, 1, 1, false, false, 0), Ok(2));
        assert_eq!(m.reg().reserve(&key(1), 1, 2, 1, false, false, 0), Ok(3));
        m.reg().wrote(&key(1), 0, 1);
        m.reg().wrote(&key(1), 2, 3);
        m.reg().finish(1, false, 0); // 2 aborts: a gap
        m.reg().finish(0, true, 0);
        assert_eq!(m.readable(1), Seen::Readable(1));
        m.reg().finish(2, false, 0); // the tail aborts: readable stays on a real message
        assert_eq!(m.readable(1), Seen::Readable(1));
        assert_eq!(m.reg().view().head(&key(1)), Some(3), "offsets are never reused");
        assert_eq!(m.reg().reserve(&key(1), 1, 0, 1, false, false, 0), Ok(4));
    }

    #[test]
    fn a_prepared_transaction_holds_readers_back_until_it_is_finished() {
        let mut m = Mem::new(4, 8, 2);
        m.load(1, 10);
        assert_eq!(m.reg().reserve(&key(1), 2, 0, 1, true, false, 0), Ok(11)); // owner 0: 11..12
        assert!(m.reg().prepare(0, 700));
        assert!(!m.reg().holds(0), "the backend is free for its next transaction");
        assert_eq!(m.reg().prepared(), vec![700]);
        // The same backend pushes again, and commits: 13 waits for the prepared 11..12.
        assert_eq!(m.reg().reserve(&key(1), 1, 0, 1, true, false, 0), Ok(13));
        m.reg().finish(0, true, 0);
        assert_eq!(m.readable(1), Seen::Readable(10));
        assert_eq!(m.reg().view().readable_for(&key(1), 0), Seen::Readable(10), "not its own any more");
        assert!(!m.reg().finish_prepared(701, true, 0), "another xid holds nothing");
        assert!(m.reg().finish_prepared(700, true, 0));
        assert_eq!(m.readable(1), Seen::Readable(13));
        assert!(m.reg().prepared().is_empty());
    }

    #[test]
    fn a_rolled_back_prepared_transaction_leaves_a_gap() {
        let mut m = Mem::new(4, 8, 2);
        m.load(1, 0);
        assert_eq!(m.reg().reserve(&key(1), 1, 1, 1, true, false, 0), Ok(1));
        assert!(m.reg().prepare(1, 9));
        assert_eq!(m.reg().reserve(&key(1), 1, 0, 1, true, false, 0), Ok(2));
        m.reg().finish(0, true, 0);
        assert_eq!(m.readable(1), Seen::Readable(0));
        assert!(m.reg().finish_prepared(9, false, 0));
        assert_eq!(m.readable(1), Seen::Readable(2), "offset 1 is a gap");
        // A later reservation never reuses the gap.
        assert_eq!(m.reg().reserve(&key(1), 1, 1, 1, true, false, 0), Ok(3));
    }

    #[test]
    fn prepared_owners_run_out_cleanly() {
        let mut m = Mem::new(4, 8, 3);
        m.load(1, 0);
        for (owner, xid) in [(0, 5), (1, 6)] {
            m.reg().reserve(&key(1), 1, owner, 1, true, false, 0).unwrap();
            assert!(m.reg().prepare(owner, xid));
        }
        m.reg().reserve(&key(1), 1, 2, 1, true, false, 0).unwrap();
        assert!(!m.reg().prepare(2, 7), "both prepared owners are taken");
        assert!(m.reg().holds(2), "a refused prepare changes nothing");
        assert!(m.reg().finish_prepared(5, true, 0));
        assert!(m.reg().prepare(2, 7), "a finished one is free again");
        let mut xids = m.reg().prepared();
        xids.sort();
        assert_eq!(xids, vec![6, 7]);
    }

    #[test]
    fn a_reservation_that_wrote_nothing_commits_as_a_gap() {
        let mut m = Mem::new(4, 8, 4);
        m.load(1, 5);
        m.reg().reserve(&key(1), 3, 0, 1, false, false, 0).unwrap();
        m.reg().finish(0, true, 0);
        assert_eq!(m.readable(1), Seen::Readable(5));
        m.reg().reserve(&key(1), 3, 0, 1, false, false, 0).unwrap(); // 9..11
        m.reg().wrote(&key(1), 0, 10);
        m.reg().finish(0, true, 0);
        assert_eq!(m.readable(1), Seen::Readable(10));
    }

    #[test]
    fn subtransactions_abort_and_commit_their_reservations() {
        let mut m = Mem::new(4, 8, 4);
        m.load(1, 0);
        m.reg().reserve(&key(1), 1, 0, 1, false, false, 0).unwrap(); // 1, top level
        m.reg().wrote(&key(1), 0, 1);
        m.reg().reserve(&key(1), 1, 0, 2, false, false, 0).unwrap(); // 2, savepoint 2 (a new record)
        m.reg().wrote(&key(1), 0, 2);
        m.reg().abort_subxact(0, 2, 0);
        m.reg().reserve(&key(1), 1, 0, 3, false, false, 0).unwrap(); // 3, savepoint 3, released into 1
        m.reg().wrote(&key(1), 0, 3);
        m.reg().commit_subxact(0, 3, 1);
        m.reg().finish(0, true, 0);
        assert_eq!(m.readable(1), Seen::Readable(3));
        // Had savepoint 2 been kept, readable would be 3 too; what matters is that an
        // aborted savepoint's write is never claimed: reserve once more and abort it.
        m.reg().reserve(&key(1), 1, 0, 4, false, false, 0).unwrap(); // 4
        m.reg().wrote(&key(1), 0, 4);
        m.reg().abort_subxact(0, 4, 0);
        m.reg().finish(0, true, 0);
        assert_eq!(m.readable(1), Seen::Readable(3));
    }

    #[test]
    fn loading_is_exclusive_and_dropped_on_abort() {
        let mut m = Mem::new(2, 4, 4);
        assert_eq!(m.reg().begin_load(&key(1), 0), Load::Mine);
        assert_eq!(m.reg().begin_load(&key(1), 1), Load::Loading);
        assert_eq!(m.reg().reserve(&key(1), 1, 1, 1, false, false, 0), Err(Refusal::Loading));
        assert_eq!(m.readable(1), Seen::Loading);
        m.reg().abandon_load(&key(1), 1); // not the loader: nothing happens
        assert_eq!(m.readable(1), Seen::Loading);
        m.reg().abandon_load(&key(1), 0);
        assert_eq!(m.readable(1), Seen::Unknown);
        assert_eq!(m.reg().begin_load(&key(1), 1), Load::Mine);
        m.reg().finish_load(&key(1), 1, 9, 7, 0);
        assert_eq!(m.readable(1), Seen::Readable(7));
        assert_eq!(m.reg().reserve(&key(1), 1, 1, 1, false, false, 0), Ok(10), "offsets after the stored head");
    }

    #[test]
    fn a_full_table_evicts_only_idle_partitions() {
        let mut m = Mem::new(2, 4, 4);
        m.load(1, 0);
        m.load(2, 0);
        m.reg().reserve(&key(1), 1, 0, 1, false, false, 0).unwrap();
        m.reg().reserve(&key(2), 1, 1, 1, false, false, 0).unwrap();
        assert_eq!(m.reg().begin_load(&key(3), 2), Load::Full, "both have pushes in flight");
        m.reg().finish(1, false, 0);
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
        m.reg().reserve(&key(1), 100, 0, 1, true, false, 0).unwrap(); // 1..100, durable
        assert_eq!(m.reg().view().fresh_max(&key(1)), Some(0));
        m.reg().reserve(&key(1), 2, 1, 1, true, true, 0).unwrap(); // 101..102, fresh
        assert_eq!(m.reg().view().fresh_max(&key(1)), Some(102), "raised at reservation, before any commit");
        m.reg().finish(1, false, 0);
        assert_eq!(m.reg().view().fresh_max(&key(1)), Some(102), "never lowered");
        assert_eq!(m.reg().view().fresh_max(&key(2)), None, "unknown: assume anything");
        m.load(3, 0);
        assert_eq!(m.reg().view().fresh_partitions(1), vec![(id(1), 102)], "only partitions with fresh pushes");
        assert!(m.reg().view().fresh_partitions(2).is_empty(), "only that database's");
    }

    #[test]
    fn the_record_pool_runs_out_cleanly() {
        let mut m = Mem::new(4, 2, 4);
        m.load(1, 0);
        m.reg().reserve(&key(1), 1, 0, 1, false, false, 0).unwrap();
        m.reg().reserve(&key(1), 1, 1, 1, false, false, 0).unwrap();
        assert_eq!(m.reg().reserve(&key(1), 1, 2, 1, false, false, 0), Err(Refusal::Full));
        assert_eq!(m.reg().view().head(&key(1)), Some(2), "a refused reservation takes nothing");
        m.reg().finish(0, false, 0);
        assert_eq!(m.reg().reserve(&key(1), 1, 2, 1, false, false, 0), Ok(3));
    }

    #[test]
    fn keys_carry_the_database() {
        let k = part_key(0x0102_0304, id(5));
        assert_eq!(&k[..4], &[4, 3, 2, 1], "the database first, little-endian");
        assert_eq!((database_of(&k), partition_of(&k)), (0x0102_0304, id(5)));
    }

    #[test]
    fn two_databases_with_the_same_partition_id_are_independent() {
        let mut m = Mem::new(4, 8, 4);
        let (a, b) = (part_key(1, id(1)), part_key(2, id(1)));
        m.load(1, 10);
        assert_eq!(m.reg().reserve(&b, 1, 0, 1, true, false, 0), Err(Refusal::Unknown), "database 2 is not loaded");
        assert_eq!(m.reg().begin_load(&b, 0), Load::Mine);
        m.reg().finish_load(&b, 0, 3, 3, 0);
        assert_eq!(m.reg().live(), 2);
        assert_eq!(m.reg().reserve(&a, 1, 0, 1, true, true, 0), Ok(11));
        assert_eq!(m.reg().reserve(&b, 2, 1, 1, true, false, 0), Ok(4));
        m.reg().finish(1, true, 0);
        assert_eq!(m.reg().view().readable(&a), Seen::Readable(10), "a still waits for 11");
        assert_eq!(m.reg().view().readable(&b), Seen::Readable(5));
        m.reg().finish(0, true, 0);
        assert_eq!(m.reg().view().readable(&a), Seen::Readable(11));
        assert_eq!(m.reg().view().fresh_partitions(1), vec![(id(1), 11)]);
        assert!(m.reg().view().fresh_partitions(2).is_empty());
        m.reg().check().unwrap();
    }

    #[test]
    fn forget_database_drops_only_that_databases_idle_slots() {
        let mut m = Mem::new(8, 8, 4);
        let other = part_key(2, id(1));
        m.load(1, 0);
        m.load(2, 0);
        m.load(3, 0);
        assert_eq!(m.reg().begin_load(&other, 0), Load::Mine);
        m.reg().finish_load(&other, 0, 0, 0, 0);
        m.reg().reserve(&key(2), 1, 0, 1, true, false, 0).unwrap();
        assert_eq!(m.reg().begin_load(&key(4), 1), Load::Mine, "left loading");
        assert_eq!(m.reg().forget_database(1), 2, "1 and 3: 2 has a push in flight, 4 is loading");
        assert_eq!(m.reg().count_database(1), 2, "2 and 4 are kept");
        assert_eq!(m.readable(1), Seen::Unknown);
        assert_eq!(m.readable(3), Seen::Unknown);
        assert_eq!(m.readable(2), Seen::Readable(0));
        assert_eq!(m.readable(4), Seen::Loading);
        assert_eq!(m.reg().view().readable(&other), Seen::Readable(0), "another database keeps its slots");
        assert_eq!(m.reg().live(), 3);
        m.reg().check().unwrap();
        m.reg().finish(0, false, 0);
        assert_eq!(m.reg().forget_database(2), 1);
        assert_eq!(m.reg().forget_database(2), 0);
        assert_eq!(m.reg().count_database(2), 0);
        m.reg().check().unwrap();
    }

    const VXID: (i32, u32) = (7, 42);

    #[test]
    fn a_partition_with_reservations_is_not_dropped() {
        let mut m = Mem::new(4, 8, 4);
        assert_eq!(m.reg().begin_drop(&key(1), 0, VXID), Err(DropRefusal::Unknown));
        assert_eq!(m.reg().begin_load(&key(1), 1), Load::Mine);
        assert_eq!(m.reg().begin_drop(&key(1), 0, VXID), Err(DropRefusal::Loading));
        m.reg().finish_load(&key(1), 1, 0, 0, 0);
        m.reg().reserve(&key(1), 1, 1, 1, true, false, 0).unwrap(); // 1, in flight
        m.reg().reserve(&key(1), 1, 2, 1, true, false, 0).unwrap(); // 2
        assert_eq!(m.reg().begin_drop(&key(1), 0, VXID), Err(DropRefusal::InFlight));
        m.reg().finish(2, true, 0);
        assert_eq!(m.reg().begin_drop(&key(1), 0, VXID), Err(DropRefusal::InFlight), "2 committed, not readable yet");
        m.reg().finish(1, true, 0);
        assert_eq!(m.readable(1), Seen::Readable(2));
        assert_eq!(m.reg().begin_drop(&key(1), 0, VXID), Ok(()));
        assert_eq!(m.reg().begin_drop(&key(1), 0, VXID), Ok(()), "the dropper may ask again");
        assert_eq!(m.reg().begin_drop(&key(1), 1, (8, 1)), Err(DropRefusal::Dropping(VXID)));
        m.reg().check().unwrap();
    }

    #[test]
    fn a_drop_that_aborts_leaves_the_partition_as_it_was() {
        let mut m = Mem::new(4, 8, 4);
        m.load(1, 5);
        m.reg().reserve(&key(1), 2, 1, 1, true, true, 0).unwrap(); // 6..7, fresh
        m.reg().finish(1, true, 0);
        let before = m.ends(1);
        assert_eq!(before, (Seen::Readable(7), Some(7), Some(7)));
        m.reg().begin_drop(&key(1), 0, VXID).unwrap();
        // Readers see it as before; pushes wait for the dropper; loads wait too.
        assert_eq!(m.ends(1), before);
        assert_eq!(m.reg().view().readable_for(&key(1), 1), Seen::Readable(7));
        assert_eq!(m.reg().view().fresh_partitions(1), vec![(id(1), 7)]);
        assert_eq!(m.reg().reserve(&key(1), 1, 1, 1, true, false, 0), Err(Refusal::Dropping(VXID)));
        assert_eq!(m.reg().reserve(&key(1), 1, 0, 1, true, false, 0), Err(Refusal::Dropping(VXID)), "even the dropper");
        assert_eq!(m.reg().begin_load(&key(1), 1), Load::Loading);
        m.reg().end_drop(&key(1), 1, false); // not the dropper: nothing happens
        assert_eq!(m.reg().reserve(&key(1), 1, 1, 1, true, false, 0), Err(Refusal::Dropping(VXID)));
        m.reg().check().unwrap();
        m.reg().end_drop(&key(1), 0, false);
        assert_eq!(m.ends(1), before);
        assert_eq!(m.reg().reserve(&key(1), 1, 1, 1, true, false, 0), Ok(8), "offsets go on after the head");
        m.reg().check().unwrap();
    }

    #[test]
    fn a_drop_that_commits_removes_the_slot() {
        let mut m = Mem::new(2, 8, 4);
        m.load(1, 5);
        m.load(2, 0);
        m.reg().begin_drop(&key(1), 0, VXID).unwrap();
        // A full table evicts neither a slot being dropped nor one with a push in flight.
        m.reg().reserve(&key(2), 1, 1, 1, true, false, 0).unwrap();
        assert_eq!(m.reg().begin_load(&key(3), 2), Load::Full);
        m.reg().end_drop(&key(1), 0, true);
        assert_eq!(m.reg().live(), 1);
        assert_eq!(m.readable(1), Seen::Unknown);
        assert_eq!(m.reg().reserve(&key(1), 1, 1, 1, true, false, 0), Err(Refusal::Unknown));
        m.reg().end_drop(&key(1), 0, false); // gone already: nothing happens
        assert_eq!(m.reg().evictions(), 0);
        m.reg().check().unwrap();
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
        /// (from the model's "database") change nothing a reader sees; a late point never
        /// says an offset became readable later than it did.
        #[test]
        fn prop_readable_matches_the_model(ops in proptest::collection::vec(op(), 1..200)) {
            let mut m = Mem::new(3, 64, 4);
            let mut model: Vec<Res> = Vec::new();
            // The clock: 370 ms a step, so a transaction over three steps is late. Per
            // owner, its transaction's start; per offset, when it became readable.
            let mut now = 0i64;
            let mut starts: Vec<Option<i64>> = vec![None; 4];
            let mut readable_at: BTreeMap<(u8, i64), i64> = BTreeMap::new();
            let mut last_seen: BTreeMap<u8, i64> = BTreeMap::new();
            // Per owner: the stack of open subtransaction ids (1 = top level).
            let mut stacks: Vec<Vec<u32>> = vec![vec![1]; 4];
            let mut next_sub = 2u32;
            let db_end = |model: &Vec<Res>, part: u8| -> i64 {
                // What a snapshot shows: the highest committed written offset.
                model.iter().filter(|r| r.part == part && r.fate == Some(true)).filter_map(|r| r.written).max().unwrap_or(0)
            };
            for op in ops {
                now += 370_000;
                match op {
                    Op::Reserve { owner, part, n, write, all } => {
                        let sub = *stacks[owner as usize].last().unwrap();
                        let fresh = n % 2 == 0;
                        let since = *starts[owner as usize].get_or_insert(now);
                        let got = loop {
                            let reserved = m.reg().reserve(&key(part), n, owner, sub, all, fresh, since);
                            match reserved {
                                Err(Refusal::Unknown) => {
                                    let loaded = m.reg().begin_load(&key(part), owner);
                                    match loaded {
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
                        m.reg().finish(owner, commit, now);
                        starts[owner as usize] = None;
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
                            m.reg().abort_subxact(owner, sub, now);
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
                if let Err(e) = m.reg().check() {
                    prop_assert!(false, "{}", e);
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
                            for o in 1..=got {
                                let at = *readable_at.entry((part, o)).or_insert(now);
                                if let Some(after) = m.reg().view().readable_after(&key(part), o) {
                                    prop_assert!(after <= at, "partition {} offset {}: readable after {}, was at {}", part, o, after, at);
                                }
                            }
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

    /// A panic half way through any update (every fail point of the offset registry, at
    /// any of its hits) leaves the registry exactly as it was before that update.
    #[cfg(feature = "failpoints")]
    mod failpoints {
        use super::*;

        /// The offset registry's fail points.
        fn points() -> Vec<&'static str> {
            crate::fail::POINTS.iter().copied().filter(|p| p.starts_with("offsets.")).collect()
        }

        fn quiet_fail_points() {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                let prev = std::panic::take_hook();
                std::panic::set_hook(Box::new(move |info| {
                    let msg = info.payload().downcast_ref::<String>().map(String::as_str).unwrap_or("");
                    if !msg.starts_with("queen fail point") {
                        prev(info);
                    }
                }));
            });
        }

        /// Partition `part` of database `db`.
        fn pkey(db: u32, part: u8) -> PartKey {
            part_key(db, id(part))
        }

        /// Every kind of update, on one partition of a small table (evictions included).
        fn scenario(m: &mut Mem) {
            for k in 0..32u8 {
                let mut r = m.reg();
                if r.begin_load(&key(k), 9) == Load::Mine {
                    r.finish_load(&key(k), 9, 0, 0, 0);
                }
            }
            let k = key(31);
            let mut r = m.reg();
            r.reserve(&k, 2, 0, 1, false, true, 0).unwrap();
            r.reserve(&k, 1, 0, 1, false, false, 0).unwrap(); // grows in place
            r.wrote(&k, 0, 2);
            r.reserve(&k, 1, 1, 1, true, false, 0).unwrap();
            r.reserve(&k, 1, 0, 2, true, false, 0).unwrap();
            r.commit_subxact(0, 2, 1);
            r.reserve(&k, 1, 0, 3, true, false, 0).unwrap();
            r.abort_subxact(0, 3, 0);
            assert!(r.prepare(1, 77));
            r.finish(0, true, 0);
            assert!(r.finish_prepared(77, true, 0));
            r.begin_drop(&k, 0, VXID).unwrap();
            r.end_drop(&k, 0, false);
            r.begin_drop(&k, 0, VXID).unwrap();
            r.end_drop(&k, 0, true);
            assert_eq!(r.forget_database(1), 1);
        }

        #[test]
        fn every_fail_point_is_reached() {
            quiet_fail_points();
            let mut m = Mem::new(2, 8, 3);
            scenario(&mut m);
            m.reg().check().unwrap();
            for p in points() {
                let mut m = Mem::new(2, 8, 3);
                crate::fail::testing::arm(p, 0);
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(&mut m)));
                let fired = crate::fail::testing::fired();
                crate::fail::testing::disarm();
                assert!(result.is_err() && fired, "fail point {p} is never reached");
                m.reg().check().unwrap();
            }
        }

        #[derive(Debug, Clone)]
        enum FOp {
            Load { db: u32, part: u8, abandon: bool, end: i64 },
            Reserve { owner: u32, db: u32, part: u8, n: i64, all: bool, fresh: bool },
            Wrote { owner: u32, back: i64 },
            Finish { owner: u32, commit: bool },
            Prepare { owner: u32 },
            FinishPrepared { which: usize, commit: bool },
            Savepoint { owner: u32 },
            Rollback { owner: u32 },
            Release { owner: u32 },
            BeginDrop { owner: u32, db: u32, part: u8 },
            Forget { db: u32 },
        }

        fn fop() -> impl Strategy<Value = FOp> {
            let part = || (1u32..3, 0u8..4);
            prop_oneof![
                2 => (part(), any::<bool>(), 0i64..20).prop_map(|((db, part), abandon, end)| FOp::Load { db, part, abandon, end }),
                5 => (0u32..3, part(), 1i64..4, any::<bool>(), any::<bool>())
                    .prop_map(|(owner, (db, part), n, all, fresh)| FOp::Reserve { owner, db, part, n, all, fresh }),
                2 => (0u32..3, 0i64..3).prop_map(|(owner, back)| FOp::Wrote { owner, back }),
                3 => (0u32..3, any::<bool>()).prop_map(|(owner, commit)| FOp::Finish { owner, commit }),
                1 => (0u32..3).prop_map(|owner| FOp::Prepare { owner }),
                1 => (0usize..2, any::<bool>()).prop_map(|(which, commit)| FOp::FinishPrepared { which, commit }),
                2 => (0u32..3).prop_map(|owner| FOp::Savepoint { owner }),
                2 => (0u32..3).prop_map(|owner| FOp::Rollback { owner }),
                2 => (0u32..3).prop_map(|owner| FOp::Release { owner }),
                3 => (0u32..3, part()).prop_map(|(owner, (db, part))| FOp::BeginDrop { owner, db, part }),
                1 => (1u32..3).prop_map(|db| FOp::Forget { db }),
            ]
        }

        /// What the test remembers of each backend's transaction: its open subtransactions
        /// (1: the top level) and the partitions it is dropping.
        #[derive(Debug, Clone)]
        struct Txns {
            stacks: Vec<Vec<u32>>,
            drops: Vec<(u32, PartKey)>,
            next_sub: u32,
            next_xid: u32,
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]
            #[test]
            fn prop_a_panic_mid_update_changes_nothing(
                ops in proptest::collection::vec((fop(), proptest::option::of((0usize..9, 0u32..3))), 1..150)
            ) {
                quiet_fail_points();
                crate::fail::testing::disarm();
                let points = points();
                let mut m = Mem::new(3, 10, 3);
                let mut txns = Txns { stacks: vec![vec![1]; 3], drops: Vec::new(), next_sub: 2, next_xid: 100 };
                // An armed point stays armed until it fires (most operations pass no point);
                // then the next one is armed.
                let mut armed = false;
                for (op, arm) in ops {
                    if let (Some((p, skip)), false) = (arm, armed) {
                        crate::fail::testing::arm(points[p % points.len()], skip);
                        armed = true;
                    }
                    let before = (m.h, m.slots.clone(), m.recs.clone(), m.owners.clone());
                    let mut next = txns.clone();
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let mut r = m.reg();
                        match op {
                            FOp::Load { db, part, abandon, end } => {
                                let k = pkey(db, part);
                                if r.begin_load(&k, 9) == Load::Mine {
                                    if abandon {
                                        r.abandon_load(&k, 9);
                                    } else {
                                        r.finish_load(&k, 9, end + 2, end, end);
                                    }
                                }
                            }
                            FOp::Reserve { owner, db, part, n, all, fresh } => {
                                let (k, sub) = (pkey(db, part), *next.stacks[owner as usize].last().unwrap());
                                if r.reserve(&k, n, owner, sub, all, fresh, 0) == Err(Refusal::Unknown)
                                    && r.begin_load(&k, owner) == Load::Mine
                                {
                                    r.finish_load(&k, owner, 3, 1, 0);
                                    // Loaded now: taken, or refused because every record
                                    // is in use (a small registry fills up).
                                    let again = r.reserve(&k, n, owner, sub, all, fresh, 0);
                                    assert!(matches!(again, Ok(_) | Err(Refusal::Full)), "{again:?}");
                                }
                            }
                            FOp::Wrote { owner, back } => {
                                // The owner's newest reservation (or one offset before it).
                                let newest = r.owners[owner as usize];
                                if newest != NIL {
                                    let rec = r.recs[newest as usize];
                                    r.wrote(&rec.key, owner, rec.end - back);
                                }
                            }
                            FOp::Finish { owner, commit } => {
                                r.finish(owner, commit, 2 * LATE_AFTER); // every release late: points noted
                                for (_, k) in next.drops.iter().filter(|d| d.0 == owner) {
                                    r.end_drop(k, owner, commit);
                                }
                                next.drops.retain(|d| d.0 != owner);
                                next.stacks[owner as usize] = vec![1];
                            }
                            FOp::Prepare { owner } => {
                                // (A transaction dropping a partition is not prepared.)
                                if !next.drops.iter().any(|d| d.0 == owner) && r.prepare(owner, next.next_xid) {
                                    next.next_xid += 1;
                                    next.stacks[owner as usize] = vec![1];
                                }
                            }
                            FOp::FinishPrepared { which, commit } => {
                                let xids = r.prepared();
                                if !xids.is_empty() {
                                    assert!(r.finish_prepared(xids[which % xids.len()], commit, 2 * LATE_AFTER));
                                }
                            }
                            FOp::Savepoint { owner } => {
                                next.stacks[owner as usize].push(next.next_sub);
                                next.next_sub += 1;
                            }
                            FOp::Rollback { owner } => {
                                if next.stacks[owner as usize].len() > 1 {
                                    let sub = next.stacks[owner as usize].pop().unwrap();
                                    r.abort_subxact(owner, sub, 2 * LATE_AFTER);
                                }
                            }
                            FOp::Release { owner } => {
                                if next.stacks[owner as usize].len() > 1 {
                                    let sub = next.stacks[owner as usize].pop().unwrap();
                                    let parent = *next.stacks[owner as usize].last().unwrap();
                                    r.commit_subxact(owner, sub, parent);
                                }
                            }
                            FOp::BeginDrop { owner, db, part } => {
                                let k = pkey(db, part);
                                if r.begin_drop(&k, owner, (owner as i32 + 1, 5)).is_ok() && !next.drops.contains(&(owner, k)) {
                                    next.drops.push((owner, k));
                                }
                            }
                            FOp::Forget { db } => {
                                r.forget_database(db);
                            }
                        }
                    }));
                    let fired = armed && crate::fail::testing::fired();
                    match result {
                        Ok(()) => {
                            prop_assert!(!fired, "a fail point fired without a panic");
                            txns = next;
                        }
                        Err(_) => {
                            armed = false;
                            prop_assert!(fired, "only an armed fail point panics");
                            prop_assert!(m.h == before.0 && m.slots == before.1 && m.recs == before.2 && m.owners == before.3,
                                "a panic in {:?} left the registry changed", op);
                        }
                    }
                    if let Err(e) = m.reg().check() {
                        prop_assert!(false, "after {:?}: {}", op, e);
                    }
                    // A partition being dropped reads as ready and refuses reservations.
                    for (owner, k) in &txns.drops {
                        let got = m.reg().reserve(k, 1, 0, 1, true, false, 0);
                        prop_assert_eq!(got, Err(Refusal::Dropping((*owner as i32 + 1, 5))));
                        prop_assert!(matches!(m.reg().view().readable(k), Seen::Readable(_)));
                    }
                }
            }
        }
    }
}
