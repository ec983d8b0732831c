//! Bounded memory: a pop never gathers more than its byte budget (`max_bytes`, 32 MiB by
//! default) plus one message, whatever `batch` asks for; what it leaves comes with the
//! next pop. Here `batch` would need 48 MiB. Nor does it read more of its segments than
//! that: the backend's peak memory says so. Compaction, too, holds about one merged
//! segment, whatever the fresh tier holds.

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

/// A field of `/proc/<pid>/status` of a backend of the test cluster (which runs on this
/// machine), in bytes.
fn status_bytes(pid: i32, field: &str) -> u64 {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {path} (the test cluster must run on this machine): {e}"));
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {path}"));
    kib * 1024
}

/// The peak resident memory of a backend (`VmHWM`).
fn peak_memory(pid: i32) -> u64 {
    status_bytes(pid, "VmHWM")
}

/// The private memory of a backend now (`RssAnon`): what it allocated itself, not the
/// shared buffers it touched.
fn private_memory(pid: i32) -> u64 {
    status_bytes(pid, "RssAnon")
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

/// Compaction holds about one merged segment in memory (runs of at most 8 MiB of small
/// segments, or one larger segment alone), however much the fresh tier holds: here 60
/// single pushes of 4 MB each, 240 MB in one partition. It used to cut runs by offsets
/// only (up to 4,096), so these 60 made one run, merged in memory whole.
#[test]
fn compaction_holds_about_one_merged_segment() {
    const SIZE: usize = 4_000_000;
    const N: i64 = 60;
    let queue = unique("bigcompact");
    let mut rng = rand::thread_rng();
    let pad: String = std::iter::repeat_with(|| rng.gen_range(b'!'..=b'~'))
        .filter(|&b| b != b'"' && b != b'\\')
        .take(SIZE)
        .map(char::from)
        .collect();
    let mut c = connect();
    let mut s = connect();
    let pid: i32 = s.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    s.query_one("SELECT queen.compact('nothing-here')", &[]).unwrap(); // loads what every call needs
                                                                       // A small first message makes the partition; the worker leaves a run that small alone
                                                                       // until it is 10 s old (core's compaction `Limits`). Then this session holds the
                                                                       // partition's row: the worker's compaction skips a locked partition, so the compaction
                                                                       // measured is this session's.
    c.execute("SELECT queen.push($1, to_jsonb('small'::text))", &[&queue]).unwrap();
    s.batch_execute("BEGIN").unwrap();
    s.execute(
        "SELECT 1 FROM queen.partitions p JOIN queen.queues q USING (queue_id) WHERE q.name = $1 FOR NO KEY UPDATE OF p",
        &[&queue],
    )
    .unwrap();
    let push = c.prepare("SELECT count(*) FROM queen.push($1, to_jsonb($2::text || ':' || $3::text))").unwrap();
    for i in 0..N {
        c.query_one(&push, &[&queue, &i.to_string(), &pad]).unwrap();
    }
    let fresh = |c: &mut postgres::Client| -> i64 {
        c.query_one(
            "SELECT count(*) FROM queen.fresh_segments f JOIN queen.partitions p USING (partition_id)
               JOIN queen.queues q USING (queue_id) WHERE q.name = $1",
            &[&queue],
        )
        .unwrap()
        .get(0)
    };
    assert_eq!(fresh(&mut c), N + 1, "single pushes go to the fresh tier, and nothing compacted them yet");
    // The backend's private memory (RssAnon), sampled every millisecond while it compacts:
    // its peak RSS would count the shared buffers it reads the 240 MB through.
    let before = private_memory(pid);
    assert!(before > 0, "a backend has private memory");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(private_memory(pid));
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            peak
        })
    };
    s.query_one("SELECT queen.compact($1)", &[&queue]).unwrap();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let grown = sampler.join().unwrap().saturating_sub(before);
    s.batch_execute("COMMIT").unwrap();
    assert_eq!(fresh(&mut c), 0, "compacted");
    assert!(grown < 64 << 20, "compacting 240 MB grew the backend's private memory by {} MiB", grown >> 20);
    // Every message is still there, whole and in order: the small one, then each large
    // one as its number, a colon and the same 4 MB.
    let rows = c
        .query(
            "SELECT payload #>> '{}' = 'small', substring(payload #>> '{}' FROM '^[0-9]+')::int8,
                    payload #>> '{}' = substring(payload #>> '{}' FROM '^[0-9]+') || ':' || $2
               FROM queen.pop($1, batch => 100, max_bytes => 1000000000, auto_ack => true)
              ORDER BY msg_offset",
            &[&queue, &pad],
        )
        .unwrap();
    assert_eq!(rows.len() as i64, N + 1);
    assert!(rows[0].get::<_, bool>(0), "the small message comes first");
    for (i, r) in rows[1..].iter().enumerate() {
        assert_eq!(r.get::<_, Option<i64>>(1), Some(i as i64), "large message {i} in its place");
        assert!(r.get::<_, bool>(2), "large message {i} whole");
    }
}
