//! Tables for people, JSON for scripts, and a progress bar on stderr.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use serde_json::{Map, Value};

/// A query's rows, and its columns in order (a JSON object's keys are sorted).
pub struct Rows {
    pub columns: Vec<String>,
    pub rows: Vec<Map<String, Value>>,
}

/// Rows as a table, or as one JSON array.
pub fn print(json: bool, rows: &Rows) {
    if json {
        println!("{}", Value::Array(rows.rows.iter().cloned().map(Value::Object).collect()));
    } else {
        print_table(rows);
    }
}

/// One row: a line of JSON, or its cells separated by two spaces (for `tail --follow`).
pub fn print_line(json: bool, columns: &[String], row: &Map<String, Value>) {
    if json {
        println!("{}", Value::Object(row.clone()));
    } else {
        println!(
            "{}",
            columns.iter().map(|c| cell(row.get(c.as_str()).unwrap_or(&Value::Null))).collect::<Vec<_>>().join("  ")
        );
    }
    std::io::stdout().flush().ok();
}

/// A report object: JSON, or `key: value` lines.
pub fn print_object(json: bool, v: &Value) {
    match (json, v.as_object()) {
        (false, Some(m)) => {
            let w = m.keys().map(|k| k.len()).max().unwrap_or(0);
            for (k, v) in m {
                println!("{k:w$}  {}", cell(v));
            }
        }
        _ => println!("{v}"),
    }
}

const WIDEST: usize = 60;

/// A cell: strings as they are, null as nothing, anything else as JSON; at most 60
/// characters.
pub fn cell(v: &Value) -> String {
    let s = match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if s.chars().count() > WIDEST {
        s.chars().take(WIDEST - 1).collect::<String>() + "…"
    } else {
        s
    }
}

pub fn print_table(t: &Rows) {
    let rows = &t.rows;
    if rows.is_empty() {
        println!("(none)");
        return;
    }
    let heads: Vec<&String> = t.columns.iter().collect();
    let cells: Vec<Vec<String>> =
        rows.iter().map(|r| heads.iter().map(|h| cell(r.get(h.as_str()).unwrap_or(&Value::Null))).collect()).collect();
    let widths: Vec<usize> = heads
        .iter()
        .enumerate()
        .map(|(i, h)| cells.iter().map(|r| r[i].chars().count()).max().unwrap_or(0).max(h.len()))
        .collect();
    let line = |vals: Vec<String>| {
        vals.iter().zip(&widths).map(|(v, w)| format!("{v:w$}")).collect::<Vec<_>>().join("  ").trim_end().to_string()
    };
    println!("{}", line(heads.iter().map(|h| h.to_string()).collect()));
    println!("{}", line(widths.iter().map(|w| "-".repeat(*w)).collect()));
    for r in cells {
        println!("{}", line(r));
    }
    println!("({} row{})", rows.len(), if rows.len() == 1 { "" } else { "s" });
}

/// A progress bar on stderr, drawn only when stderr is a terminal (or QUEENCTL_PROGRESS=1).
pub struct Progress {
    what: &'static str,
    total: Option<usize>,
    started: Instant,
    on: bool,
}

impl Progress {
    pub fn new(what: &'static str, total: Option<usize>) -> Progress {
        let on = std::io::stderr().is_terminal() || std::env::var("QUEENCTL_PROGRESS").is_ok_and(|v| v == "1");
        Progress { what, total, started: Instant::now(), on }
    }

    pub fn set(&mut self, n: u64) {
        if !self.on {
            return;
        }
        let rate = n as f64 / self.started.elapsed().as_secs_f64().max(0.001);
        let bar = match self.total {
            Some(t) if t > 0 => {
                let filled = ((n as f64 / t as f64) * 30.0).round().min(30.0) as usize;
                format!("[{}{}] {n}/{t}", "#".repeat(filled), ".".repeat(30 - filled))
            }
            _ => format!("{n}"),
        };
        eprint!("\r{} {bar} ({rate:.0}/s)", self.what);
        std::io::stderr().flush().ok();
    }

    pub fn done(&self) {
        if self.on {
            eprintln!();
        }
    }
}
