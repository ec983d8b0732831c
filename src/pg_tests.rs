// In-server tests (`cargo pgrx test`): single-session SQL semantics, run inside one
// transaction each, so every test starts from an empty queen schema. Included into the
// `tests` module of lib.rs, whose SQL schema pgrx's test runner calls.

use pgrx::prelude::*;

fn count(sql: &str) -> i64 {
    Spi::get_one::<i64>(sql).unwrap().unwrap()
}

#[pg_test]
fn issue_scenario_push_pop_ack() {
    for n in 1..=3 {
        Spi::run(&format!("SELECT * FROM queen.push('scn', '{{\"n\": {n}}}')")).unwrap();
    }
    Spi::run("CREATE TEMP TABLE b AS SELECT * FROM queen.pop('scn', batch => 2)").unwrap();
    assert_eq!(count("SELECT count(*) FROM b WHERE msg_offset IN (1, 2)"), 2);
    assert_eq!(count("SELECT count(DISTINCT lease_id) FROM b"), 1);
    let near_60 = Spi::get_one::<bool>(
        "SELECT bool_and(abs(extract(epoch FROM lease_expires_at - clock_timestamp()) - 60) < 2) FROM b",
    )
    .unwrap();
    assert_eq!(near_60, Some(true));
    assert_eq!(count("SELECT count(*) FROM queen.pop('scn')"), 0, "leased lane");
    assert_eq!(count("SELECT min(msg_offset) FROM queen.pop('scn', 'other', batch => 5)"), 1);
    let committed =
        Spi::get_one::<i64>("SELECT (queen.ack(lease_id) -> 'lanes' -> 0 ->> 'committed')::int8 FROM b LIMIT 1")
            .unwrap();
    assert_eq!(committed, Some(2));
    assert_eq!(count("SELECT msg_offset FROM queen.pop('scn')"), 3);
}

#[pg_test]
fn lease_is_fenced_after_expiry() {
    Spi::run("SELECT * FROM queen.push('fence', '1')").unwrap();
    Spi::run("CREATE TEMP TABLE f AS SELECT * FROM queen.pop('fence', lease_seconds => 1)").unwrap();
    // Expire the lease now.
    assert_eq!(count("SELECT queen._expire_lease(lease_id)::int8 FROM f"), 1);
    let applied = Spi::get_one::<bool>(
        "SELECT (queen.ack(lease_id, partition_id, msg_offset) -> 'items' -> 0 ->> 'success')::bool FROM f",
    )
    .unwrap();
    assert_eq!(applied, Some(false));
    assert_eq!(count("SELECT committed FROM queen.status('fence')"), 0, "expired ack moved nothing");
    // The next pop reclaims the same offset, counting the attempt.
    assert_eq!(count("SELECT attempt::int8 FROM queen.pop('fence')"), 1);
}

#[pg_test]
fn partial_ack_keeps_lease_and_cursor_is_cumulative() {
    Spi::run(
        "SELECT * FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'cum', 'payload', i))
                                           FROM generate_series(1, 5) i))",
    )
    .unwrap();
    Spi::run("CREATE TEMP TABLE c AS SELECT * FROM queen.pop('cum', batch => 5)").unwrap();
    // Acking offset 3 alone commits 1..3 and keeps the lease over 4..5.
    Spi::run("SELECT queen.ack(lease_id, partition_id, 3) FROM c LIMIT 1").unwrap();
    assert_eq!(count("SELECT committed FROM queen.status('cum')"), 3);
    assert_eq!(count("SELECT count(*) FROM queen.status('cum') WHERE lease_id IS NOT NULL"), 1);
    // A cursor never moves backwards.
    Spi::run("SELECT queen.ack(lease_id, partition_id, 2) FROM c LIMIT 1").unwrap();
    assert_eq!(count("SELECT committed FROM queen.status('cum')"), 3);
    Spi::run("SELECT queen.ack(lease_id, partition_id, 5) FROM c LIMIT 1").unwrap();
    assert_eq!(count("SELECT count(*) FROM queen.status('cum') WHERE lease_id IS NULL AND committed = 5"), 1);
    assert_eq!(
        count("SELECT (queen.extend_lease(lease_id) ->> 'renewed')::int8 FROM c LIMIT 1"),
        0,
        "the lease is over"
    );
}

