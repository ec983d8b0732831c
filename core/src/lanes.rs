//! The lane registry: each lane's cursor and lease, kept where no row version is written.
//!
//! A lane is one (partition, consumer group). Every pop and every ack changes its state,
//! and a table row updated that often grows a chain of versions that every lookup walks
//! whenever a long transaction holds the xmin horizon back. So the live state of a lane
//! lives here, in one fixed block of memory (PostgreSQL shared memory in the extension):
//!
//! - the cursor (`committed`), the retry budget used, the attempt counter;
//! - the lease: its id, expiry and the end of its span (`batch_end`).
//!
//! What must survive a crash is written elsewhere by the caller: an ack appends the new
//! cursor and retry count to a journal table, and a background pass copies cursors into
//! the lanes table now and then. A lease is not durable: after a crash its messages are
//! delivered again, which at-least-once delivery allows.
//!
//! **Locks.** A transaction that changes a lane locks it until it ends, as a row lock
//! would: it changes the state at once and keeps the state it found, so that an abort
//! restores it. Other transactions do not see a locked lane's state as theirs to change:
//! a pop skips it, an ack or an extension waits for the holder (the caller waits on the
//! holder's transaction and tries again). The holder itself sees its own changes.
//!
//! **Leases.** A lease id names the lanes one pop claimed; the registry keeps a lease
//! table (lease id -> its lanes, its queue and group) for the calls that only name the
//! lease (`ack(lease_id)`, `extend_lease`, `may_start`).
//!
//! Lanes and leases live in two open-addressing hash tables whose slots never move
//! (deletion leaves a tombstone, reused by later inserts), so a lane's slot index is a
//! stable handle: leases chain their lanes through them.

/// No slot / end of a list.
pub const NIL: u32 = u32::MAX;

const EMPTY: u32 = 0;
const LOADING: u32 = 1;
const READY: u32 = 2;
const TOMB: u32 = 3;

/// Longest consumer-group name a lease records (queen's names are at most 200 bytes).
pub const GROUP_MAX: usize = 200;

/// A lane's identity: the partition id and a 128-bit hash of the consumer group's name.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LaneKey {
    pub partition: [u8; 16],
    pub group: [u8; 16],
}

/// The 128-bit hash of a group name that `LaneKey` uses (two independent 64-bit FNV-1a
/// variants; a collision would need 2^64 names).
pub fn group_hash(name: &str) -> [u8; 16] {
    let mut a: u64 = 0xcbf2_9ce4_8422_2325;
    let mut b: u64 = 0x84222325_cbf29ce4;
    for &c in name.as_bytes() {
        a = (a ^ u64::from(c)).wrapping_mul(0x0000_0100_0000_01b3);
        b = (b ^ u64::from(c).wrapping_add(0x9e)).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(17);
    }
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&a.to_le_bytes());
    out[8..].copy_from_slice(&b.to_le_bytes());
    out
}

/// Who holds a lane's lock: a backend, and its virtual transaction (to wait on).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    pub owner: u32,
    pub vxid_backend: i32,
    pub vxid_local: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Header {
    pub lane_slots: u32,
    pub max_lanes: u32,
    pub lease_slots: u32,
    pub max_leases: u32,
    lanes_live: u32,
    lanes_used: u32,
    leases_live: u32,
    leases_used: u32,
    hand: u32,
    _pad: u32,
}

/// A lane's state, as it is seen and as it is saved for an abort.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub committed: i64,
    pub retry_count: i32,
    pub attempt_count: i32,
    /// First offset of the latest claim (0: none): a reclaim at the same start counts an attempt.
    pub claim_start: i64,
    /// When the lane was last claimed (0: never), microseconds.
    pub last_claimed: i64,
    /// The lease: its id (all zero: none), expiry and span end.
    pub lease_id: [u8; 16],
    pub lease_expires: i64,
    pub batch_end: i64,
    /// Bumped by every committed change of `committed` or `retry_count` (the journal's order).
    pub journal_seq: i64,
}

impl State {
    pub fn has_lease(&self) -> bool {
        self.lease_id != [0; 16]
    }
    /// A lease that has not expired at `now` (`lane::lease_live`).
    pub fn live_lease(&self, now: i64) -> bool {
        self.has_lease() && crate::lane::lease_live(Some(self.lease_expires), now)
    }
    /// Whether `lease_id` holds this lane at `now` (`lane::Lane::held_by`).
    pub fn held_by(&self, lease_id: &[u8; 16], now: i64) -> bool {
        crate::lane::Lane::from_registry(self).held_by(u128::from_be_bytes(*lease_id), now)
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LaneSlot {
    key: LaneKey,
    status: u32,
    loader: u32,
    state: State,
    /// The lease slot the lane is chained into (NIL: none), and its neighbours there.
    lease: u32,
    lease_prev: u32,
    lease_next: u32,
    /// The lock: `holder.owner` is NIL when the lane is free.
    holder: Holder,
    /// The holder's transaction changed the cursor or the retry count.
    changed: u32,
    /// A committed change not yet saved to the lanes table.
    dirty: u32,
    /// The database the lane belongs to (its lanes table and journal are there).
    database: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LeaseSlot {
    id: [u8; 16],
    status: u32,
    first: u32,
    count: u32,
    group_len: u32,
    queue_id: i64,
    group: [u8; GROUP_MAX],
}

impl Default for LeaseSlot {
    fn default() -> Self {
        LeaseSlot { id: [0; 16], status: EMPTY, first: NIL, count: 0, group_len: 0, queue_id: 0, group: [0; GROUP_MAX] }
    }
}

/// Sizes of the registry's parts, laid out one after another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub lanes: usize,
    pub leases: usize,
}

impl Layout {
    pub fn new(max_lanes: usize, max_leases: usize) -> Layout {
        Layout {
            lanes: (max_lanes.max(1) * 2).next_power_of_two(),
            leases: (max_leases.max(1) * 2).next_power_of_two(),
        }
    }
    pub fn lanes_at(&self) -> usize {
        std::mem::size_of::<Header>().next_multiple_of(8)
    }
    pub fn leases_at(&self) -> usize {
        self.lanes_at() + self.lanes * std::mem::size_of::<LaneSlot>()
    }
    pub fn size(&self) -> usize {
        self.leases_at() + self.leases * std::mem::size_of::<LeaseSlot>()
    }
}

/// What a reader learns about a lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The state, and who holds the lane's lock (None: nobody).
    Ready(State, Option<Holder>),
    Loading,
    Unknown,
}

/// What `begin_load` decided (see `offsets::Load`: the same protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    Ready,
    Loading,
    Mine,
    Full,
}

