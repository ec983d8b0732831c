//! Connecting as libpq would: `--dsn`, else the PG* environment with libpq's defaults.
//!
//! TLS as libpq's `sslmode` has it, for the modes the DSN parser knows: `disable`,
//! `prefer` (the default: TLS when the server offers it over TCP) and `require` (TLS or
//! no connection); over a Unix socket, as in libpq, no TLS whatever the mode. As with
//! libpq's `require`, the server's certificate is not checked, unless `PGSSLROOTCERT`
//! names a file of CA certificates: then TLS is required over TCP (`prefer` becomes
//! `require`), and the certificate must chain to one of those CAs (those only, not
//! the system's) and name the host connected to: libpq's `verify-full`.

use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::X509;
use postgres::config::SslMode;
use postgres::{Client, Config, NoTls};
use postgres_openssl::MakeTlsConnector;

pub fn connect(dsn: Option<&str>) -> Result<Client, String> {
    let mut config: Config = match dsn {
        Some(d) => d.parse().map_err(|e: postgres::Error| describe(&e))?,
        None => from_env()?,
    };
    // A Unix socket never has TLS: there sslmode is ignored, as libpq ignores it.
    let tcp = !config.get_hostaddrs().is_empty()
        || config.get_hosts().iter().any(|h| matches!(h, postgres::config::Host::Tcp(_)));
    if !tcp {
        config.ssl_mode(SslMode::Disable);
    }
    let connected = match config.get_ssl_mode() {
        SslMode::Disable => config.connect(NoTls),
        mode => {
            let root = std::env::var("PGSSLROOTCERT").ok().filter(|v| !v.is_empty());
            // A checked certificate or no connection (a socket in the host list then fails
            // over to the next host).
            if root.is_some() && mode == SslMode::Prefer {
                config.ssl_mode(SslMode::Require);
            }
            config.connect(tls(root.as_deref())?)
        }
    };
    connected.map_err(|e| describe(&e))
}

/// The TLS connector: the certificate checked against the CAs of the file `root` (and
/// those only), else not checked (libpq's `require`).
fn tls(root: Option<&str>) -> Result<MakeTlsConnector, String> {
    let fail = |e: openssl::error::ErrorStack| format!("TLS setup: {e}");
    let mut builder = SslConnector::builder(SslMethod::tls_client()).map_err(fail)?;
    match root {
        Some(file) => {
            let pem = std::fs::read(file).map_err(|e| format!("PGSSLROOTCERT {file}: {e}"))?;
            let certs = X509::stack_from_pem(&pem).map_err(|e| format!("PGSSLROOTCERT {file}: {e}"))?;
            if certs.is_empty() {
                return Err(format!("PGSSLROOTCERT {file}: no certificate in it"));
            }
            // A store of these CAs alone: the builder's default one holds the system's too.
            let mut store = X509StoreBuilder::new().map_err(fail)?;
            for cert in certs {
                store.add_cert(cert).map_err(fail)?;
            }
            builder.set_cert_store(store.build());
        }
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
/// PGPASSWORD, PGAPPNAME, PGSSLMODE (`disable`, `prefer`, `require`); PGSSLROOTCERT is read
/// by `connect`, for a DSN too.
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
            // A cause that repeats what is already said (OpenSSL's errors do) is left out.
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                let text = c.to_string();
                if !s.contains(&text) {
                    s.push_str(&format!(": {text}"));
                }
                cause = c.source();
            }
            s
        }
    }
}