#[pg_test]
fn segments_are_one_per_partition_per_call() {
    Spi::run(
        "SELECT * FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object(
             'queue', 'seg', 'partition', 'p' || (i % 4), 'payload', i)) FROM generate_series(1, 1000) i))",
    )
    .unwrap();
    assert_eq!(count("SELECT count(*) FROM queen.segments"), 4);
    assert_eq!(count("SELECT sum(last_offset - first_offset + 1)::int8 FROM queen.segments"), 1000);
}

#[pg_test(error = "queen: invalid batch: 0 (must be 1 to 100000)")]
fn batch_zero_is_an_error() {
    Spi::run("SELECT * FROM queen.pop('x', batch => 0)").unwrap();
}

/// The default of argument `n` (1-based) of `func`, evaluated: the literal pgrx wrote
/// into the function's definition, as a value.
fn arg_default<T: pgrx::IntoDatum + pgrx::FromDatum>(func: &str, n: i32, cast: &str) -> T {
    let expr = Spi::get_one::<String>(&format!("SELECT pg_get_function_arg_default('{func}'::regprocedure, {n})"))
        .unwrap()
        .unwrap_or_else(|| panic!("{func}: argument {n} has no default"));
    Spi::get_one::<T>(&format!("SELECT ({expr}){cast}")).unwrap().unwrap()
}

/// The defaults on the Rust entry points are the policy's (core/src/policy.rs).
#[pg_test]
fn entry_point_defaults_are_the_policy() {
    use queen_core::policy::{QueueOptions, Subscription, DEFAULT_BUDGET, DEFAULT_EXTEND_SECONDS};
    // The signature from the catalog: configure's arguments are written once, in Rust.
    let configure = Spi::get_one::<String>("SELECT 'queen.configure'::regproc::oid::regprocedure::text").unwrap().unwrap();
    let configure = configure.as_str();
    let o = QueueOptions::CONFIGURED;
    assert_eq!(arg_default::<i32>(configure, 2, ""), o.lease_time);
    assert_eq!(arg_default::<i32>(configure, 3, ""), o.retry_limit);
    assert_eq!(arg_default::<bool>(configure, 4, ""), o.dead_letter_queue);
    assert_eq!(arg_default::<bool>(configure, 5, ""), o.dlq_after_max_retries);
    assert_eq!(arg_default::<i32>(configure, 6, ""), o.dedup_window);
    assert_eq!(arg_default::<i32>(configure, 8, ""), o.retention);
    // encryption's default is NULL: keep what the queue has (refused on an encrypted one).
    let enc =
        Spi::get_one::<String>(&format!("SELECT pg_get_function_arg_default('{configure}'::regprocedure, 7)"));
    assert!(enc.unwrap().unwrap().starts_with("NULL"));

    let us_of = |function: &str, n: i32| -> i64 {
        let expr =
            Spi::get_one::<String>(&format!("SELECT pg_get_function_arg_default('{function}'::regprocedure, {n})"))
                .unwrap()
                .unwrap();
        Spi::get_one::<i64>(&format!("SELECT (extract(epoch FROM ({expr})::interval) * 1000000)::int8"))
            .unwrap()
            .unwrap()
    };
    assert_eq!(us_of(configure, 9), o.retry_backoff);
    assert_eq!(us_of(configure, 10), o.retry_backoff_max);
    assert_eq!(us_of(configure, 11), o.delay);
    assert_eq!(arg_default::<bool>(configure, 12, ""), o.create_groups);
    assert_eq!(us_of(configure, 13), o.partition_idle_ttl);
    assert_eq!(us_of(configure, 14), o.ttl);
    let null_default = |function: &str, n: i32| {
        Spi::get_one::<String>(&format!("SELECT pg_get_function_arg_default('{function}'::regprocedure, {n})"))
            .unwrap()
            .is_some_and(|d| d.starts_with("NULL"))
    };
    assert_eq!(o.max_depth, None);
    assert!(null_default(configure, 15), "max_depth");
    assert_eq!(us_of(configure, 16), o.dlq_retention);

    let group = "queen.configure_group(text, text, interval, interval, interval, interval, bigint, text)";
    let us = |n: i32| us_of(group, n);
    assert_eq!(us(3), DEFAULT_BUDGET.handler_timeout);
    assert_eq!(us(4), DEFAULT_BUDGET.queue_margin);
    assert_eq!(us(5), DEFAULT_BUDGET.timeout_grace);
    assert_eq!(us(6), DEFAULT_BUDGET.record_margin);
    assert!(null_default(group, 7), "max_lag");
    assert_eq!(
        arg_default::<String>(group, 8, "::text"),
        queen_core::overflow::check_group(None, "hold").unwrap().as_str()
    );

    assert_eq!(arg_default::<i32>("queen.extend_lease(uuid, int)", 2, ""), DEFAULT_EXTEND_SECONDS);
    assert_eq!(
        arg_default::<String>("queen.create_group(text, text, text)", 3, "::text"),
        Subscription::DEFAULT.as_str()
    );
}