/// Why a lock could not be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    /// Not in the registry yet: load it.
    Unknown,
    Loading,
    /// Another transaction holds it: wait for it (or skip the lane).
    Held(Holder),
}

/// A lease and its lanes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    pub queue_id: i64,
    pub group: String,
    pub lanes: Vec<LaneKey>,
}

fn hash_bytes(bytes: &[u8]) -> u64 {
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

fn key_hash(k: &LaneKey) -> u64 {
    let mut b = [0u8; 32];
    b[..16].copy_from_slice(&k.partition);
    b[16..].copy_from_slice(&k.group);
    hash_bytes(&b)
}

/// Finds a key: Ok(slot) when present; Err(slot to insert at) when absent (the first
/// tombstone on the probe path, else the empty slot that ended it).
/// Where a backward-shift deletion may move the entry at `j` of a table with `mask`: to
/// the hole at `hole` when its home `home` is not cyclically between the hole and `j`
/// (its probe passes the hole).
fn may_fill(hole: usize, j: usize, home: usize, mask: usize) -> bool {
    (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask)
}

fn find_lane(slots: &[LaneSlot], key: &LaneKey) -> Result<usize, usize> {
    let mask = slots.len() - 1;
    let mut i = key_hash(key) as usize & mask;
    let mut tomb = None;
    for _ in 0..slots.len() {
        let s = &slots[i];
        match s.status {
            EMPTY => return Err(tomb.unwrap_or(i)),
            TOMB => {
                tomb.get_or_insert(i);
            }
            _ if s.key == *key => return Ok(i),
            _ => {}
        }
        i = (i + 1) & mask;
    }
    Err(tomb.expect("a table with no empty slot has tombstones"))
}

fn find_lease(slots: &[LeaseSlot], id: &[u8; 16]) -> Result<usize, usize> {
    let mask = slots.len() - 1;
    let mut i = hash_bytes(id) as usize & mask;
    let mut tomb = None;
    for _ in 0..slots.len() {
        let s = &slots[i];
        match s.status {
            EMPTY => return Err(tomb.unwrap_or(i)),
            TOMB => {
                tomb.get_or_insert(i);
            }
            _ if s.id == *id => return Ok(i),
            _ => {}
        }
        i = (i + 1) & mask;
    }
    Err(tomb.expect("a table with no empty slot has tombstones"))
}

/// A read-only view, for readers holding the lock in shared mode.
pub struct View<'a> {
    lanes: &'a [LaneSlot],
    leases: &'a [LeaseSlot],
}

impl<'a> View<'a> {
    pub fn new(_h: &'a Header, lanes: &'a [LaneSlot], leases: &'a [LeaseSlot]) -> Self {
        View { lanes, leases }
    }

    pub fn lane(&self, key: &LaneKey) -> Seen {
        match find_lane(self.lanes, key) {
            Ok(i) if self.lanes[i].status == READY => {
                let s = &self.lanes[i];
                Seen::Ready(s.state, (s.holder.owner != NIL).then_some(s.holder))
            }
            Ok(_) => Seen::Loading,
            Err(_) => Seen::Unknown,
        }
    }

    /// A lease's queue, group and lanes (None: unknown, or no lane holds it any more).
    pub fn lease(&self, id: &[u8; 16]) -> Option<LeaseInfo> {
        let l = &self.leases[find_lease(self.leases, id).ok()?];
        let mut lanes = Vec::with_capacity(l.count as usize);
        let mut i = l.first;
        while i != NIL {
            lanes.push(self.lanes[i as usize].key);
            i = self.lanes[i as usize].lease_next;
        }
        Some(LeaseInfo {
            queue_id: l.queue_id,
            group: String::from_utf8_lossy(&l.group[..l.group_len as usize]).into_owned(),
            lanes,
        })
    }
}

/// The registry, for a writer holding the lock exclusively.
pub struct Registry<'a> {
    h: &'a mut Header,
    lanes: &'a mut [LaneSlot],
    leases: &'a mut [LeaseSlot],
}

impl<'a> Registry<'a> {
    pub fn new(h: &'a mut Header, lanes: &'a mut [LaneSlot], leases: &'a mut [LeaseSlot]) -> Self {
        Registry { h, lanes, leases }
    }

    /// Initialises fresh memory.
    pub fn format(
        h: &'a mut Header,
        lanes: &'a mut [LaneSlot],
        leases: &'a mut [LeaseSlot],
        max_lanes: usize,
        max_leases: usize,
    ) -> Self {
        assert!(lanes.len().is_power_of_two() && lanes.len() >= 2 * max_lanes.max(1));
        assert!(leases.len().is_power_of_two() && leases.len() >= 2 * max_leases.max(1));
        *h = Header {
            lane_slots: lanes.len() as u32,
            max_lanes: max_lanes.max(1) as u32,
            lease_slots: leases.len() as u32,
            max_leases: max_leases.max(1) as u32,
            ..Header::default()
        };
        lanes.fill(LaneSlot::default());
        leases.fill(LeaseSlot::default());
        Registry { h, lanes, leases }
    }

