//! Bounded memory: a pop never gathers more than its byte budget (`max_bytes`, 32 MiB by
//! default) plus one message, whatever `batch` asks for; what it leaves comes with the
//! next pop. Here `batch` would need 48 MiB. Nor does it read more of its segments than
//! that: the backend's peak memory says so.

use queen_it::{connect, unique};
use rand::Rng;

const MIB: usize = 1 << 20;
const DEFAULT_MAX_BYTES: i64 = 32 * MIB as i64;

#[test]
fn a_pop_stays_within_its_byte_budget() {
    let mut c = connect();
    let queue = unique("limits");
    // 48 messages of 1 MiB (a JSON string of 1 MiB - 2 characters, 1 MiB with its quotes).
    for _ in 0..48 {
        c.execute("SELECT queen.push($1, to_jsonb(repeat('m', $2::int)))", &[&queue, &((MIB - 2) as i32)]).unwrap();
    }
    let mut seen = Vec::new();
    let mut pops = 0;
    while seen.len() < 48 {
        let rows = c
            .query(
                "SELECT msg_offset, octet_length(payload::text)::int8 FROM queen.pop($1, batch => 1000, auto_ack => true)",
                &[&queue],
            )
            .unwrap();
        assert!(!rows.is_empty(), "a pop returned nothing while {} messages were left", 48 - seen.len());
        let bytes: i64 = rows.iter().map(|r| r.get::<_, i64>(1)).sum();
        assert!(bytes <= DEFAULT_MAX_BYTES, "one pop returned {bytes} bytes, past the default budget");
        seen.extend(rows.iter().map(|r| r.get::<_, i64>(0)));
        pops += 1;
    }
    assert_eq!(seen, (1..=48).collect::<Vec<_>>(), "every message once, in order");
    assert_eq!(pops, 2, "32 messages fit the first pop, the other 16 the second");
    // A smaller budget, per call.
    c.execute("SELECT queen.push($1, to_jsonb(repeat('m', $2::int)))", &[&queue, &((MIB - 2) as i32)]).unwrap();
    c.execute("SELECT queen.push($1, to_jsonb(repeat('m', $2::int)))", &[&queue, &((MIB - 2) as i32)]).unwrap();
    let n = c
        .query(
            "SELECT 1 FROM queen.pop($1, batch => 1000, max_bytes => $2, auto_ack => true)",
            &[&queue, &(MIB as i64)],
        )
        .unwrap()
        .len();
    assert_eq!(n, 1);
}

/// The peak resident memory of a backend of the test cluster (`VmHWM` in
/// `/proc/<pid>/status`), in bytes: the cluster runs on this machine.
fn peak_memory(pid: i32) -> u64 {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {path} (the test cluster must run on this machine): {e}"));
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in {path}"));
    kib * 1024
}

/// A pop reads the blocks of its span a few at a time and stops once its budget is spent:
/// `batch => 63, max_bytes => 1` over 63 messages of 4 MB reads one of them. It used to
/// read all 63 (about 250 MB) before the budget stopped it after the first.
#[test]
fn a_pop_reads_no_more_of_its_segments_than_its_budget() {
    const SIZE: usize = 4_000_000;
    let queue = unique("popmem");
    let warm = unique("popmem-warm");
    // Printable ASCII at random (no quote or backslash, which JSON would escape): a block
    // that stays about as large when compressed (compaction may rewrite the segment).
    let mut rng = rand::thread_rng();
    let pad: String = std::iter::repeat_with(|| rng.gen_range(b'!'..=b'~'))
        .filter(|&b| b != b'"' && b != b'\\')
        .take(SIZE)
        .map(char::from)
        .collect();
    // One push_batch: one segment of 63 blocks (a message of 4 MB is a block of its own).
    let mut push = connect();
    let pushed: i64 = push
        .query_one(
            "SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', $1::text,
                                                   'payload', i || $2::text) ORDER BY i)
                                                  FROM generate_series(1, 63) i))",
            &[&queue, &pad],
        )
        .unwrap()
        .get(0);
    assert_eq!(pushed, 63);
    push.execute("SELECT queen.push($1, to_jsonb('warm'::text))", &[&warm]).unwrap();

    let mut c = connect();
    let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    // A first pop loads what every pop needs (the library, plans, caches): not counted.
    let warmed: i64 = c.query_one("SELECT count(*) FROM queen.pop($1, auto_ack => true)", &[&warm]).unwrap().get(0);
    assert_eq!(warmed, 1);
    let before = peak_memory(pid);
    let row = c
        .query_one(
            "SELECT count(*), min(msg_offset), min(octet_length(payload #>> '{}'))
               FROM queen.pop($1, batch => 63, max_bytes => 1, auto_ack => true)",
            &[&queue],
        )
        .unwrap();
    let grown = peak_memory(pid).saturating_sub(before);
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (1, 1), "the first message comes, alone");
    assert_eq!(row.get::<_, i32>(2), SIZE as i32 + 1, "whole");
    assert!(grown < 64 << 20, "a pop of one 4 MB message grew its backend's peak memory by {} MiB", grown >> 20);
    // The next pop goes on with the next message.
    let row = c
        .query_one(
            "SELECT count(*), min(msg_offset) FROM queen.pop($1, batch => 63, max_bytes => 1, auto_ack => true)",
            &[&queue],
        )
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (1, 2));
}