/// The SQL forms of two rules decide every boundary case as their Rust homes do: the
/// lease-live predicate (`queen_core::lane::lease_live`, `lease_live_sql!`,
/// `lease_free_sql!`) and the dedup window (`queen_core::dedup::dedup_live`,
/// `dedup_live_sql!`, `dedup_expired_sql!`). The statements are the macros' own text.
#[pg_test]
fn rule_sql_forms_agree_with_core() {
    use queen_core::{dedup::dedup_live, lane::lease_live, policy::outlived};
    // Times as microseconds from a fixed instant; the SQL gets the same instant plus them.
    let at = |us: i64| format!("('2026-01-01 00:00:00+00'::timestamptz + interval '1 microsecond' * {us})");
    let now = 0i64;
    let live = queen_core::lease_live_sql!("l", "$now");
    let free = queen_core::lease_free_sql!("l", "$now");
    for lease in [None, Some("'00000000-0000-0000-0000-000000000001'::uuid")] {
        for expires in [None, Some(now - 1), Some(now), Some(now + 1)] {
            let sql = format!(
                "SELECT coalesce({live}, false), {free} IS NOT DISTINCT FROM true
                   FROM (SELECT {}::uuid AS lease_id, {}::timestamptz AS lease_expires_at) l",
                lease.unwrap_or("NULL"),
                expires.map_or("NULL".to_string(), at),
            )
            .replace("$now", &at(now));
            let (sql_live, sql_free) = Spi::get_two::<bool, bool>(&sql).unwrap();
            let rust_live = lease.is_some() && lease_live(expires, now);
            assert_eq!(sql_live, Some(rust_live), "lease {lease:?} expiring at {expires:?}: live");
            // Free: neither a live lease nor a running backoff (a NULL lease id with a
            // future expiry), whatever the lease id.
            assert_eq!(sql_free, Some(!lease_live(expires, now)), "lease {lease:?} expiring at {expires:?}: free");
        }
    }
    // The dedup window is judged by now(), the transaction's start.
    let now_us = Spi::get_one::<i64>("SELECT ((extract(epoch FROM now()) - 946684800) * 1000000)::int8").unwrap().unwrap();
    let live = queen_core::dedup_live_sql!("d", "$window");
    let expired = queen_core::dedup_expired_sql!("d", "$window");
    for window in [0i64, 1, 3600] {
        for delta in [-1i64, 0, 1] {
            let created = now_us - window * 1_000_000 + delta;
            let sql = format!(
                "SELECT {live}, {expired}
                   FROM (SELECT now() - make_interval(secs => {window}) + interval '1 microsecond' * {delta}
                           AS created_at) d"
            )
            .replace("$window", &window.to_string());
            let (sql_live, sql_expired) = Spi::get_two::<bool, bool>(&sql).unwrap();
            let rust = dedup_live(created, now_us, window);
            assert_eq!(sql_live, Some(rust), "window {window} s, created {delta} us after its edge: live");
            assert_eq!(sql_expired, Some(!rust), "window {window} s, created {delta} us after its edge: expired");
        }
    }
    // A lane's lag (`queen_core::overflow::lag`, `lag_sql!`).
    let lag = queen_core::lag_sql!("c", "r", "e");
    for (c, r, e) in [(0i64, 0i64, 0i64), (0, 0, 5), (5, 0, 3), (2, 4, 9), (7, 4, 9), (9, 9, 9), (3, 10, 8)] {
        let sql = format!("SELECT {lag} FROM (SELECT {c}::int8 AS c, {r}::int8 AS r, {e}::int8 AS e) x");
        assert_eq!(Spi::get_one::<i64>(&sql).unwrap(), Some(queen_core::overflow::lag(c, r, e)), "lag({c}, {r}, {e})");
    }
    // A dead letter's retention and a partition's idle ttl (`policy::outlived`; 0 keeps
    // for ever), judged by now().
    let outlived_sql = queen_core::outlived_sql!("x.at", "x.keep_for");
    for keep_for in [0i64, 1, 3600] {
        for delta in [-1i64, 0, 1] {
            let at = now_us - keep_for * 1_000_000 + delta;
            let sql = format!(
                "SELECT {outlived_sql}
                   FROM (SELECT now() - make_interval(secs => {keep_for}) + interval '1 microsecond' * {delta} AS at,
                                make_interval(secs => {keep_for}) AS keep_for) x"
            );
            let sql_outlived = Spi::get_one::<bool>(&sql).unwrap();
            let rust = outlived(at, keep_for * 1_000_000, now_us);
            assert_eq!(sql_outlived, Some(rust), "kept for {keep_for} s, dated {delta} us after its edge");
        }
    }
    // The span counts in seconds, also as a calendar day across the start of daylight
    // saving time: with now() at noon on that day in Berlin (2026-03-29 12:00 +02, where a
    // calendar day back is only 23 hours), a span of '1 day' has not passed 23 h 30 min
    // after `at`, nor exactly 24 h after, and has 1 us later. (The time zone stays set for
    // the rest of this transaction, which ends with these cases.)
    Spi::run("SET LOCAL TimeZone = 'Europe/Berlin'").unwrap();
    let noon = "'2026-03-29 12:00:00+02'::timestamptz";
    let day = 86_400i64 * 1_000_000;
    for (keep_for, ago) in [(day, day - 1_800_000_000), (day, day), (day, day + 1), (3_600_000_000, 3_600_000_001)] {
        // justify_hours makes 24 hours '1 day', as configure(..., '1 day') stores it.
        let sql = format!(
            "SELECT {outlived_sql} FROM (SELECT {noon} - interval '1 microsecond' * {ago} AS at,
                                               justify_hours(interval '1 microsecond' * {keep_for}) AS keep_for) x"
        )
        .replace("now()", noon);
        let sql_outlived = Spi::get_one::<bool>(&sql).unwrap();
        assert_eq!(sql_outlived, Some(outlived(-ago, keep_for, 0)), "kept for {keep_for} us, dated {ago} us before now");
    }
}

