//! Ids: message ids (UUIDv7, minted without a syscall), lease ids (UUIDv7 with random bits
//! from the OS CSPRNG, as they are credentials), and conversions between the uuid types.

use std::cell::RefCell;

pub fn to_pg_uuid(u: uuid::Uuid) -> pgrx::Uuid {
    pgrx::Uuid::from_bytes(*u.as_bytes())
}

pub fn from_pg_uuid(u: &pgrx::Uuid) -> uuid::Uuid {
    uuid::Uuid::from_bytes(**u)
}

thread_local! {
    static IDS: RefCell<Option<queen_core::ids::Uuid7Gen>> = const { RefCell::new(None) };
}

thread_local! {
    static SECURE: RefCell<queen_core::ids::RandomPool> = RefCell::new(queen_core::ids::RandomPool::default());
}

/// A fresh UUIDv7 whose random bits come from the OS CSPRNG: for lease ids, the
/// credential `ack` and `extend_lease` check, which must not be predictable. (On Citus the
/// caller draws through `citus::routed_id`, so that the id routes back to this node.)
pub fn new_secure_id() -> uuid::Uuid {
    let ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    uuid::Uuid::from_bytes(SECURE.with(|p| queen_core::ids::secure_v7(ms, p.borrow_mut().take())))
}

/// A fresh UUIDv7, minted without a syscall (see `queen_core::ids`).
pub fn new_id() -> uuid::Uuid {
    new_ids(1)[0]
}

/// `n` fresh UUIDv7s, in order, with one clock reading.
pub fn new_ids(n: usize) -> Vec<uuid::Uuid> {
    let ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    IDS.with(|g| {
        let mut g = g.borrow_mut();
        let g = g.get_or_insert_with(queen_core::ids::Uuid7Gen::from_entropy);
        (0..n).map(|_| uuid::Uuid::from_bytes(g.next_at(ms))).collect()
    })
}
