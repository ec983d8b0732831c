//! Connecting as libpq would: `--dsn`, else the PG* environment with libpq's defaults.
//!
//! TLS as libpq's `sslmode` has it, for the modes the DSN parser knows: `disable`,
//! `prefer` (the default: TLS when the server offers it over TCP) and `require` (TLS or
//! no connection). As with libpq's `require`, the server's certificate is not checked,
//! unless `PGSSLROOTCERT` names a file of CA certificates: then it must chain to one of
//! them and name the host connected to (libpq's `verify-full`).

use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
use postgres::config::SslMode;
use postgres::{Client, Config};
use postgres_openssl::MakeTlsConnector;

pub fn connect(dsn: Option<&str>) -> Result<Client, String> {
    let config: Config = match dsn {
        Some(d) => d.parse().map_err(|e: postgres::Error| describe(&e))?,
        None => from_env()?,
    };
    config.connect(tls()?).map_err(|e| describe(&e))
}

/// The TLS connector: the certificate checked against `PGSSLROOTCERT` when it is set,
/// else not checked (libpq's `require`).
fn tls() -> Result<MakeTlsConnector, String> {
    let fail = |e: openssl::error::ErrorStack| format!("TLS setup: {e}");
    let mut builder = SslConnector::builder(SslMethod::tls_client()).map_err(fail)?;
    let root = std::env::var("PGSSLROOTCERT").ok().filter(|v| !v.is_empty());
    match &root {
        Some(file) => builder.set_ca_file(file).map_err(|e| format!("PGSSLROOTCERT {file}: {e}"))?,
        None => builder.set_verify(SslVerifyMode::NONE),
    }
    let mut connector = MakeTlsConnector::new(builder.build());
    if root.is_none() {
        connector.set_callback(|config, _| {
            config.set_verify_hostname(false);
            Ok(())
        });
    }
    Ok(connector)
}

/// libpq's environment: PGHOST (a socket directory or a host name; default the Debian
/// socket directory), PGPORT (5432), PGUSER (the OS user), PGDATABASE (the user's name),
/// PGPASSWORD, PGAPPNAME, PGSSLMODE (`disable`, `prefer`, `require`).
fn from_env() -> Result<Config, String> {
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
    if let Some(mode) = var("PGSSLMODE") {
        c.ssl_mode(match mode.as_str() {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            other => return Err(format!("PGSSLMODE {other}: queenctl knows disable, prefer and require")),
        });
    }
    Ok(c)
}

/// An error as a person reads it: the server's message, SQLSTATE and detail; or the
/// client's error and its causes.
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
        None => {
            // The causes too ("error performing TLS handshake: ... certificate verify failed").
            let mut s = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                s.push_str(&format!(": {c}"));
                cause = c.source();
            }
            s
        }
    }
}