/// `spi::with_queen_plan_settings`: inside, the statements see `enable_seqscan = off`,
/// `plan_cache_mode = force_generic_plan` and a search path of `pg_catalog` alone; after it
/// returns, and after it unwinds from a panic (how an ERROR inside reaches it), the
/// caller's values are back.
#[pg_test]
fn queen_plan_settings_apply_inside_and_come_back() {
    let settings = || {
        Spi::get_one::<String>(
            "SELECT current_setting('enable_seqscan') || ', ' || current_setting('plan_cache_mode')
                    || ', ' || array_to_string(current_schemas(false), ',')",
        )
        .unwrap()
        .unwrap()
    };
    Spi::run("SET LOCAL search_path = public").unwrap();
    let before = settings();
    assert_eq!(before, "on, auto, public");
    let inside = crate::pg::spi::with_queen_plan_settings(settings);
    assert_eq!(inside, "off, force_generic_plan, ");
    assert_eq!(settings(), before);
    let unwound = std::panic::catch_unwind(|| {
        crate::pg::spi::with_queen_plan_settings(|| -> () { panic!("an ERROR inside") })
    });
    assert!(unwound.is_err());
    // SAFETY: the panic above unwound before the pinned search path was popped; the
    // transaction would pop it at its end, here it is popped by hand so the checks below
    // read the caller's path.
    unsafe { pgrx::pg_sys::PopOverrideSearchPath() };
    assert_eq!(settings(), before);
}

