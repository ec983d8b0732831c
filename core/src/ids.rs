//! UUIDv7 minting without a syscall per id.
//!
//! `uuid::Uuid::now_v7` asks the kernel for randomness on every call; a push of 1,000
//! messages mints 2,000 ids, and that showed up as the top kernel cost in profiles. This
//! generator seeds a xoshiro256** stream once per process and keeps ids monotonic within
//! a millisecond with a 12-bit counter in `rand_a` (RFC 9562, method 1), carrying into the
//! timestamp if a millisecond ever holds more than 4,096 ids.

use std::time::{SystemTime, UNIX_EPOCH};

pub struct Uuid7Gen {
    last_ms: u64,
    counter: u16,
    s: [u64; 4],
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e3779b97f4a7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

impl Uuid7Gen {
    /// A generator seeded from `seed` (callers pass real entropy, once).
    pub fn from_seed(mut seed: u64) -> Self {
        let s = [splitmix(&mut seed), splitmix(&mut seed), splitmix(&mut seed), splitmix(&mut seed)];
        Uuid7Gen { last_ms: 0, counter: 0, s }
    }

    /// A generator seeded from the OS (one `getrandom` call).
    pub fn from_entropy() -> Self {
        let mut b = [0u8; 8];
        let seed = match std::fs::File::open("/dev/urandom").and_then(|mut f| {
            use std::io::Read;
            f.read_exact(&mut b)
        }) {
            Ok(()) => u64::from_le_bytes(b),
            Err(_) => SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1),
        };
        // Mix in the process id so forked backends that inherit a state still diverge.
        Self::from_seed(seed ^ (u64::from(std::process::id()) << 32))
    }

    fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// The next id for a clock reading of `now_ms` milliseconds since the Unix epoch.
    pub fn next_at(&mut self, now_ms: u64) -> [u8; 16] {
        if now_ms > self.last_ms {
            self.last_ms = now_ms;
            self.counter = (self.next_u64() & 0x1ff) as u16; // random start, room to count
        } else if self.counter >= 0xfff {
            self.last_ms += 1; // counter exhausted: borrow the next millisecond
            self.counter = 0;
        } else {
            self.counter += 1;
        }
        let r = self.next_u64();
        let mut b = [0u8; 16];
        b[..6].copy_from_slice(&self.last_ms.to_be_bytes()[2..]);
        b[6] = 0x70 | ((self.counter >> 8) as u8 & 0x0f);
        b[7] = self.counter as u8;
        b[8..].copy_from_slice(&r.to_be_bytes());
        b[8] = (b[8] & 0x3f) | 0x80; // RFC 9562 variant
        b
    }

    pub fn next_now(&mut self) -> [u8; 16] {
        let ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        self.next_at(ms)
    }
}

/// Random bytes from the operating system's CSPRNG (`getrandom`), fetched 4 KiB at a
/// time so that a busy backend does not make a system call per id.
pub struct RandomPool {
    buf: Box<[u8; 4096]>,
    used: usize,
}

impl Default for RandomPool {
    fn default() -> Self {
        RandomPool { buf: Box::new([0u8; 4096]), used: 4096 }
    }
}

impl RandomPool {
    /// The next `N` random bytes. Panics only if the OS has no random source at all.
    pub fn take<const N: usize>(&mut self) -> [u8; N] {
        assert!(N <= self.buf.len());
        if self.used + N > self.buf.len() {
            getrandom::getrandom(&mut self.buf[..]).expect("the OS random number generator");
            self.used = 0;
        }
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[self.used..self.used + N]);
        // Each byte is handed out once.
        self.buf[self.used..self.used + N].fill(0);
        self.used += N;
        out
    }
}

/// A UUIDv7 for a credential (a lease id): the millisecond time prefix, and all 74 other
/// bits from `random` (a CSPRNG): nothing in it can be predicted from earlier ids.
pub fn secure_v7(now_ms: u64, random: [u8; 10]) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..6].copy_from_slice(&now_ms.to_be_bytes()[2..]);
    b[6..].copy_from_slice(&random);
    b[6] = 0x70 | (b[6] & 0x0f); // version 7
    b[8] = (b[8] & 0x3f) | 0x80; // RFC 9562 variant
    b
}

/// Formats 16 bytes as a canonical lowercase UUID string.
pub fn uuid_string(b: &[u8; 16]) -> String {
    String::from_utf8(uuid_text(b).to_vec()).expect("a UUID's text is ASCII")
}

/// The canonical lowercase text of 16 bytes as a UUID (`uuid_string`), without allocating.
pub fn uuid_text(b: &[u8; 16]) -> [u8; 36] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [b'-'; 36];
    let mut at = 0;
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            at += 1; // the hyphen already there
        }
        out[at] = HEX[(byte >> 4) as usize];
        out[at + 1] = HEX[(byte & 0xf) as usize];
        at += 2;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_variant_and_order() {
        let mut g = Uuid7Gen::from_seed(42);
        let mut prev = [0u8; 16];
        for i in 0..10_000u64 {
            let id = g.next_at(1_700_000_000_000 + i / 3000);
            assert_eq!(id[6] >> 4, 7, "version 7");
            assert_eq!(id[8] >> 6, 0b10, "RFC variant");
            assert!(id > prev, "monotonic");
            prev = id;
        }
    }

    #[test]
    fn secure_ids_have_the_time_prefix_and_fresh_random_bits() {
        let mut pool = RandomPool::default();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..5_000 {
            let id = secure_v7(0x0123_4567_89ab, pool.take());
            assert_eq!(&id[..6], &[0x01, 0x23, 0x45, 0x67, 0x89, 0xab]);
            assert_eq!(id[6] >> 4, 7, "version 7");
            assert_eq!(id[8] >> 6, 0b10, "RFC variant");
            assert!(seen.insert(id), "an id repeated");
        }
        // Two pools (two backends) never hand out the same stream.
        let (mut a, mut b) = (RandomPool::default(), RandomPool::default());
        assert_ne!(a.take::<16>(), b.take::<16>());
    }

    #[test]
    fn timestamp_is_the_clock() {
        let mut g = Uuid7Gen::from_seed(1);
        let id = g.next_at(0x0123_4567_89ab);
        assert_eq!(&id[..6], &[0x01, 0x23, 0x45, 0x67, 0x89, 0xab]);
    }

    #[test]
    fn formats_as_canonical_uuid_text() {
        let mut g = Uuid7Gen::from_entropy();
        for _ in 0..100 {
            let b = g.next_now();
            let u = uuid_string(&b);
            assert_eq!(u.len(), 36);
            assert_eq!(&u[14..15], "7");
        }
        assert_eq!(uuid_string(&[0xab; 16]), "abababab-abab-abab-abab-abababababab");
        let counting: [u8; 16] = std::array::from_fn(|i| (i as u8) * 0x11);
        assert_eq!(uuid_string(&counting), "00112233-4455-6677-8899-aabbccddeeff");
        assert_eq!(&uuid_text(&counting), b"00112233-4455-6677-8899-aabbccddeeff");
    }
}
