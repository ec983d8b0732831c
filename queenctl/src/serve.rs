//! `queenctl serve`: a web console, server-rendered HTML with no JavaScript.
//!
//! - `/`: the queues, with messages, lag per group, rates and a sparkline of the lag;
//! - `/queue/NAME`: one queue's partitions and groups, with charts of its rates and lag;
//! - `/dlq`: the dead-letter queue, filtered by queue, group and error text, with replay
//!   and delete;
//! - pause and resume of a queue or a group.
//!
//! Read-only unless started with `--allow-writes`: without it no form is shown and every
//! POST is refused (403). With it, each form carries a token made when the console
//! started, and a POST without it (another site's form, say) is refused too. A request
//! whose `Host` names anything but an IP address or `localhost` is refused (421): a web
//! page whose name an attacker re-resolves to this address (DNS rebinding) would
//! otherwise be same-origin with the console, read its pages and token, and post. It runs with the privileges of the role it connects as: what the
//! role may not see, the page shows as the server's error. The rates and lag over time
//! come from a sampler thread that reads `queen.totals()` every `--sample` seconds and
//! keeps the last 150 readings in memory.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::output::Rows;

/// Readings of (queue, group): (seconds since start, messages, committed, lag).
type History = BTreeMap<(String, String), VecDeque<(f64, f64, f64, f64)>>;

const KEEP: usize = 150;

struct Console {
    dsn: Option<String>,
    writes: bool,
    /// The forms' token: random, made at start (a POST must carry it).
    token: String,
    history: Mutex<History>,
    started: Instant,
}

/// Whether a `Host` header names this machine by an IP address or as `localhost` (with or
/// without a port), not by a name that someone else's DNS could point here.
fn addressed_directly(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => return v6.split(']').next().is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok()),
        None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

pub fn serve(dsn: Option<&str>, listen: &str, writes: bool, sample: f64) -> std::io::Result<()> {
    let console = Arc::new(Console {
        dsn: dsn.map(str::to_string),
        writes,
        token: random_token()?,
        history: Mutex::default(),
        started: Instant::now(),
    });
    let sampler = console.clone();
    std::thread::spawn(move || sampler.sample_forever(sample));
    let listener = TcpListener::bind(listen)?;
    eprintln!(
        "queenctl serve: http://{} ({})",
        listener.local_addr()?,
        if writes { "writes allowed" } else { "read-only" }
    );
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let console = console.clone();
        std::thread::spawn(move || {
            let _ = console.handle(stream);
        });
    }
    Ok(())
}

impl Console {
    fn connect(&self) -> Result<postgres::Client, String> {
        crate::conn::connect(self.dsn.as_deref())
    }

    fn sample_forever(&self, every: f64) {
        let mut client = None;
        loop {
            if client.is_none() {
                client = self.connect().ok();
            }
            if let Some(c) = client.as_mut() {
                match crate::query(c, "SELECT queue, consumer_group, messages, committed, lag FROM queen.totals()", &[])
                {
                    Ok(rows) => self.record(&rows),
                    Err(_) => client = None,
                }
            }
            std::thread::sleep(Duration::from_secs_f64(every.max(0.1)));
        }
    }

    fn record(&self, rows: &Rows) {
        let t = self.started.elapsed().as_secs_f64();
        let mut h = self.history.lock().unwrap();
        for r in &rows.rows {
            let key = (text(&r["queue"]), text(&r["consumer_group"]));
            let num = |k: &str| r.get(k).and_then(Value::as_f64).unwrap_or(0.0);
            let v = h.entry(key).or_default();
            v.push_back((t, num("messages"), num("committed"), num("lag")));
            if v.len() > KEEP {
                v.pop_front();
            }
        }
    }

