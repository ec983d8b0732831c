//! `queenctl`: queen from a shell. Every verb is one or a few calls of queen's SQL API
//! (docs/functions.md), run with the privileges of the role it connects as.
//!
//! It connects with `--dsn`, or libpq's usual environment (`PGHOST`, `PGPORT`, `PGUSER`,
//! `PGDATABASE`, `PGPASSWORD`, `PGSSLMODE`; `PGSSLROOTCERT` for a checked certificate, see
//! `conn`). Output is a table for people, or `--json` (one JSON array,
//! or one object, per command) for scripts.

mod conn;
mod output;
mod serve;

use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use postgres::types::ToSql;
use postgres::Client;
use serde_json::{json, Map, Value};

use output::{print, Progress, Rows};

#[derive(Parser)]
#[command(name = "queenctl", version, about = "queen, the message queue inside PostgreSQL, from a shell")]
struct Cli {
    /// A libpq connection string or URL; without it, PGHOST, PGPORT, PGUSER, PGDATABASE,
    /// PGPASSWORD and PGSSLMODE as libpq reads them (PGSSLROOTCERT applies to both).
    #[arg(long, global = true)]
    dsn: Option<String>,
    /// JSON for scripts instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Queues and their groups (queen.totals), or one queue's lanes (queen.status).
    Status { queue: Option<String> },
    /// Live lag and rates, refreshing: per queue and group, messages pushed and acked per
    /// second since the last refresh.
    Top {
        queue: Option<String>,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 2.0)]
        interval: f64,
        /// Stop after this many refreshes (default: until interrupted).
        #[arg(long)]
        iterations: Option<u64>,
    },
    /// Messages without consuming them (queen.peek); --follow keeps printing new ones.
    Tail {
        queue: String,
        #[arg(long)]
        partition: Option<String>,
        /// Start at this group's cursor.
        #[arg(long)]
        group: Option<String>,
        #[arg(long)]
        from: Option<i64>,
        #[arg(long, default_value_t = 20)]
        limit: i32,
        #[arg(long)]
        follow: bool,
    },
    /// Pushes a payload (JSON), a file of NDJSON (--file), or NDJSON from stdin (no payload,
    /// or `-`). Each line is a payload, or an object with "payload" and optionally
    /// "partition", "transactionId", "headers", "deliverAt".
    Push {
        queue: String,
        payload: Option<String>,
        #[arg(long)]
        file: Option<std::path::PathBuf>,
        #[arg(long)]
        partition: Option<String>,
        /// Messages per push_batch call.
        #[arg(long, default_value_t = 1000)]
        batch: usize,
    },
    /// The dead-letter queue.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Pauses a queue, or one group (queen.pause).
    Pause {
        queue: String,
        #[arg(long)]
        group: Option<String>,
    },
    /// Resumes it (queen.resume).
    Resume {
        queue: String,
        #[arg(long)]
        group: Option<String>,
    },
    /// Moves one group's cursors (`--group`), or every group's (`--all-groups`), to the end,
    /// recorded as `purged` spans (queen.purge). One of the two is required: a forgotten
    /// `--group` must not purge every group.
    Purge {
        queue: String,
        #[arg(long, conflicts_with = "all_groups", required_unless_present = "all_groups")]
        group: Option<String>,
        /// Every group of the queue.
        #[arg(long)]
        all_groups: bool,
        /// Purge lanes under a live lease too (their leases end; queen.purge's `force`).
        #[arg(long)]
        force: bool,
    },
    /// A web console (server-rendered HTML): queues, one queue, the dead-letter queue.
    /// Read-only unless --allow-writes (replay, delete, pause, resume).
    Serve {
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
        #[arg(long)]
        allow_writes: bool,
        /// Seconds between the readings that draw rates and lag over time.
        #[arg(long, default_value_t = 2.0)]
        sample: f64,
    },
    /// Sets (or, with no limit given, removes) a group's rate limit and cap for a key
    /// (queen.configure_limit).
    Limit {
        queue: String,
        group: String,
        key: String,
        #[arg(long)]
        rate: Option<f64>,
        #[arg(long)]
        burst: Option<i32>,
        #[arg(long)]
        max_in_flight: Option<i32>,
    },
}