/// A pop reads segments by direct index scans (`pg::scan`); the statement it replaces is
/// kept for tables this library does not know. Both read the same rows that hold an offset
/// of the span: over both tiers (single pushes in the fresh tier, a batch and a compacted
/// run in the other), spans that start inside, before and after segments, across both, and
/// of a partition with none. Where the fresh rows hold the whole span, the direct read
/// leaves the durable tier out (`compaction::covers`), and the statement's extra row there
/// holds no offset of it.
#[pg_test]
fn direct_segment_reads_match_the_statement() {
    // Single pushes (each a fresh segment of one message) and batches (a durable segment
    // of their own) into partition `partition` of queue 'dr'.
    let pushes = |partition: &str, key: &str, n: i32| {
        for i in 0..n {
            Spi::run(&format!("SELECT * FROM queen.push('dr', '{{\"{key}\": {i}}}', '{partition}')")).unwrap();
        }
    };
    let batch = |partition: &str, n: i32| {
        Spi::run(&format!(
            "SELECT * FROM queen.push_batch('dr', (SELECT jsonb_agg(jsonb_build_object('payload', i, 'partition', '{partition}'))
                                                     FROM generate_series(1, {n}) i))"
        ))
        .unwrap();
    };
    pushes("a", "n", 30);
    // c: 300 single pushes, merged into one durable segment (a run that long is merged at
    // once: `compaction::LIMITS.min_entries`), then 5 more in the fresh tier, a batch of 70
    // (a durable segment of its own, 306..=375) and one more single push (376).
    const _: () = assert!(queen_core::compaction::LIMITS.min_entries <= 300);
    pushes("c", "c", 300);
    batch("b", 500);
    Spi::run("SELECT queen.compact('dr')").unwrap();
    pushes("c", "c", 5);
    batch("c", 70);
    pushes("c", "c", 1);
    // d: two fresh segments of 10 (batches below FRESH_MAX), 1..=10 and 11..=20; e: one of
    // 63, the most a fresh segment holds. Read from a segment's start and from within one:
    // the direct read looks for a row beginning at the span's start first, and else reads
    // again down to FRESH_MAX below it.
    batch("d", 10);
    batch("d", 10);
    const _: () = assert!(queen_core::compaction::FRESH_MAX == 64);
    batch("e", 63);
    for i in 0..12 {
        Spi::run(&format!("SELECT * FROM queen.push('dr', '{{\"m\": {i}}}', 'a')")).unwrap();
        Spi::run(&format!("SELECT * FROM queen.push('dr', '{{\"m\": {i}}}', 'b')")).unwrap();
    }
    let pid = |name: &str| {
        Spi::get_one::<pgrx::Uuid>(&format!(
            "SELECT partition_id FROM queen.partitions p JOIN queen.queues q USING (queue_id)
              WHERE q.name = 'dr' AND p.name = '{name}'"
        ))
        .unwrap()
        .unwrap()
    };
    let (a, b, c, d, e) = (pid("a"), pid("b"), pid("c"), pid("d"), pid("e"));
    // A row of b's in the other generation's table, below its first segment (as a rotation
    // leaves while it runs): each generation's table gives a segment holding a span's
    // start, and the read keeps the last one, as the statement does.
    Spi::run(&format!(
        "INSERT INTO queen.segments (partition_id, first_offset, last_offset, created_at, data, generation)
         SELECT '{b}', -10, -1, now(), '\\x00', 1 - generation FROM queen.segments
          WHERE partition_id = '{b}' LIMIT 1"
    ))
    .unwrap();
    let none = pgrx::Uuid::from_bytes([7; 16]);
    let spans = [
        (a, 0, 100),
        (a, 5, 5),
        (a, 28, 35),
        (a, 31, 31),
        (a, 41, 60),
        (b, 0, 0),
        (b, 1, 1),
        (b, -5, 3),
        (b, 100, 130),
        (b, 499, 505),
        (b, 510, 600),
        (none, 0, 10),
        (c, 302, 304),
        (c, 299, 302),
        (c, 303, 376),
        (c, 304, 310),
        (d, 1, 10),
        (d, 4, 6),
        (d, 10, 10),
        (d, 5, 15),
        (e, 63, 63),
        (e, 1, 63),
    ];
    let [direct, sql] = crate::storage::segments::both_ways(&spans);
    // The rows a read uses: those that end at or after the span's start.
    use crate::storage::segments::ReadRow;
    let used = |all: &[Vec<ReadRow>], spans: &[(pgrx::Uuid, i64, i64)]| -> Vec<Vec<ReadRow>> {
        all.iter().zip(spans).map(|(rows, s)| rows.iter().filter(|r| r.1 >= s.1).cloned().collect()).collect()
    };
    assert_eq!(used(&direct, &spans), used(&sql, &spans));
    let bounds = |all: &[Vec<ReadRow>], i: usize| {
        all[i].iter().map(|r| (r.0, r.1)).collect::<Vec<_>>()
    };
    assert_eq!(bounds(&sql, 12), [(1, 300), (302, 302), (303, 303), (304, 304)], "c's merged run holds 302 back");
    assert_eq!(bounds(&direct, 12), [(302, 302), (303, 303), (304, 304)], "the fresh rows hold 302..=304");
    assert_eq!(bounds(&direct, 13), [(1, 300), (301, 301), (302, 302)], "299..=302 needs the merged run");
    // Fresh rows at both ends, the batch's durable segment between them: not covered.
    assert_eq!(bounds(&direct, 14), [(1, 300), (303, 303), (304, 304), (305, 305), (306, 375), (376, 376)]);
    assert_eq!(bounds(&direct, 15), [(1, 300), (304, 304), (305, 305), (306, 375)]);
    // A span over all of a (single pushes only: too few to merge yet) holds every offset.
    let covered: i64 = direct[0].iter().map(|r| r.1 - r.0 + 1).sum();
    assert_eq!(covered, 42, "a's 42 messages, in fresh segments");
    assert!(direct[0].len() > 2 && direct[11].is_empty());
    let firsts = |i: usize| direct[i].iter().map(|r| r.0).collect::<Vec<_>>();
    assert_eq!(firsts(6), [1], "b's 1..=1: one holder, the current generation's batch");
    assert_eq!(firsts(7), [-10, 1], "b's -5..=3: the other generation's row holds -5");
    let fresh_rows = Spi::get_one::<String>(&format!(
        "SELECT string_agg(format('%s..%s', first_offset, last_offset), ' ' ORDER BY partition_id = '{e}', first_offset)
           FROM queen.fresh_segments WHERE partition_id IN ('{d}', '{e}')"
    ));
    assert_eq!(fresh_rows.unwrap().as_deref(), Some("1..10 11..20 1..63"), "d's and e's batches are fresh segments");
    let fresh_spans = &spans[16..];
    let expected: [&[(i64, i64)]; 6] = [&[(1, 10)], &[(1, 10)], &[(1, 10)], &[(1, 10), (11, 20)], &[(1, 63)], &[(1, 63)]];
    for (i, want) in expected.iter().enumerate() {
        assert_eq!(bounds(&direct, 16 + i), *want, "{:?}: read with the other spans", fresh_spans[i]);
    }
    // The same spans alone: every one is held by fresh rows, so the fresh tier is read
    // alone (the first pass of the direct read), with the same rows.
    let [direct, sql] = crate::storage::segments::both_ways(fresh_spans);
    assert_eq!(used(&direct, fresh_spans), used(&sql, fresh_spans));
    for (i, want) in expected.iter().enumerate() {
        assert_eq!(bounds(&direct, i), *want, "{:?}: the fresh tier alone", fresh_spans[i]);
    }
}