    fn handle(&self, stream: TcpStream) -> std::io::Result<()> {
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        // A request's head is at most 64 KiB, its body at most 1 MiB.
        let mut reader = BufReader::new(stream.try_clone()?.take(64 << 10));
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let mut parts = line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("/").to_string());
        let mut length = 0usize;
        let mut host = None;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                } else if k.eq_ignore_ascii_case("host") {
                    host = Some(v.trim().to_string());
                }
            }
        }
        reader.get_mut().set_limit(1 << 20);
        let mut body = vec![0u8; length.min(1 << 20)];
        reader.read_exact(&mut body)?;
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let (status, headers, page) = if host.as_deref().is_some_and(|h| !addressed_directly(h)) {
            (
                "421 Misdirected Request",
                String::new(),
                page("Refused", "<p>Reach this console by its IP address or as <code>localhost</code>.</p>"),
            )
        } else {
            self.route(&method, path, &form(query), &form(&String::from_utf8_lossy(&body)))
        };
        let mut out = stream;
        write!(
            out,
            "HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\r\n",
            page.len()
        )?;
        out.write_all(page.as_bytes())
    }

    fn route(
        &self,
        method: &str,
        path: &str,
        query: &BTreeMap<String, String>,
        body: &BTreeMap<String, String>,
    ) -> (&'static str, String, String) {
        if method == "POST" {
            if !self.writes {
                return ("403 Forbidden", String::new(), page("Read-only", "<p>This console is read-only: start it with <code>--allow-writes</code> to change anything.</p>"));
            }
            if body.get("token") != Some(&self.token) {
                return (
                    "403 Forbidden",
                    String::new(),
                    page("Refused", "<p>This form did not come from this console.</p>"),
                );
            }
            return match self.write(path, body) {
                Ok(()) => {
                    let back = body.get("back").filter(|b| local_path(b)).cloned().unwrap_or_else(|| "/".into());
                    ("303 See Other", format!("Location: {back}\r\n"), String::new())
                }
                Err(e) => ("400 Bad Request", String::new(), page("Error", &format!("<p class=error>{}</p>", esc(&e)))),
            };
        }
        let result = match path {
            "/" => self.queues(),
            "/dlq" => self.dlq(query),
            p if p.starts_with("/queue/") => self.queue(&decode(&p["/queue/".len()..])),
            _ => return ("404 Not Found", String::new(), page("Not found", "<p>No such page.</p>")),
        };
        match result {
            Ok(html) => ("200 OK", String::new(), html),
            Err(e) => {
                ("500 Internal Server Error", String::new(), page("Error", &format!("<p class=error>{}</p>", esc(&e))))
            }
        }
    }

    fn write(&self, path: &str, f: &BTreeMap<String, String>) -> Result<(), String> {
        let mut c = self.connect()?;
        let arg = |k: &str| f.get(k).filter(|v| !v.is_empty()).cloned();
        let r = match path {
            "/pause" => c.execute("SELECT queen.pause($1, $2)", &[&arg("queue"), &arg("group")]),
            "/resume" => c.execute("SELECT queen.resume($1, $2)", &[&arg("queue"), &arg("group")]),
            "/dlq/replay" | "/dlq/delete" => {
                // By the letter's id, checked (another letter may share its address).
                let id: uuid::Uuid = arg("id").and_then(|p| p.parse().ok()).ok_or("a dead letter id is needed")?;
                return crate::act_on_dead_letter(&mut c, id, path == "/dlq/replay").map(|_| ());
            }
            _ => return Err(format!("no such action: {path}")),
        };
        r.map(|_| ()).map_err(|e| crate::conn::describe(&e))
    }

    fn queues(&self) -> Result<String, String> {
        let mut c = self.connect()?;
        let rows = crate::query(
            &mut c,
            "SELECT queue, consumer_group, partitions, messages, lag, leased_lanes, dead_letters, paused \
               FROM queen.totals() ORDER BY queue, consumer_group",
            &[],
        )
        .map_err(|e| crate::conn::describe(&e))?;
        let h = self.history.lock().unwrap();
        let mut html = String::from(
            "<table><tr><th>queue</th><th>group</th><th>partitions</th><th>messages</th><th>lag</th>\
             <th>leased lanes</th><th>dead letters</th><th>paused</th><th>pushed/s</th><th>acked/s</th><th>lag over time</th></tr>",
        );
        for r in &rows.rows {
            let (q, g) = (text(&r["queue"]), text(&r["consumer_group"]));
            let samples = h.get(&(q.clone(), g.clone()));
            let (pushed, acked) = samples.map(rates).unwrap_or_default();
            html += &format!(
                "<tr><td><a href=\"/queue/{}\">{}</a></td><td>{}</td><td class=n>{}</td><td class=n>{}</td><td class=n>{}</td>\
                 <td class=n>{}</td><td class=n><a href=\"/dlq?queue={}\">{}</a></td><td>{}</td><td class=n>{}</td><td class=n>{}</td><td>{}</td></tr>",
                enc(&q),
                esc(&q),
                esc(&g),
                text(&r["partitions"]),
                text(&r["messages"]),
                text(&r["lag"]),
                text(&r["leased_lanes"]),
                enc(&q),
                text(&r["dead_letters"]),
                text(&r["paused"]),
                pushed.map_or(String::new(), |v| format!("{v:.1}")),
                acked.map_or(String::new(), |v| format!("{v:.1}")),
                samples.map(|s| sparkline(&s.iter().map(|x| (x.0, x.3)).collect::<Vec<_>>(), 120, 24)).unwrap_or_default(),
            );
        }
        html += "</table>";
        if rows.rows.is_empty() {
            html = "<p>No queues yet.</p>".into();
        }
        Ok(page("Queues", &html))
    }

    fn queue(&self, name: &str) -> Result<String, String> {
        let mut c = self.connect()?;
        let totals = crate::query(
            &mut c,
            "SELECT consumer_group, partitions, messages, committed, lag, leased_lanes, dead_letters, paused \
               FROM queen.totals($1) ORDER BY consumer_group",
            &[&name],
        )
        .map_err(|e| crate::conn::describe(&e))?;
        if totals.rows.is_empty() {
            return Ok(page(&format!("Queue {name}"), "<p>No such queue.</p>"));
        }
        let lanes = crate::query(
            &mut c,
            "SELECT partition, consumer_group, head, committed, lag, lease_expires_at, retry_count, dead_letters, paused \
               FROM queen.status($1) ORDER BY partition, consumer_group",
            &[&name],
        )
        .map_err(|e| crate::conn::describe(&e))?;
        let back = format!("/queue/{}", enc(name));
        let mut html = String::new();
        if self.writes {
            html += &format!(
                "<p>{} {}</p>",
                action(&self.token, "/pause", "Pause the queue", &[("queue", name), ("back", &back)]),
                action(&self.token, "/resume", "Resume the queue", &[("queue", name), ("back", &back)])
            );
        }
        html += "<h2>Groups</h2>";
        html += &table(&totals, |col, v, r| {
            if col == "paused" && self.writes && !r["consumer_group"].is_null() {
                let g = text(&r["consumer_group"]);
                let (url, label) = if v == &Value::Bool(true) { ("/resume", "resume") } else { ("/pause", "pause") };
                return format!(
                    "{} {}",
                    text(v),
                    action(&self.token, url, label, &[("queue", name), ("group", &g), ("back", &back)])
                );
            }
            esc(&text(v))
        });
        let h = self.history.lock().unwrap();
        for r in &totals.rows {
            let g = text(&r["consumer_group"]);
            if let Some(s) = h.get(&(name.to_string(), g.clone())) {
                let pushed: Vec<(f64, f64)> =
                    s.iter().zip(s.iter().skip(1)).map(|(a, b)| (b.0, (b.1 - a.1) / (b.0 - a.0).max(1e-3))).collect();
                let acked: Vec<(f64, f64)> =
                    s.iter().zip(s.iter().skip(1)).map(|(a, b)| (b.0, (b.2 - a.2) / (b.0 - a.0).max(1e-3))).collect();
                let lag: Vec<(f64, f64)> = s.iter().map(|x| (x.0, x.3)).collect();
                html += &format!(
                    "<h3>{}</h3><div class=charts><figure>{}<figcaption>pushed/s</figcaption></figure>\
                     <figure>{}<figcaption>acked/s</figcaption></figure><figure>{}<figcaption>lag</figcaption></figure></div>",
                    if g.is_empty() { "(no group)".to_string() } else { format!("group {}", esc(&g)) },
                    sparkline(&pushed, 320, 80),
                    sparkline(&acked, 320, 80),
                    sparkline(&lag, 320, 80)
                );
            }
        }
        html += "<h2>Partitions</h2>";
        html += &table(&lanes, |_, v, _| esc(&text(v)));
        html += &format!("<p><a href=\"/dlq?queue={}\">Dead letters of {}</a></p>", enc(name), esc(name));
        Ok(page(&format!("Queue {name}"), &html))
    }

    fn dlq(&self, f: &BTreeMap<String, String>) -> Result<String, String> {
        let mut c = self.connect()?;
        let arg = |k: &str| f.get(k).filter(|v| !v.is_empty()).cloned();
        let (queue, group, error) = (arg("queue"), arg("group"), arg("error"));
        let page_no: i32 = arg("page").and_then(|p| p.parse().ok()).unwrap_or(0).clamp(0, 10_000);
        // The error filter is a plain substring (no wildcards, any case), applied while
        // reading the DLQ 1,000 at a time, so that a page of the console holds up to 100
        // matches (it reads at most a million letters).
        let mut rows = Rows { columns: Vec::new(), rows: Vec::new() };
        let (mut skip, mut offset, mut more) = (page_no as usize * 100, 0i32, false);
        let needle = error.as_deref().map(str::to_lowercase);
        loop {
            let chunk = crate::query(
                &mut c,
                "SELECT id, queue, partition, consumer_group, reason, error_message, retry_count, failed_at, data, \
                        partition_id, transaction_id \
                   FROM queen.dlq($1, $2, 1000, $3)",
                &[&queue, &group, &offset],
            )
            .map_err(|e| crate::conn::describe(&e))?;
            let scanned = chunk.rows.len();
            for r in chunk.rows {
                let matches =
                    needle.as_ref().is_none_or(|n| text(&r["error_message"]).to_lowercase().contains(n.as_str()));
                if !matches {
                    continue;
                }
                if skip > 0 {
                    skip -= 1;
                } else if rows.rows.len() < 100 {
                    rows.rows.push(r);
                } else {
                    more = true;
                }
            }
            if more || scanned < 1000 || offset >= 1_000_000 {
                break;
            }
            offset += 1000;
        }
        let mut html = format!(
            "<form method=get action=/dlq class=filter>queue <input name=queue value=\"{}\"> group <input name=group value=\"{}\"> \
             error contains <input name=error value=\"{}\"> <button>Filter</button></form>",
            esc(queue.as_deref().unwrap_or("")),
            esc(group.as_deref().unwrap_or("")),
            esc(error.as_deref().unwrap_or(""))
        );
        let back = dlq_href(&queue, &group, &error, page_no);
        let shown = Rows {
            columns: [
                "id",
                "queue",
                "partition",
                "consumer_group",
                "reason",
                "error_message",
                "retry_count",
                "failed_at",
                "data",
            ]
            .map(String::from)
            .to_vec(),
            rows: rows.rows.clone(),
        };
        if shown.rows.is_empty() {
            html += "<p>No dead letters here.</p>";
        } else {
            html += &table_with(
                &shown,
                |_, v, _| esc(&text(v)),
                |r| {
                    if !self.writes {
                        return String::new();
                    }
                    let id = text(&r["id"]);
                    let fields = [("id", id.as_str()), ("back", back.as_str())];
                    format!(
                        "{} {}",
                        action(&self.token, "/dlq/replay", "replay", &fields),
                        action(&self.token, "/dlq/delete", "delete", &fields)
                    )
                },
            );
        }
        let prev = (page_no > 0)
            .then(|| format!("<a href=\"{}\">previous page</a> ", dlq_href(&queue, &group, &error, page_no - 1)));
        let next = more.then(|| format!("<a href=\"{}\">next page</a>", dlq_href(&queue, &group, &error, page_no + 1)));
        html += &format!("<p>{}{}</p>", prev.unwrap_or_default(), next.unwrap_or_default());
        Ok(page("Dead letters", &html))
    }
}