#[derive(Subcommand)]
enum DlqCommand {
    /// Dead letters, newest first (queen.dlq).
    List {
        queue: Option<String>,
        #[arg(long)]
        group: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: i32,
    },
    /// One dead letter, by its id (`dlq list` shows them), with its payload and headers.
    Show { id: uuid::Uuid },
    /// Pushes one dead letter's payload again, to every group (queen.dlq_replay).
    Replay { id: uuid::Uuid },
    /// Redrives dead letters in bulk (queen.dlq_redrive), by rounds, showing progress.
    Redrive {
        queue: String,
        #[arg(long)]
        group: Option<String>,
        #[arg(long)]
        partition: Option<String>,
        #[arg(long)]
        error_like: Option<String>,
        /// At most this many in all.
        #[arg(long, default_value_t = 10000)]
        limit: i64,
        /// `failing_group` (only the group that gave up on each) or `all`.
        #[arg(long, default_value = "failing_group")]
        to: String,
        #[arg(long)]
        force: bool,
    },
    /// Deletes one dead letter (queen.dlq_delete).
    Delete { id: uuid::Uuid },
}

fn main() {
    let cli = Cli::parse();
    if let Command::Serve { listen, allow_writes, sample } = &cli.command {
        if let Err(e) = serve::serve(cli.dsn.as_deref(), listen, *allow_writes, *sample) {
            fail(&format!("serve: {e}"));
        }
        return;
    }
    // A closed pipe (`queenctl status | head`) ends the program quietly, as it does `cat`.
    // SAFETY: restores the default action of SIGPIPE before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let mut client = match conn::connect(cli.dsn.as_deref()) {
        Ok(c) => c,
        Err(e) => fail(&format!("cannot connect: {e}")),
    };
    if let Err(e) = run(&mut client, &cli) {
        fail(&conn::describe(&e));
    }
}

fn fail(message: &str) -> ! {
    eprintln!("queenctl: {message}");
    std::process::exit(1);
}

type Result<T> = std::result::Result<T, postgres::Error>;

fn run(c: &mut Client, cli: &Cli) -> Result<()> {
    let json = cli.json;
    match &cli.command {
        Command::Status { queue: None } => {
            let rows = query(c, "SELECT * FROM queen.totals()", &[])?;
            print(json, &rows);
        }
        Command::Status { queue: Some(q) } => {
            let rows = query(
                c,
                "SELECT partition, consumer_group, head, committed, lag, lease_expires_at, retry_count, \
                        dead_letters, paused FROM queen.status($1) ORDER BY partition, consumer_group",
                &[q],
            )?;
            print(json, &rows);
        }
        Command::Top { queue, interval, iterations } => top(c, queue.as_deref(), *interval, *iterations, json)?,
        Command::Tail { queue, partition, group, from, limit, follow } => {
            tail(c, queue, partition.as_deref(), group.as_deref(), *from, *limit, *follow, json)?
        }
        Command::Push { queue, payload, file, partition, batch } => {
            push(c, queue, payload.as_deref(), file.as_deref(), partition.as_deref(), *batch, json)?
        }
        Command::Dlq { command } => dlq(c, command, json)?,
        Command::Pause { queue, group } => one(c, json, "SELECT queen.pause($1, $2)", &[queue, group])?,
        Command::Resume { queue, group } => one(c, json, "SELECT queen.resume($1, $2)", &[queue, group])?,
        Command::Purge { queue, group, force, .. } => {
            one(c, json, "SELECT queen.purge($1, $2, force => $3)", &[queue, group, force])?
        }
        Command::Serve { .. } => unreachable!("handled in main"),
        Command::Limit { queue, group, key, rate, burst, max_in_flight } => one(
            c,
            json,
            "SELECT queen.configure_limit($1, $2, $3, rate => $4::float8::numeric, burst => $5, max_in_flight => $6)",
            &[queue, group, key, rate, burst, max_in_flight],
        )?,
    }
    Ok(())
}