/// A pop's scan of its lanes reads them by direct index scans (`lane::claimable`); the
/// statement it replaces is kept for tables this library does not know. Both find the same
/// lanes, with the same readable ends, when some are leased, some empty and some
/// claimable, over all the lanes and within bounds and a limit. With the index the direct
/// scan needs replaced by another, the scan falls back to the statement and a pop still
/// delivers.
#[pg_test]
fn direct_lane_scan_matches_the_statement() {
    use crate::lane::claimable::{by_statement, direct, LaneTables};
    for p in 0..12 {
        Spi::run(&format!("SELECT * FROM queen.push('ls', '{{\"p\": {p}}}', 'p{p}')")).unwrap();
        if p % 3 == 0 {
            Spi::run(&format!("SELECT * FROM queen.push('ls', '{{\"p\": {p}}}', 'p{p}')")).unwrap();
        }
    }
    Spi::run("CREATE TEMP TABLE ls AS SELECT * FROM queen.pop('ls', batch => 4, max_partitions => 4)").unwrap();
    Spi::run("SELECT queen.ack(lease_id) FROM (SELECT DISTINCT lease_id FROM ls) l").unwrap();
    Spi::run("SELECT * FROM queen.pop('ls', batch => 3, max_partitions => 3)").unwrap();
    let queue = Spi::get_one::<i64>("SELECT queue_id FROM queen.queues WHERE name = 'ls'").unwrap().unwrap();
    let group = "__QUEUE_MODE__";
    let all = (pgrx::Uuid::from_bytes([0; 16]), pgrx::Uuid::from_bytes([0xff; 16]));
    let both = |bounds, limit| {
        let d = direct(&LaneTables::open().expect("queen's tables read directly"), queue, group, bounds, limit);
        let s = Spi::connect_mut(|client| by_statement(client, queue, group, bounds, limit));
        assert_eq!(d, s);
        d
    };
    let found = both(all, 1_000);
    assert!(!found.is_empty() && found.len() < 12, "some lanes claimable, some not: {found:?}");
    if found.len() >= 3 {
        let within = both((found[0].partition_id, all.1), 1);
        assert_eq!(within, vec![found[1].clone()], "after the first, at most one");
    }
    Spi::run("DROP INDEX queen.lanes_queue_group").unwrap();
    Spi::run("CREATE INDEX lanes_queue_group ON queen.lanes (consumer_group, queue_id, partition_id)").unwrap();
    assert!(LaneTables::open().is_none(), "an index of other columns is not read directly");
    // The pop scans by the statement now, and takes a message or more from every lane
    // found claimable above.
    let lanes = Spi::get_one::<i64>(
        "SELECT count(DISTINCT partition_id) FROM queen.pop('ls', batch => 20, max_partitions => 12)",
    );
    assert_eq!(lanes.unwrap().unwrap(), found.len() as i64);
}