/// The DLQ page's address for these filters.
fn dlq_href(queue: &Option<String>, group: &Option<String>, error: &Option<String>, page: i32) -> String {
    let e = |v: &Option<String>| enc(v.as_deref().unwrap_or(""));
    format!("/dlq?queue={}&group={}&error={}&page={page}", e(queue), e(group), e(error))
}

/// Pushed and acked per second over the last two readings.
fn rates(s: &VecDeque<(f64, f64, f64, f64)>) -> (Option<f64>, Option<f64>) {
    let n = s.len();
    if n < 2 {
        return (None, None);
    }
    let (a, b) = (s[n - 2], s[n - 1]);
    let dt = (b.0 - a.0).max(1e-3);
    (Some((b.1 - a.1) / dt), Some((b.2 - a.2) / dt))
}

/// An SVG line of (t, v) points, scaled to `w` x `h`, with its last value as a title.
fn sparkline(points: &[(f64, f64)], w: u32, h: u32) -> String {
    if points.len() < 2 {
        return format!("<svg width={w} height={h} class=spark role=img><title>not enough readings yet</title></svg>");
    }
    let (t0, t1) = (points[0].0, points[points.len() - 1].0);
    let vmax = points.iter().map(|p| p.1).fold(0.0f64, f64::max).max(1e-9);
    let coords: Vec<String> = points
        .iter()
        .map(|(t, v)| {
            let x = (t - t0) / (t1 - t0).max(1e-9) * f64::from(w - 2) + 1.0;
            let y = f64::from(h - 2) - v / vmax * f64::from(h - 4) + 1.0;
            format!("{x:.1},{y:.1}")
        })
        .collect();
    format!(
        "<svg width={w} height={h} class=spark role=img><title>last {:.1}, max {:.1}</title>\
         <polyline fill=none stroke=#2a6 stroke-width=1.5 points=\"{}\"/></svg>",
        points[points.len() - 1].1,
        vmax,
        coords.join(" ")
    )
}