/// The rows of `sql` as objects, and its columns in order (for tables).
pub fn query(c: &mut Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Rows> {
    let columns: Vec<String> = c.prepare(sql)?.columns().iter().map(|col| col.name().to_string()).collect();
    let wrapped = format!("SELECT to_jsonb(t) FROM ({sql}) t");
    let rows = c.query(&wrapped, params)?;
    let rows = rows.iter().map(|r| r.get::<_, Value>(0).as_object().cloned().unwrap_or_default()).collect();
    Ok(Rows { columns, rows })
}

/// A call that returns one jsonb report.
fn one(c: &mut Client, json: bool, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<()> {
    let v: Value = c.query_one(sql, params)?.get(0);
    output::print_object(json, &v);
    Ok(())
}

fn top(c: &mut Client, queue: Option<&str>, interval: f64, iterations: Option<u64>, json: bool) -> Result<()> {
    let mut last: Option<(Instant, Vec<Map<String, Value>>)> = None;
    let mut n = 0;
    loop {
        let rows = query(
            c,
            "SELECT queue, consumer_group, partitions, messages, committed, lag, leased_lanes, dead_letters, paused \
               FROM queen.totals($1) ORDER BY queue, consumer_group",
            &[&queue],
        )?;
        let now = Instant::now();
        let mut shown = Vec::new();
        for r in &rows.rows {
            let mut r = r.clone();
            let (pushed, acked) = match &last {
                Some((t, before)) => {
                    let secs = now.duration_since(*t).as_secs_f64().max(0.001);
                    let prev =
                        before.iter().find(|b| b["queue"] == r["queue"] && b["consumer_group"] == r["consumer_group"]);
                    let rate = |k: &str| {
                        prev.and_then(|p| Some((r[k].as_f64()? - p[k].as_f64()?) / secs))
                            .map(|x| json!((x * 10.0).round() / 10.0))
                    };
                    (rate("messages"), rate("committed"))
                }
                None => (None, None),
            };
            r.insert("pushed_per_s".into(), pushed.unwrap_or(Value::Null));
            r.insert("acked_per_s".into(), acked.unwrap_or(Value::Null));
            shown.push(r);
        }
        let mut columns = rows.columns.clone();
        columns.extend(["pushed_per_s".to_string(), "acked_per_s".to_string()]);
        let shown = Rows { columns, rows: shown };
        if json {
            print(true, &shown);
        } else {
            if std::io::stdout().is_terminal() {
                print!("\x1b[2J\x1b[H"); // clear the screen
            }
            println!("queen top, every {interval} s");
            output::print_table(&shown);
        }
        std::io::stdout().flush().ok();
        n += 1;
        if iterations.is_some_and(|k| n >= k) {
            return Ok(());
        }
        last = Some((now, rows.rows));
        std::thread::sleep(Duration::from_secs_f64(interval));
    }
}

#[allow(clippy::too_many_arguments)]
fn tail(
    c: &mut Client,
    queue: &str,
    partition: Option<&str>,
    group: Option<&str>,
    from: Option<i64>,
    limit: i32,
    follow: bool,
    json: bool,
) -> Result<()> {
    const PEEK: &str = "SELECT partition, msg_offset, created_at, transaction_id, payload, headers \
                          FROM queen.peek($1, $2, $3, $4, $5) ORDER BY created_at, partition, msg_offset";
    let rows = query(c, PEEK, &[&queue, &partition, &group, &from, &limit])?;
    if !follow {
        print(json, &rows);
        return Ok(());
    }
    // Follow: print each message once, then ask each partition for what comes after the
    // last offset printed.
    let mut next: std::collections::BTreeMap<String, i64> = std::collections::BTreeMap::new();
    emit(&mut next, &rows, json);
    loop {
        std::thread::sleep(Duration::from_millis(500));
        // Each partition from its own next offset: those printed so far, and those the
        // queue's lanes name (a queue with groups). A queue without groups has no lanes to
        // name its partitions: a partition first seen there is read from the lowest offset
        // being followed.
        let mut parts: std::collections::BTreeSet<String> = next.keys().cloned().collect();
        match partition {
            Some(p) => {
                parts.insert(p.to_string());
            }
            None => parts.extend(
                query(c, "SELECT DISTINCT partition FROM queen.status($1)", &[&queue])?
                    .rows
                    .iter()
                    .filter_map(|r| r["partition"].as_str().map(str::to_string)),
            ),
        }
        for p in &parts {
            let start = next.get(p).copied().or(from);
            let rows = query(c, PEEK, &[&queue, &Some(p.as_str()), &group, &start, &limit.max(1000)])?;
            emit(&mut next, &rows, json);
        }
        if partition.is_none() {
            let lowest = next.values().min().copied().or(from);
            let rows = query(c, PEEK, &[&queue, &None::<&str>, &group, &lowest, &limit.max(1000)])?;
            let new: Vec<_> =
                rows.rows.into_iter().filter(|r| !r["partition"].as_str().is_some_and(|p| parts.contains(p))).collect();
            emit(&mut next, &Rows { columns: rows.columns, rows: new }, json);
        }
    }
}

/// Prints the rows not printed yet (by partition, each offset once), noting where each
/// partition goes on.
fn emit(next: &mut std::collections::BTreeMap<String, i64>, rows: &Rows, json: bool) {
    for r in &rows.rows {
        let (p, o) = (r["partition"].as_str().unwrap_or("").to_string(), r["msg_offset"].as_i64().unwrap_or(0));
        if next.get(&p).is_some_and(|n| o < *n) {
            continue;
        }
        next.insert(p, o + 1);
        output::print_line(json, &rows.columns, r);
    }
}

fn push(
    c: &mut Client,
    queue: &str,
    payload: Option<&str>,
    file: Option<&std::path::Path>,
    partition: Option<&str>,
    batch: usize,
    json: bool,
) -> Result<()> {
    let item = |line: &str| -> std::result::Result<Value, String> {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}: {line}"))?;
        let mut item = match v {
            Value::Object(m) if m.contains_key("payload") => m,
            other => {
                let mut m = Map::new();
                m.insert("payload".into(), other);
                m
            }
        };
        item.insert("queue".into(), json!(queue));
        if let (Some(p), false) = (partition, item.contains_key("partition")) {
            item.insert("partition".into(), json!(p));
        }
        Ok(Value::Object(item))
    };
    // Numbered lines; a line that cannot be read (not UTF-8, an I/O error) stops the push
    // with its number, as a bad JSON line does.
    let read_all = |r: Box<dyn BufRead>| -> Vec<(usize, std::io::Result<String>)> {
        r.lines().enumerate().map(|(i, l)| (i + 1, l)).collect()
    };
    let numbered: Box<dyn Iterator<Item = (usize, std::io::Result<String>)>> = match (payload, file) {
        (Some(p), None) if p != "-" => Box::new(std::iter::once((1, Ok(p.to_string())))),
        (None | Some("-"), Some(f)) => match std::fs::File::open(f) {
            // A file is read and checked whole before anything is pushed.
            Ok(f) => Box::new(read_all(Box::new(std::io::BufReader::new(f))).into_iter()),
            Err(e) => fail(&format!("{}: {e}", f.display())),
        },
        (Some(_), Some(_)) => fail("give a payload or --file, not both"),
        _ => Box::new(std::io::stdin().lock().lines().enumerate().map(|(i, l)| (i + 1, l))),
    };
    let mut items: Box<dyn Iterator<Item = (usize, std::result::Result<Value, String>)>> = Box::new(
        numbered
            .filter(|(_, l)| !matches!(l, Ok(s) if s.trim().is_empty()))
            .map(|(n, l)| (n, l.map_err(|e| format!("cannot read it: {e}")).and_then(|l| item(&l)))),
    );
    let mut total = None;
    if file.is_some() {
        let all: Vec<_> = items.collect();
        if let Some((n, Err(e))) = all.iter().find(|(_, r)| r.is_err()) {
            fail(&format!("line {n}: {e}; nothing was pushed"));
        }
        total = Some(all.len());
        items = Box::new(all.into_iter());
    }
    let mut progress = Progress::new("pushed", total);
    let (pushed, duplicates, mut pending) = (std::cell::Cell::new(0u64), std::cell::Cell::new(0u64), Vec::new());
    // Each batch commits on its own: a batch that fails says how many were pushed before
    // it (committed) and that its own outcome is unknown when the connection broke.
    let mut flush = |c: &mut Client, pending: &mut Vec<Value>| {
        if pending.is_empty() {
            return;
        }
        let n = pending.len();
        match c.query("SELECT status FROM queen.push_batch($1)", &[&Value::Array(std::mem::take(pending))]) {
            Ok(rows) => {
                for r in rows {
                    if r.get::<_, String>(0) == "duplicate" {
                        duplicates.set(duplicates.get() + 1);
                    }
                    pushed.set(pushed.get() + 1);
                }
                progress.set(pushed.get());
            }
            Err(e) => {
                progress.done();
                fail(&format!(
                    "{}; the {} messages before this batch of {n} were pushed{}",
                    conn::describe(&e),
                    pushed.get(),
                    if e.as_db_error().is_some() {
                        " (nothing of this batch was)"
                    } else {
                        "; whether this batch was is unknown (give items a transactionId to push again safely)"
                    }
                ))
            }
        }
    };
    for (n, it) in items {
        match it {
            Ok(v) => pending.push(v),
            Err(e) => {
                // The batches before it are committed: say how far the push got.
                flush(c, &mut pending);
                progress.done();
                fail(&format!("line {n}: {e}; the {} messages before it were pushed", pushed.get()));
            }
        }
        if pending.len() >= batch.max(1) {
            flush(c, &mut pending);
        }
    }
    flush(c, &mut pending);
    progress.done();
    output::print_object(json, &json!({"queue": queue, "pushed": pushed.get(), "duplicates": duplicates.get()}));
    Ok(())
}

/// Replays (or deletes) the dead letter `id`. `dlq_replay` and `dlq_delete` take an
/// address (partition, transaction id), which several rows can share (two groups' letters
/// of one message, two spans over the same offsets), and the row's id, which picks that row
/// and no other: a row removed meanwhile gives `P0002`, never the next one there.
pub fn act_on_dead_letter(c: &mut Client, id: uuid::Uuid, replay: bool) -> std::result::Result<Value, String> {
    let describe = |e: postgres::Error| conn::describe(&e);
    let d = dead_letter(c, id)
        .map_err(describe)?
        .ok_or_else(|| format!("no dead letter has id {id} (dlq list shows them)"))?;
    let pid: uuid::Uuid = d["partition_id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("dead letter {id} has no partition id: {}", d["partition_id"]))?;
    let tx = d["transaction_id"].as_str().unwrap_or_default().to_string();
    let sql = if replay { "SELECT queen.dlq_replay($1, $2, $3)" } else { "SELECT queen.dlq_delete($1, $2, $3)" };
    c.query_one(sql, &[&pid, &tx, &id]).map(|r| r.get(0)).map_err(describe)
}

/// The dead letter `id`'s row (found through queen.dlq, page by page).
fn dead_letter(c: &mut Client, id: uuid::Uuid) -> Result<Option<Map<String, Value>>> {
    let id = id.to_string();
    for page in 0.. {
        let rows = query(c, "SELECT * FROM queen.dlq(NULL, NULL, 10000, $1)", &[&(page * 10000)])?.rows;
        if rows.is_empty() {
            break;
        }
        if let Some(r) = rows.into_iter().find(|r| r["id"].as_str() == Some(id.as_str())) {
            return Ok(Some(r));
        }
    }
    Ok(None)
}

fn dlq(c: &mut Client, command: &DlqCommand, json: bool) -> Result<()> {
    match command {
        DlqCommand::List { queue, group, limit } => {
            let rows = query(
                c,
                "SELECT id, queue, partition, consumer_group, reason, error_message, retry_count, failed_at, data \
                   FROM queen.dlq($1, $2, $3)",
                &[queue, group, limit],
            )?;
            print(json, &rows);
        }
        DlqCommand::Show { id } => match dead_letter(c, *id)? {
            Some(d) => output::print_object(json, &Value::Object(d)),
            None => fail(&format!("no dead letter has id {id} (queenctl dlq list shows them)")),
        },
        DlqCommand::Replay { id } | DlqCommand::Delete { id } => {
            match act_on_dead_letter(c, *id, matches!(command, DlqCommand::Replay { .. })) {
                Ok(v) => output::print_object(json, &v),
                Err(e) => fail(&e),
            }
        }
        DlqCommand::Redrive { queue, group, partition, error_like, limit, to, force } => {
            // Without --force: rounds of at most 1,000, each committed on its own, with
            // progress; the rows a round redrove are marked, so the next round (or the
            // command run again) goes on after them. With --force the marks do not stop a
            // later call, so it is one call of at most 10,000 (the server's own rounds).
            let mut progress = Progress::new("redriven", None);
            // Only letters filed before the command started: a round's copies may fail
            // again and be filed anew while it runs, and the next round would pick those
            // up (they sort before later partitions' letters) instead of the ones asked for.
            let t0: std::time::SystemTime = c.query_one("SELECT now()", &[])?.get(0);
            // `unopenable` and `groupGone` count the matching rows left in place, as of the
            // last call (each call counts them all again).
            let (mut redriven, mut unopenable, mut group_gone, mut last, mut more) =
                (0i64, 0i64, 0i64, Value::Null, false);
            let round_size = if *force { limit.min(&10_000) } else { limit.min(&1000) };
            loop {
                let round = (limit - redriven).min(*round_size);
                if round <= 0 {
                    break;
                }
                let r: Value = c
                    .query_one(
                        "SELECT queen.dlq_redrive($1, $2, $3, $4, until => $8, max_messages => $5,
                                                  deliver_to => $6, force => $7)",
                        &[queue, group, partition, error_like, &(round as i32), to, force, &t0],
                    )?
                    .get(0);
                redriven += r["redriven"].as_i64().unwrap_or(0);
                unopenable = r["unopenable"].as_i64().unwrap_or(0);
                group_gone = r["groupGone"].as_i64().unwrap_or(0);
                if !r["last"].is_null() {
                    last = r["last"].clone();
                }
                progress.set(redriven as u64);
                more = r["more"] == json!(true);
                if *force || !more {
                    break;
                }
            }
            progress.done();
            output::print_object(
                json,
                &json!({"queue": queue, "deliverTo": to, "redriven": redriven, "unopenable": unopenable,
                        "groupGone": group_gone, "last": last, "more": more}),
            );
        }
    }
    Ok(())
}