    pub fn view(&self) -> View<'_> {
        View { lanes: self.lanes, leases: self.leases }
    }

    pub fn lanes_live(&self) -> usize {
        self.h.lanes_live as usize
    }

    pub fn leases_live(&self) -> usize {
        self.h.leases_live as usize
    }

    // ---- loading ----

    /// Starts loading a lane for `owner`; a full table evicts an idle lane first (one
    /// nobody holds, with no live lease at `now` and nothing unsaved).
    pub fn begin_load(&mut self, key: &LaneKey, owner: u32, now: i64) -> Load {
        let i = match find_lane(self.lanes, key) {
            Ok(i) if self.lanes[i].status == READY => return Load::Ready,
            Ok(_) => return Load::Loading,
            Err(i) => i,
        };
        if self.h.lanes_live >= self.h.max_lanes && !self.evict_one(now) {
            return Load::Full;
        }
        // (An eviction may have moved the free slot.)
        let i = if self.h.lanes_live < self.h.max_lanes { find_lane(self.lanes, key).expect_err("absent") } else { i };
        // Too many tombstones make misses slow: keep at least a quarter of the slots empty.
        if self.h.lanes_used >= self.h.lane_slots - self.h.lane_slots / 4 && self.lanes[i].status == EMPTY {
            return Load::Full;
        }
        if self.lanes[i].status == EMPTY {
            self.h.lanes_used += 1;
        }
        self.lanes[i] = LaneSlot {
            key: *key,
            status: LOADING,
            loader: owner,
            lease: NIL,
            lease_prev: NIL,
            lease_next: NIL,
            holder: Holder { owner: NIL, ..Holder::default() },
            ..LaneSlot::default()
        };
        self.h.lanes_live += 1;
        Load::Mine
    }

    /// Ends a load with the lane's durable state, read in `database`: its cursor and retry
    /// count as of the journal entry `state.journal_seq` (or the lanes table when the
    /// journal has none). A stored lease (the lanes table of a version that kept leases
    /// there) is taken over when it is live at `now` and covers a span past the cursor,
    /// under `lease` (queue id, group); otherwise the lane starts with no lease.
    pub fn finish_load(
        &mut self,
        key: &LaneKey,
        owner: u32,
        state: State,
        lease: Option<(i64, &str)>,
        database: u32,
        now: i64,
    ) {
        let Ok(i) = find_lane(self.lanes, key) else { return };
        if self.lanes[i].status != LOADING || self.lanes[i].loader != owner {
            return;
        }
        self.lanes[i].status = READY;
        self.lanes[i].database = database;
        let bare = State {
            committed: state.committed,
            retry_count: state.retry_count,
            journal_seq: state.journal_seq,
            ..State::default()
        };
        let keep = state.live_lease(now) && state.batch_end > state.committed && lease.is_some();
        if !(keep && self.set_state(i, state, lease, now)) {
            self.lanes[i].state = bare;
        }
    }

    /// Drops a load `owner` started and did not finish.
    pub fn abandon_load(&mut self, key: &LaneKey, owner: u32) {
        if let Ok(i) = find_lane(self.lanes, key) {
            if self.lanes[i].status == LOADING && self.lanes[i].loader == owner {
                self.remove_lane(i);
            }
        }
    }

    /// Forgets lanes (their queue was deleted).
    pub fn forget(&mut self, keys: &[LaneKey]) {
        for k in keys {
            if let Ok(i) = find_lane(self.lanes, k) {
                if self.lanes[i].status == READY {
                    self.unchain(i);
                    self.remove_lane(i);
                }
            }
        }
    }

    /// Empties lane slot `i` (unchained from any lease) by backward-shift deletion: the
    /// entries after it in its cluster move up when their probe passes the hole, so no
    /// tombstone is left and lanes coming and going never fill the table. A moved lane's
    /// lease chain is pointed at its new slot.
    fn remove_lane(&mut self, i: usize) {
        debug_assert_eq!(self.lanes[i].lease, NIL);
        let mask = self.lanes.len() - 1;
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            if self.lanes[j].status == EMPTY || j == i {
                break;
            }
            let home = key_hash(&self.lanes[j].key) as usize & mask;
            if self.lanes[j].status != TOMB && may_fill(hole, j, home, mask) {
                self.lanes[hole] = self.lanes[j];
                self.relink_lane(j, hole);
                hole = j;
            }
        }
        self.lanes[hole] = LaneSlot::default();
        self.h.lanes_live -= 1;
        self.h.lanes_used -= 1;
    }

    /// The lane that was in slot `from` is in slot `to` now: its lease chain says so.
    fn relink_lane(&mut self, from: usize, to: usize) {
        let s = self.lanes[to];
        if s.lease == NIL {
            return;
        }
        if s.lease_prev == NIL {
            self.leases[s.lease as usize].first = to as u32;
        } else {
            self.lanes[s.lease_prev as usize].lease_next = to as u32;
        }
        if s.lease_next != NIL {
            self.lanes[s.lease_next as usize].lease_prev = to as u32;
        }
        let _ = from;
    }

    /// (Tests) The tables' structure: every entry found where it is, the counters right,
    /// every lease chain linked both ways, counted, and pointing at its lease.
    #[cfg(test)]
    fn check(&self) -> Result<(), String> {
        let mut live = 0;
        for (i, s) in self.lanes.iter().enumerate() {
            if s.status == EMPTY {
                continue;
            }
            live += 1;
            if find_lane(self.lanes, &s.key) != Ok(i) {
                return Err(format!("lane slot {i} is not where a lookup finds it"));
            }
        }
        if live != self.h.lanes_live || live != self.h.lanes_used {
            return Err(format!("{live} lanes, counted {} / {}", self.h.lanes_live, self.h.lanes_used));
        }
        let (mut leases, mut chained) = (0, 0);
        for (l, s) in self.leases.iter().enumerate() {
            if s.status == EMPTY {
                continue;
            }
            leases += 1;
            if find_lease(self.leases, &s.id) != Ok(l) {
                return Err(format!("lease slot {l} is not where a lookup finds it"));
            }
            let (mut k, mut prev, mut n) = (s.first, NIL, 0);
            while k != NIL {
                let lane = &self.lanes[k as usize];
                if lane.lease != l as u32 || lane.lease_prev != prev {
                    return Err(format!("lease slot {l}: lane slot {k} is linked wrong"));
                }
                (prev, k, n) = (k, lane.lease_next, n + 1);
            }
            if n != s.count || n == 0 {
                return Err(format!("lease slot {l}: {n} lanes chained, counted {}", s.count));
            }
            chained += n;
        }
        let on_leases = self.lanes.iter().filter(|s| s.status != EMPTY && s.lease != NIL).count() as u32;
        if leases != self.h.leases_live || leases != self.h.leases_used || chained != on_leases {
            return Err(format!(
                "{leases} leases ({} / {}); {chained} chained of {on_leases}",
                self.h.leases_live, self.h.leases_used
            ));
        }
        Ok(())
    }

    /// Empties lease slot `l` (no lane on its chain), as `remove_lane` does lanes.
    fn remove_lease(&mut self, l: usize) {
        let mask = self.leases.len() - 1;
        let mut hole = l;
        let mut j = l;
        loop {
            j = (j + 1) & mask;
            if self.leases[j].status == EMPTY || j == l {
                break;
            }
            let home = hash_bytes(&self.leases[j].id) as usize & mask;
            if self.leases[j].status != TOMB && may_fill(hole, j, home, mask) {
                self.leases[hole] = self.leases[j];
                // Every lane on the moved lease's chain points at its new slot.
                let mut k = self.leases[hole].first;
                while k != NIL {
                    self.lanes[k as usize].lease = hole as u32;
                    k = self.lanes[k as usize].lease_next;
                }
                hole = j;
            }
        }
        self.leases[hole] = LeaseSlot::default();
        self.h.leases_live -= 1;
        self.h.leases_used -= 1;
    }

    /// Evicts a ready lane nobody holds, with no live lease at `now` and nothing unsaved.
    fn evict_one(&mut self, now: i64) -> bool {
        let n = self.lanes.len();
        // A lane waiting out a retry backoff (whose end lives only here) goes only when no
        // other lane can: evicted, it comes back without its backoff, as after a restart,
        // and its message is delivered again at once.
        for spare_backoffs in [true, false] {
            for k in 0..n {
                let i = (self.h.hand as usize + k) % n;
                let s = &self.lanes[i];
                let idle = s.status == READY && s.holder.owner == NIL && s.dirty == 0 && s.changed == 0;
                let pinned = if spare_backoffs { s.state.lease_expires > now } else { s.state.live_lease(now) };
                if idle && !pinned {
                    self.h.hand = ((i + 1) % n) as u32;
                    self.unchain(i);
                    self.remove_lane(i);
                    return true;
                }
            }
        }
        false
    }

    // ---- locks ----

    /// Locks a lane for `holder` (a no-op when it holds it already). Returns the state the
    /// holder sees (its own changes included) and whether this took the lock (so that the
    /// caller saves the state for an abort).
    pub fn lock(&mut self, key: &LaneKey, holder: Holder) -> Result<(State, bool), Busy> {
        let i = match find_lane(self.lanes, key) {
            Ok(i) if self.lanes[i].status == READY => i,
            Ok(_) => return Err(Busy::Loading),
            Err(_) => return Err(Busy::Unknown),
        };
        let s = &mut self.lanes[i];
        if s.holder.owner == NIL {
            s.holder = holder;
            return Ok((s.state, true));
        }
        if s.holder.owner == holder.owner {
            return Ok((s.state, false));
        }
        Err(Busy::Held(s.holder))
    }

    /// Ends `owner`'s lock of a lane. `restore`: the state to put back (an abort).
    /// A committed change of the cursor or retry count marks the lane for saving.
    pub fn unlock(&mut self, key: &LaneKey, owner: u32, restore: Option<State>) {
        if let Some(saved) = restore {
            return self.unlock_restoring(key, owner, saved, None, i64::MAX);
        }
        let Ok(i) = find_lane(self.lanes, key) else { return };
        if self.lanes[i].status != READY || self.lanes[i].holder.owner != owner {
            return;
        }
        if self.lanes[i].changed == 1 {
            self.lanes[i].dirty = 1;
        }
        self.lanes[i].changed = 0;
        self.lanes[i].holder = Holder { owner: NIL, ..Holder::default() };
    }

    /// An abort: puts back `saved`, the state `owner` found when it locked the lane, and
    /// releases the lock. `lease`: the queue and group of `saved`'s lease, so that it is
    /// recreated if the aborted change ended it (an ack of its last lane).
    pub fn unlock_restoring(&mut self, key: &LaneKey, owner: u32, saved: State, lease: Option<(i64, &str)>, now: i64) {
        let Ok(i) = find_lane(self.lanes, key) else { return };
        if self.lanes[i].status != READY || self.lanes[i].holder.owner != owner {
            return;
        }
        self.put_back(i, saved, lease, now);
        self.lanes[i].changed = 0;
        self.lanes[i].holder = Holder { owner: NIL, ..Holder::default() };
    }

    /// A subtransaction's abort: puts back `saved`, what the lane held when the
    /// subtransaction first changed it; `owner` keeps the lock (its parent took it).
    /// `lease` as in `unlock_restoring`.
    pub fn restore(&mut self, key: &LaneKey, owner: u32, saved: State, lease: Option<(i64, &str)>, now: i64) {
        let Ok(i) = find_lane(self.lanes, key) else { return };
        if self.lanes[i].status != READY || self.lanes[i].holder.owner != owner {
            return;
        }
        self.put_back(i, saved, lease, now);
    }

    /// Sets lane `i` back to `saved` (no journal number check: it goes back). If its lease
    /// cannot be chained again (gone, and no room or no `lease` to recreate it), the lane
    /// loses it, as if it had expired: the cursor and retry count are put back anyway.
    fn put_back(&mut self, i: usize, saved: State, lease: Option<(i64, &str)>, now: i64) {
        if !self.set_state(i, saved, lease, now) {
            let mut bare = saved;
            bare.lease_id = [0; 16];
            bare.lease_expires = 0; // (with no lease, a nonzero expiry would be a backoff)
            let done = self.set_state(i, bare, None, now);
            debug_assert!(done, "a state without a lease always fits");
        }
    }

    /// The queue of a live lease slot (for recreating it on an abort).
    pub fn lease_queue(&self, id: &[u8; 16]) -> Option<i64> {
        find_lease(self.leases, id).ok().map(|l| self.leases[l].queue_id)
    }

    /// Replaces the state of a lane `owner` holds. `lease` names the queue and group of a
    /// lease not yet in the lease table; `now` lets a full lease table drop expired ones.
    /// A change of the cursor or the retry count must come with the next `journal_seq`
    /// (the caller journals it under that number); it marks the lane for saving once the
    /// transaction commits. Returns false when `owner` does not hold the lane, or when the
    /// lease table is full of live leases (the lane is then unchanged).
    pub fn set(&mut self, key: &LaneKey, owner: u32, state: State, lease: Option<(i64, &str)>, now: i64) -> bool {
        let Ok(i) = find_lane(self.lanes, key) else { return false };
        if self.lanes[i].status != READY || self.lanes[i].holder.owner != owner {
            return false;
        }
        let before = self.lanes[i].state;
        let changed = before.committed != state.committed || before.retry_count != state.retry_count;
        debug_assert!(
            !changed || state.journal_seq == before.journal_seq + 1,
            "a journaled change takes the next number"
        );
        if !self.set_state(i, state, lease, now) {
            return false;
        }
        if changed {
            self.lanes[i].changed = 1;
        }
        true
    }

    fn set_state(&mut self, i: usize, state: State, lease: Option<(i64, &str)>, now: i64) -> bool {
        let old = self.lanes[i].state;
        if old.lease_id != state.lease_id || (state.has_lease() && self.lanes[i].lease == NIL) {
            self.unchain(i);
            if state.has_lease() && !self.chain(i, &state.lease_id, lease, now) {
                // No room for the lease: the lane keeps its old state.
                if old.has_lease() {
                    self.chain(i, &old.lease_id, None, now);
                }
                return false;
            }
        }
        self.lanes[i].state = state;
        true
    }

    /// Puts lane `i` on the chain of lease `id` (creating the lease with `info`).
    fn chain(&mut self, i: usize, id: &[u8; 16], info: Option<(i64, &str)>, now: i64) -> bool {
        let l = match find_lease(self.leases, id) {
            Ok(l) => l,
            Err(_) => {
                let Some((queue_id, group)) = info else { return false };
                if self.h.leases_live >= self.h.max_leases && !self.sweep_leases(now) {
                    return false;
                }
                // Keep a quarter of the slots empty, or misses get slow.
                if self.h.leases_used >= self.h.lease_slots - self.h.lease_slots / 4 {
                    return false;
                }
                let l = find_lease(self.leases, id).expect_err("absent");
                if self.leases[l].status == EMPTY {
                    self.h.leases_used += 1;
                }
                let mut g = [0u8; GROUP_MAX];
                let n = group.len().min(GROUP_MAX);
                g[..n].copy_from_slice(&group.as_bytes()[..n]);
                self.leases[l] =
                    LeaseSlot { id: *id, status: READY, first: NIL, count: 0, group_len: n as u32, queue_id, group: g };
                self.h.leases_live += 1;
                l
            }
        };
        let first = self.leases[l].first;
        self.lanes[i].lease = l as u32;
        self.lanes[i].lease_prev = NIL;
        self.lanes[i].lease_next = first;
        if first != NIL {
            self.lanes[first as usize].lease_prev = i as u32;
        }
        self.leases[l].first = i as u32;
        self.leases[l].count += 1;
        true
    }

    /// Takes lane `i` off its lease's chain; a lease with no lane left is dropped.
    fn unchain(&mut self, i: usize) {
        let l = self.lanes[i].lease;
        if l == NIL {
            return;
        }
        let (prev, next) = (self.lanes[i].lease_prev, self.lanes[i].lease_next);
        if prev == NIL {
            self.leases[l as usize].first = next;
        } else {
            self.lanes[prev as usize].lease_next = next;
        }
        if next != NIL {
            self.lanes[next as usize].lease_prev = prev;
        }
        self.lanes[i].lease = NIL;
        self.lanes[i].lease_prev = NIL;
        self.lanes[i].lease_next = NIL;
        self.leases[l as usize].count -= 1;
        if self.leases[l as usize].count == 0 {
            self.remove_lease(l as usize);
        }
    }

    /// Makes room in a full lease table: a lane nobody holds whose lease has expired at
    /// `now` drops it (an expired lease reads as none, so no caller sees a difference),
    /// and a lease left with no lane goes.
    fn sweep_leases(&mut self, now: i64) -> bool {
        let before = self.h.leases_live;
        for i in 0..self.lanes.len() {
            let s = &self.lanes[i];
            if s.status == READY && s.lease != NIL && s.holder.owner == NIL && s.state.lease_expires <= now {
                self.unchain(i);
                // (its expiry is past: with no lease it reads as no backoff)
                self.lanes[i].state.lease_id = [0; 16];
            }
        }
        self.h.leases_live < before
    }

    // ---- saving cursors ----

    /// Lanes of `database` whose cursor or retry count changed since they were last saved.
    pub fn dirty(&self, database: u32) -> Vec<(LaneKey, State)> {
        self.lanes
            .iter()
            .filter(|s| s.status == READY && s.dirty == 1 && s.database == database)
            .map(|s| (s.key, s.state))
            .collect()
    }

    /// The lanes table now holds `saved` for this lane: clean unless it changed since.
    pub fn saved(&mut self, key: &LaneKey, saved: &State) {
        if let Ok(i) = find_lane(self.lanes, key) {
            let s = &mut self.lanes[i];
            if s.status == READY
                && s.dirty == 1
                && s.state.journal_seq == saved.journal_seq
                && s.state.committed == saved.committed
                && s.state.retry_count == saved.retry_count
            {
                s.dirty = 0;
            }
        }
    }

    /// The lane a lease id names, checked: the lease is live at `now` and holds `key`.
    pub fn holds(&self, key: &LaneKey, lease_id: &[u8; 16], now: i64) -> bool {
        matches!(self.view().lane(key), Seen::Ready(s, _) if s.held_by(lease_id, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    struct Mem {
        h: Header,
        lanes: Vec<LaneSlot>,
        leases: Vec<LeaseSlot>,
    }

    impl Mem {
        fn new(max_lanes: usize, max_leases: usize) -> Mem {
            let l = Layout::new(max_lanes, max_leases);
            let mut m = Mem {
                h: Header::default(),
                lanes: vec![LaneSlot::default(); l.lanes],
                leases: vec![LeaseSlot::default(); l.leases],
            };
            Registry::format(&mut m.h, &mut m.lanes, &mut m.leases, max_lanes, max_leases);
            m
        }
        fn reg(&mut self) -> Registry<'_> {
            Registry::new(&mut self.h, &mut self.lanes, &mut self.leases)
        }
        fn load(&mut self, k: &LaneKey, committed: i64) {
            assert_eq!(self.reg().begin_load(k, 99, 0), Load::Mine);
            self.reg().finish_load(k, 99, State { committed, ..State::default() }, None, 1, 0);
        }
        fn state(&mut self, k: &LaneKey) -> State {
            match self.reg().view().lane(k) {
                Seen::Ready(s, _) => s,
                other => panic!("{other:?}"),
            }
        }
    }

    fn key(p: u8, g: &str) -> LaneKey {
        let mut partition = [0u8; 16];
        partition[0] = p;
        partition[9] = p.wrapping_mul(31);
        LaneKey { partition, group: group_hash(g) }
    }
    fn lease(n: u8) -> [u8; 16] {
        [n; 16]
    }
    fn holder(owner: u32) -> Holder {
        Holder { owner, vxid_backend: owner as i32 + 1, vxid_local: 7 }
    }

    #[test]
    fn group_hashes_differ() {
        assert_ne!(group_hash("a"), group_hash("b"));
        assert_ne!(group_hash("ab"), group_hash("ba"));
        assert_eq!(group_hash("__QUEUE_MODE__"), group_hash("__QUEUE_MODE__"));
    }

    #[test]
    fn a_claim_is_a_locked_change_that_commits_or_rolls_back() {
        let mut m = Mem::new(8, 8);
        let (a, b) = (key(1, "g"), key(2, "g"));
        m.load(&a, 5);
        m.load(&b, 0);
        let (s, took) = m.reg().lock(&a, holder(0)).unwrap();
        assert!(took);
        assert_eq!(m.reg().lock(&a, holder(1)), Err(Busy::Held(holder(0))), "a second transaction finds it held");
        assert_eq!(m.reg().lock(&a, holder(0)), Ok((s, false)), "the holder may lock again");
        let claimed = State { lease_id: lease(1), lease_expires: 100, batch_end: 9, claim_start: 6, ..s };
        assert!(m.reg().set(&a, 0, claimed, Some((42, "g")), 0));
        m.reg().lock(&b, holder(0)).unwrap();
        let sb = m.state(&b);
        assert!(m.reg().set(
            &b,
            0,
            State { lease_id: lease(1), lease_expires: 100, batch_end: 3, ..sb },
            Some((42, "g")),
            0
        ));
        let info = m.reg().view().lease(&lease(1)).unwrap();
        assert_eq!((info.queue_id, info.group.as_str(), info.lanes.len()), (42, "g", 2));
        // b's claim rolls back: its old state returns, the lease keeps a alone.
        m.reg().unlock(&b, 0, Some(sb));
        m.reg().unlock(&a, 0, None);
        assert_eq!(m.state(&b), sb);
        assert_eq!(m.reg().view().lease(&lease(1)).unwrap().lanes, vec![a]);
        assert!(m.reg().holds(&a, &lease(1), 50));
        assert!(!m.reg().holds(&a, &lease(1), 100), "expired at 100");
        assert_eq!(m.reg().view().lane(&a), Seen::Ready(claimed, None));
    }

    #[test]
    fn a_stored_lease_is_taken_over_when_live() {
        let mut m = Mem::new(8, 8);
        let (a, b) = (key(1, "g"), key(2, "g"));
        let stored = State {
            committed: 3,
            lease_id: lease(5),
            lease_expires: 100,
            batch_end: 6,
            claim_start: 4,
            ..State::default()
        };
        m.reg().begin_load(&a, 0, 50);
        m.reg().finish_load(&a, 0, stored, Some((7, "g")), 1, 50);
        assert_eq!(m.state(&a), stored);
        assert_eq!(m.reg().view().lease(&lease(5)).map(|l| (l.queue_id, l.lanes)), Some((7, vec![a])));
        // Expired, or over a span the cursor has passed: not taken over.
        m.reg().begin_load(&b, 0, 150);
        m.reg().finish_load(&b, 0, stored, Some((7, "g")), 1, 150);
        assert!(!m.state(&b).has_lease());
    }

    #[test]
    fn releasing_every_lane_drops_the_lease() {
        let mut m = Mem::new(8, 8);
        let a = key(1, "g");
        m.load(&a, 0);
        m.reg().lock(&a, holder(0)).unwrap();
        let s = m.state(&a);
        m.reg().set(&a, 0, State { lease_id: lease(3), lease_expires: 10, batch_end: 4, ..s }, Some((1, "g")), 0);
        m.reg().unlock(&a, 0, None);
        assert_eq!(m.reg().leases_live(), 1);
        m.reg().lock(&a, holder(1)).unwrap();
        let acked = State { committed: 4, journal_seq: 1, ..State::default() };
        assert!(m.reg().set(&a, 1, acked, None, 0));
        m.reg().unlock(&a, 1, None);
        assert_eq!(m.reg().leases_live(), 0);
        assert_eq!(m.reg().view().lease(&lease(3)), None);
        // The committed change is waiting to be saved; saving it cleans the lane.
        assert_eq!(m.reg().dirty(1), vec![(a, acked)]);
        m.reg().saved(&a, &acked);
        assert!(m.reg().dirty(1).is_empty());
    }

    #[test]
    fn leases_and_lanes_coming_and_going_never_fill_the_tables() {
        // A lease per pop, released by its ack; lanes evicted for others: tens of
        // thousands of each through tables of a few slots.
        let mut m = Mem::new(4, 2);
        let lanes: Vec<LaneKey> = (0..3).map(|p| key(p, "g")).collect();
        for k in &lanes {
            m.load(k, 0);
        }
        for n in 0..20_000u32 {
            let a = lanes[n as usize % 3];
            let mut id = [0u8; 16];
            id[..4].copy_from_slice(&n.to_le_bytes());
            id[15] = 1;
            let (s, _) = m.reg().lock(&a, holder(0)).unwrap();
            let claimed = State { lease_id: id, lease_expires: i64::MAX, batch_end: s.committed + 1, ..s };
            assert!(m.reg().set(&a, 0, claimed, Some((1, "g")), 0), "claim {n} found no lease slot");
            m.reg().unlock(&a, 0, None);
            m.reg().lock(&a, holder(0)).unwrap();
            let acked = State { committed: s.committed + 1, journal_seq: s.journal_seq + 1, ..State::default() };
            assert!(m.reg().set(&a, 0, acked, None, 0));
            m.reg().unlock(&a, 0, None);
            m.reg().saved(&a, &acked);
            // A lane of another partition comes and goes.
            let other = key(3 + (n % 200) as u8, "h");
            match m.reg().begin_load(&other, 9, 0) {
                Load::Mine => m.reg().finish_load(&other, 9, State::default(), None, 1, 0),
                other => panic!("load {n}: {other:?}"),
            }
            m.reg().forget(&[other]);
            m.reg().check().unwrap();
        }
        assert_eq!(m.reg().leases_live(), 0);
        assert_eq!(m.reg().lanes_live(), 3);
    }

    #[test]
    fn an_aborted_ack_of_a_leases_last_lane_brings_the_lease_back() {
        let mut m = Mem::new(8, 8);
        let a = key(1, "g");
        m.load(&a, 3);
        m.reg().lock(&a, holder(0)).unwrap();
        let s = m.state(&a);
        let claimed = State { lease_id: lease(4), lease_expires: 100, batch_end: 8, claim_start: 4, ..s };
        assert!(m.reg().set(&a, 0, claimed, Some((42, "g")), 0));
        m.reg().unlock(&a, 0, None);
        // The same transaction acks it in a savepoint (the lease slot goes with its last
        // lane), then rolls the savepoint back: cursor, retry count and lease come back.
        m.reg().lock(&a, holder(1)).unwrap();
        let found = m.state(&a);
        assert_eq!(m.reg().lease_queue(&lease(4)), Some(42));
        let acked = State { committed: 8, journal_seq: 1, ..State::default() };
        assert!(m.reg().set(&a, 1, acked, None, 0));
        assert_eq!(m.reg().view().lease(&lease(4)), None);
        m.reg().restore(&a, 1, found, Some((42, "g")), 50);
        assert_eq!(m.state(&a), claimed);
        assert_eq!(m.reg().view().lease(&lease(4)).map(|l| l.lanes), Some(vec![a]));
        m.reg().check().unwrap();
        // The same again at the top level: the lock is released too.
        assert!(m.reg().set(&a, 1, acked, None, 0));
        m.reg().unlock_restoring(&a, 1, found, Some((42, "g")), 50);
        assert_eq!(m.reg().view().lane(&a), Seen::Ready(claimed, None));
        assert!(m.reg().holds(&a, &lease(4), 50));
        assert!(m.reg().dirty(1).is_empty(), "nothing changed in the end");
        // Without the lease's queue and group (or no room), the lane loses the lease, as
        // if it expired, but its cursor still goes back.
        m.reg().lock(&a, holder(1)).unwrap();
        assert!(m.reg().set(&a, 1, acked, None, 0));
        m.reg().unlock_restoring(&a, 1, found, None, 50);
        assert_eq!(m.state(&a), State { lease_id: [0; 16], lease_expires: 0, ..claimed });
        m.reg().check().unwrap();
    }

    #[test]
    fn an_aborted_change_is_not_saved() {
        let mut m = Mem::new(8, 8);
        let a = key(1, "g");
        m.load(&a, 3);
        let (s, _) = m.reg().lock(&a, holder(0)).unwrap();
        m.reg().set(&a, 0, State { committed: 7, journal_seq: 1, ..s }, None, 0);
        m.reg().unlock(&a, 0, Some(s));
        assert_eq!(m.state(&a), s);
        assert!(m.reg().dirty(1).is_empty());
    }

    #[test]
    fn a_full_lease_table_sweeps_expired_leases() {
        let mut m = Mem::new(8, 2);
        let keys: Vec<LaneKey> = (0..3).map(|p| key(p, "g")).collect();
        for k in &keys {
            m.load(k, 0);
        }
        for (n, k) in keys.iter().take(2).enumerate() {
            m.reg().lock(k, holder(0)).unwrap();
            let s = m.state(k);
            assert!(m.reg().set(
                k,
                0,
                State { lease_id: lease(n as u8 + 1), lease_expires: 100, batch_end: 1, ..s },
                Some((1, "g")),
                0
            ));
            m.reg().unlock(k, 0, None);
        }
        m.reg().lock(&keys[2], holder(0)).unwrap();
        let s = m.state(&keys[2]);
        let third = State { lease_id: lease(9), lease_expires: 300, batch_end: 1, ..s };
        assert!(!m.reg().set(&keys[2], 0, third, Some((1, "g")), 50), "both leases live at 50");
        assert_eq!(m.state(&keys[2]), s, "refused: unchanged");
        assert!(m.reg().set(&keys[2], 0, third, Some((1, "g")), 200), "both expired at 200: swept");
        m.reg().unlock(&keys[2], 0, None);
        assert_eq!(m.reg().leases_live(), 1);
        assert!(!m.state(&keys[0]).has_lease(), "an expired lease reads as none, and is gone");
    }

    #[test]
    fn a_full_lane_table_evicts_idle_lanes_only() {
        let mut m = Mem::new(2, 4);
        let (a, b, c) = (key(1, "g"), key(2, "g"), key(3, "g"));
        m.load(&a, 0);
        m.load(&b, 0);
        m.reg().lock(&a, holder(0)).unwrap(); // a is held
        m.reg().lock(&b, holder(1)).unwrap();
        let sb = m.state(&b);
        m.reg().set(&b, 1, State { committed: 1, journal_seq: 1, ..sb }, None, 0);
        m.reg().unlock(&b, 1, None); // b has an unsaved change
        assert_eq!(m.reg().begin_load(&c, 5, 0), Load::Full);
        let sb = m.state(&b);
        m.reg().saved(&b, &sb);
        assert_eq!(m.reg().begin_load(&c, 5, 0), Load::Mine, "b is idle and saved now");
        assert_eq!(m.reg().view().lane(&b), Seen::Unknown);
        assert!(matches!(m.reg().view().lane(&a), Seen::Ready(_, Some(_))));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Claim { owner: u32, lane: u8, lease: u8, until: i64 },
        Ack { owner: u32, lane: u8, to: i64 },
        End { owner: u32, commit: bool },
        Forget { lane: u8 },
        Save,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u32..3, 0u8..5, 1u8..4, 0i64..200).prop_map(|(owner, lane, lease, until)| Op::Claim { owner, lane, lease, until }),
            2 => (0u32..3, 0u8..5, 0i64..50).prop_map(|(owner, lane, to)| Op::Ack { owner, lane, to }),
            2 => (0u32..3, any::<bool>()).prop_map(|(owner, commit)| Op::End { owner, commit }),
            1 => (0u8..5).prop_map(|lane| Op::Forget { lane }),
            1 => Just(Op::Save),
        ]
    }

    proptest! {
        /// Against a model of committed states and per-transaction saved states: locks are
        /// exclusive, an abort restores exactly what the transaction found, a commit keeps
        /// what it set, lease chains list exactly the lanes whose state names the lease,
        /// and every committed change of a cursor is listed for saving.
        #[test]
        fn prop_locks_commit_and_roll_back_like_rows(ops in proptest::collection::vec(op(), 1..120)) {
            let mut m = Mem::new(4, 3);
            let keys: Vec<LaneKey> = (0..5).map(|p| key(p, "grp")).collect();
            // Model: each lane's state as its holder sees it, who holds it, what it found.
            let mut model: HashMap<u8, State> = HashMap::new();
            let mut held: HashMap<u8, (u32, State)> = HashMap::new();
            let mut unsaved: std::collections::HashSet<u8> = Default::default();
            let now = 100;
            for op in ops {
                match op {
                    Op::Claim { owner, lane, lease: l, until } => {
                        let k = keys[lane as usize];
                        if !model.contains_key(&lane) {
                            match m.reg().begin_load(&k, owner, now) {
                                Load::Mine => { m.reg().finish_load(&k, owner, State::default(), None, 1, now); model.insert(lane, State::default()); }
                                Load::Full => continue,
                                other => prop_assert!(false, "{:?}", other),
                            }
                        }
                        match m.reg().lock(&k, holder(owner)) {
                            Ok((s, took)) => {
                                prop_assert_eq!(s, model[&lane]);
                                if took { held.insert(lane, (owner, s)); }
                                let new = State { lease_id: lease(l), lease_expires: until, batch_end: s.committed + 1, ..s };
                                if m.reg().set(&k, owner, new, Some((1, "grp")), now) {
                                    model.insert(lane, new);
                                }
                            }
                            Err(Busy::Held(h)) => prop_assert_eq!(Some(h.owner), held.get(&lane).map(|x| x.0)),
                            Err(e) => prop_assert!(false, "{:?}", e),
                        }
                    }
                    Op::Ack { owner, lane, to } => {
                        let Some(&cur) = model.get(&lane) else { continue };
                        let k = keys[lane as usize];
                        match m.reg().lock(&k, holder(owner)) {
                            Ok((s, took)) => {
                                prop_assert_eq!(s, cur);
                                if took { held.insert(lane, (owner, s)); }
                                let new = State { committed: cur.committed.max(to), journal_seq: cur.journal_seq + 1, ..State::default() };
                                let new = if new.committed == cur.committed { State { journal_seq: cur.journal_seq, ..new } } else { new };
                                let new = State { retry_count: cur.retry_count, attempt_count: cur.attempt_count, ..new };
                                let accepted = m.reg().set(&k, owner, new, None, now);
                                prop_assert!(accepted);
                                model.insert(lane, new);
                            }
                            Err(Busy::Held(h)) => prop_assert_eq!(Some(h.owner), held.get(&lane).map(|x| x.0)),
                            Err(e) => prop_assert!(false, "{:?}", e),
                        }
                    }
                    Op::End { owner, commit } => {
                        let mine: Vec<u8> = held.iter().filter(|(_, (o, _))| *o == owner).map(|(l, _)| *l).collect();
                        for lane in mine {
                            let (_, found) = held.remove(&lane).unwrap();
                            let k = keys[lane as usize];
                            if commit {
                                m.reg().unlock(&k, owner, None);
                                if model[&lane].committed != found.committed || model[&lane].retry_count != found.retry_count {
                                    unsaved.insert(lane);
                                }
                            } else {
                                m.reg().unlock(&k, owner, Some(found));
                                let mut back = found;
                                // A lease whose slot went meanwhile is lost on restore.
                                // (Lost, it leaves no expiry behind: that would read as a backoff.)
                                if let Seen::Ready(s, _) = m.reg().view().lane(&k) {
                                    if !s.has_lease() && back.has_lease() { back.lease_id = [0; 16]; back.lease_expires = 0; }
                                }
                                model.insert(lane, back);
                            }
                        }
                    }
                    Op::Save => {
                        for (k, st) in m.reg().dirty(1) {
                            m.reg().saved(&k, &st);
                            if let Some(l) = keys.iter().position(|x| *x == k) { unsaved.remove(&(l as u8)); }
                        }
                    }
                    Op::Forget { lane } => {
                        if model.contains_key(&lane) && !held.contains_key(&lane) {
                            m.reg().forget(&[keys[lane as usize]]);
                            model.remove(&lane);
                            unsaved.remove(&lane);
                        }
                    }
                }
                if let Err(e) = m.reg().check() {
                    prop_assert!(false, "{}", e);
                }
                // Every model lane reads as modelled; lease chains match the states.
                let mut chains: HashMap<[u8; 16], Vec<LaneKey>> = HashMap::new();
                // A lane may have been evicted to make room: only an idle one (not held, no
                // live lease, nothing unsaved), whose state the database has.
                let gone: Vec<u8> = model.keys().copied().filter(|l| m.reg().view().lane(&keys[*l as usize]) == Seen::Unknown).collect();
                for lane in gone {
                    prop_assert!(!held.contains_key(&lane) && !unsaved.contains(&lane) && !model[&lane].live_lease(now),
                        "lane {} evicted while busy", lane);
                    model.remove(&lane);
                }
                for (lane, st) in &model {
                    let k = keys[*lane as usize];
                    match m.reg().view().lane(&k) {
                        Seen::Ready(s, h) => {
                            prop_assert_eq!(s, *st, "lane {}", lane);
                            prop_assert_eq!(h.map(|h| h.owner), held.get(lane).map(|x| x.0));
                            if s.has_lease() { chains.entry(s.lease_id).or_default().push(k); }
                        }
                        other => prop_assert!(false, "lane {} reads {:?}", lane, other),
                    }
                }
                for (id, mut lanes) in chains {
                    let mut got = m.reg().view().lease(&id).map(|i| i.lanes).unwrap_or_default();
                    lanes.sort_by_key(|k| k.partition);
                    got.sort_by_key(|k| k.partition);
                    prop_assert_eq!(got, lanes);
                }
                let dirty: std::collections::HashSet<LaneKey> = m.reg().dirty(1).into_iter().map(|(k, _)| k).collect();
                for lane in &unsaved {
                    prop_assert!(dirty.contains(&keys[*lane as usize]), "lane {} changed and committed but is not listed", lane);
                }
            }
        }
    }
}

/// Where `queen.seek` puts a lane's cursor so that the next message delivered is
/// `next` (or the first one after it that still exists): never below what retention
/// deleted (`retained_through`), never past the readable end.
pub fn seek_cursor(next: i64, retained_through: i64, readable: i64) -> i64 {
    next.saturating_sub(1).min(readable).max(retained_through)
}

#[cfg(test)]
mod seek_tests {
    use super::seek_cursor;

    #[test]
    fn seek_clamps_to_what_exists() {
        assert_eq!(seek_cursor(5, 0, 10), 4, "next delivered is 5");
        assert_eq!(seek_cursor(1, 0, 10), 0, "from the start");
        assert_eq!(seek_cursor(0, 0, 10), 0);
        assert_eq!(seek_cursor(i64::MIN, 0, 10), 0);
        assert_eq!(seek_cursor(3, 6, 10), 6, "deleted by retention: the first kept message");
        assert_eq!(seek_cursor(50, 0, 10), 10, "past the end: the end");
        assert_eq!(seek_cursor(11, 0, 10), 10);
    }
}