fn table(rows: &Rows, cell: impl Fn(&str, &Value, &serde_json::Map<String, Value>) -> String) -> String {
    table_with(rows, cell, |_| String::new())
}

/// A table of `rows`, with one more column from `extra` when it gives anything.
fn table_with(
    rows: &Rows,
    cell: impl Fn(&str, &Value, &serde_json::Map<String, Value>) -> String,
    extra: impl Fn(&serde_json::Map<String, Value>) -> String,
) -> String {
    if rows.rows.is_empty() {
        return "<p>(none)</p>".into();
    }
    let mut html = String::from("<table><tr>");
    for c in &rows.columns {
        html += &format!("<th>{}</th>", esc(&c.replace('_', " ")));
    }
    html += "</tr>";
    for r in &rows.rows {
        html += "<tr>";
        for c in &rows.columns {
            let v = r.get(c).unwrap_or(&Value::Null);
            let class = if v.is_number() { " class=n" } else { "" };
            html += &format!("<td{class}>{}</td>", cell(c, v, r));
        }
        let e = extra(r);
        if !e.is_empty() {
            html += &format!("<td>{e}</td>");
        }
        html += "</tr>";
    }
    html + "</table>"
}

/// A one-button form posting `fields` and the console's `token`.
fn action(token: &str, url: &str, label: &str, fields: &[(&str, &str)]) -> String {
    let inputs: String = fields
        .iter()
        .chain(&[("token", token)])
        .map(|(k, v)| format!("<input type=hidden name={k} value=\"{}\">", esc(v)))
        .collect();
    format!("<form method=post action={url} class=inline>{inputs}<button>{}</button></form>", esc(label))
}