/// `report::encode` lays a value out byte for byte as `jsonb_in` does from its text: the
/// kinds of scalar, the raw scalar at the top, key order (length, then bytes), numbers
/// after strings (padding), whole and fractional numbers, escaped and multibyte strings,
/// nesting, and objects and arrays past 32 children (where every 32nd entry holds an
/// offset instead of a length), containers among them; and so does a real ack's report.
#[pg_test]
fn reports_are_laid_out_as_jsonb_in_does() {
    use serde_json::json;
    let many: serde_json::Map<String, serde_json::Value> =
        (0..70).map(|i| (format!("k{}", i * 7919 % 100), json!(if i % 3 == 0 { json!(i) } else { json!("s".repeat(i % 5)) }))).collect();
    let cases = vec![
        json!(null),
        json!(true),
        json!(false),
        json!(0),
        json!(-42),
        json!(i64::MAX),
        json!(i64::MIN),
        json!(-1),
        json!(9999),
        json!(10000),
        json!(-100_000_000),
        json!(123_456_789_012i64),
        json!(1_0000_0000_0000_0000i64),
        json!(u64::MAX),
        json!(1.5),
        json!(30.0),
        json!(-0.000125),
        json!(1e300),
        json!("a string"),
        json!(""),
        json!("quote \" backslash \\ tab \t newline \n nul-free control \u{1} é 😀"),
        json!({"😀": "k", "e\u{301}": 1, "\"": [null]}),
        json!({}),
        json!([]),
        json!({"leaseId": "0b6a", "items": [], "lanes": [{"partitionId": "x", "committed": 17, "leaseReleased": true, "retryCount": 0, "retryAfter": null}]}),
        json!({"b": 1, "a": 2, "aa": "x", "é": "ü", "": 0, "ab": [1, "x", 2.25, [true, {"z": null}]]}),
        json!(["x", 1, "yy", 2, "zzz", 3.5, {"k": "v"}, [], {}]),
        json!((0..100).map(|i| if i % 2 == 0 { json!(i) } else { json!(format!("e{i}")) }).collect::<Vec<_>>()),
        serde_json::Value::Object(many),
        json!((0..40).map(|i| json!({"offset": i, "status": "completed", "retryAfter": if i % 2 == 0 { json!(null) } else { json!(i as f64 / 4.0) }})).collect::<Vec<_>>()),
    ];
    for v in cases {
        let text = v.to_string();
        let from_pg =
            Spi::get_one_with_args::<crate::pg::jsonb::RawJsonb>("SELECT $1::text::jsonb", &[text.clone().into()])
                .unwrap()
                .unwrap();
        assert_eq!(crate::pg::report::encode(&(&v).into()), from_pg.0, "{text}");
    }
    // The report builders: keys given out of jsonb's order, uuids kept as bytes, fractions
    // written as serde_json writes them (and NaN, which JSON lacks, as null).
    use crate::pg::report::Json;
    let built = [
        (Json::float(30.0), "30.0"),
        (Json::float(0.25), "0.25"),
        (Json::float(1e300), "1e300"),
        (Json::float(f64::NAN), "null"),
        (
            Json::object([("bb", Json::Int(1)), ("a", Json::Uuid([0xab; 16])), ("c", Json::from(Some("x"))), ("", Json::Null)]),
            r#"{"bb": 1, "a": "abababab-abab-abab-abab-abababababab", "c": "x", "": null}"#,
        ),
    ];
    for (v, text) in built {
        let from_pg =
            Spi::get_one_with_args::<crate::pg::jsonb::RawJsonb>("SELECT $1::text::jsonb", &[text.into()]).unwrap().unwrap();
        assert_eq!(crate::pg::report::encode(&v), from_pg.0, "{text}");
    }
    // A real report: an ack of 40 items, one refused (an offset of no lane of the lease).
    Spi::run("SELECT * FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'rep', 'payload', i)) FROM generate_series(1, 40) i))").unwrap();
    Spi::run("CREATE TEMP TABLE rp AS SELECT * FROM queen.pop('rep', batch => 40)").unwrap();
    Spi::run(
        "CREATE TEMP TABLE rr AS SELECT queen.ack(min(lease_id::text)::uuid,
            jsonb_agg(jsonb_build_object('partitionId', partition_id, 'offset', msg_offset, 'status', 'completed'))
              || jsonb_build_array(jsonb_build_object('partitionId', gen_random_uuid(), 'offset', 1, 'status', 'completed'))) AS r
           FROM rp",
    )
    .unwrap();
    assert_eq!(count("SELECT jsonb_array_length(r -> 'items') FROM rr"), 41);
    let report = Spi::get_one::<crate::pg::jsonb::RawJsonb>("SELECT r FROM rr").unwrap().unwrap();
    let reread = Spi::get_one::<crate::pg::jsonb::RawJsonb>("SELECT r::text::jsonb FROM rr").unwrap().unwrap();
    assert_eq!(report.0, reread.0);
    // And the other two reports: a lease extended (with its expiry's text), then revoked.
    Spi::run("SELECT queen.send('rep', '1')").unwrap();
    Spi::run("CREATE TEMP TABLE el AS SELECT lease_id FROM queen.pop('rep')").unwrap();
    for call in ["queen.extend_lease(lease_id, 30)", "queen.revoke_lease(lease_id)"] {
        Spi::run(&format!("CREATE TEMP TABLE lr AS SELECT {call} AS r FROM el")).unwrap();
        let report = Spi::get_one::<crate::pg::jsonb::RawJsonb>("SELECT r FROM lr").unwrap().unwrap();
        let reread = Spi::get_one::<crate::pg::jsonb::RawJsonb>("SELECT r::text::jsonb FROM lr").unwrap().unwrap();
        assert_eq!(report.0, reread.0, "{call}");
        assert_eq!(count("SELECT count(*) FROM lr WHERE r->>'leaseId' = (SELECT lease_id::text FROM el)"), 1, "{call}");
        Spi::run("DROP TABLE lr").unwrap();
    }
}
