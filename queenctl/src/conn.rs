//! Connecting as libpq would: `--dsn`, else the PG* environment with libpq's defaults.

use postgres::{Client, Config, NoTls};

pub fn connect(dsn: Option<&str>) -> Result<Client, postgres::Error> {
    let config: Config = match dsn {
        Some(d) => d.parse()?,
        None => from_env(),
    };
    config.connect(NoTls)
}

/// libpq's environment: PGHOST (a socket directory or a host name; default the Debian
/// socket directory), PGPORT (5432), PGUSER (the OS user), PGDATABASE (the user's name),
/// PGPASSWORD, PGAPPNAME.
fn from_env() -> Config {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let mut c = Config::new();
    let user = var("PGUSER").or_else(|| var("USER")).unwrap_or_else(|| "postgres".into());
    c.host(&var("PGHOST").unwrap_or_else(|| "/var/run/postgresql".into()));
    c.port(var("PGPORT").and_then(|p| p.parse().ok()).unwrap_or(5432));
    c.dbname(&var("PGDATABASE").unwrap_or_else(|| user.clone()));
    c.user(&user);
    if let Some(p) = var("PGPASSWORD") {
        c.password(p);
    }
    c.application_name(&var("PGAPPNAME").unwrap_or_else(|| "queenctl".into()));
    c
}

/// An error as a person reads it: the server's message, SQLSTATE and detail.
pub fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{} (SQLSTATE {})", db.message(), db.code().code());
            if let Some(d) = db.detail() {
                s.push_str(&format!("\n  detail: {d}"));
            }
            if let Some(h) = db.hint() {
                s.push_str(&format!("\n  hint: {h}"));
            }
            s
        }
        None => e.to_string(),
    }
}