/// A path of this site to go back to: `/` then anything but `/` or `\`, and no control
/// characters (a header cannot be split, nor another site named).
fn local_path(p: &str) -> bool {
    let b = p.as_bytes();
    b.first() == Some(&b'/') && !matches!(b.get(1), Some(b'/' | b'\\')) && !p.chars().any(char::is_control)
}

/// 16 random bytes from the OS, as hex.
fn random_token() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=utf-8><title>{t} · queen</title><style>\
         body{{font:14px system-ui,sans-serif;margin:1.5em;color:#222}} nav a{{margin-right:1em}}\
         table{{border-collapse:collapse;margin:.5em 0}} td,th{{border-bottom:1px solid #ddd;padding:.25em .6em;text-align:left}}\
         td.n{{text-align:right;font-variant-numeric:tabular-nums}} .inline{{display:inline}} .error{{color:#b00}}\
         .charts{{display:flex;gap:1em}} figure{{margin:0}} svg.spark{{background:#f6f8f6}}</style></head>\
         <body><nav><b>queen</b> <a href=/>queues</a><a href=/dlq>dead letters</a></nav><h1>{t}</h1>{body}</body></html>",
        t = esc(title)
    )
}

/// A cell's text: strings as they are, null as nothing, anything else as JSON.
fn text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

/// Percent-encodes for a URL.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `a=1&b=2` (a query string or a form body).
fn form(s: &str) -> BTreeMap<String, String> {
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_and_addresses() {
        assert_eq!(decode("a%20b+c%2Fd%zz%"), "a b c/d%zz%");
        let f = form("queue=q+1&back=%2Fdlq%3Fqueue%3Dq&empty=&flag");
        assert_eq!(f["queue"], "q 1");
        assert_eq!(f["back"], "/dlq?queue=q");
        assert_eq!((f["empty"].as_str(), f["flag"].as_str()), ("", ""));
        assert_eq!(enc("a b/ü"), "a%20b%2F%C3%BC");
        assert_eq!(decode(&enc("tenant-42:x y")), "tenant-42:x y");
        assert_eq!(esc("<a href=\"x\">'&'</a>"), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
    }

    #[test]
    fn only_hosts_named_by_address_are_served() {
        for ok in ["127.0.0.1:8080", "127.0.0.1", "localhost:8080", "LOCALHOST", "10.1.2.3:80", "[::1]:8080", "[::1]"] {
            assert!(addressed_directly(ok), "{ok:?}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example:8080",
            "localhost.evil.example",
            "[evil]:1",
            "",
        ] {
            assert!(!addressed_directly(bad), "{bad:?}");
        }
    }

    #[test]
    fn only_local_paths_are_followed_back() {
        assert!(local_path("/dlq?queue=a"));
        assert!(local_path("/"));
        for bad in ["//evil.example/", "/\\evil.example", "http://evil.example/", "/x\r\nSet-Cookie: a=b", ""] {
            assert!(!local_path(bad), "{bad:?}");
        }
    }
}
