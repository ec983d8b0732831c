//! Bounded memory: a pop never gathers more than its byte budget (`max_bytes`, 32 MiB by
//! default) plus one message, whatever `batch` asks for; what it leaves comes with the
//! next pop. Here `batch` would need 48 MiB.

use queen_it::{connect, unique};

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
