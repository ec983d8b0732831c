//! N consumers at once, each on its own connection: `cargo run -p queen-consumer --example
//! pool -- "host=... user=postgres" orders 4`. SIGTERM or Ctrl-C stops them all after the
//! claims in hand are recorded.

use queen_consumer::{Builder, Outcome};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dsn = args.next().unwrap_or_else(|| "host=/var/tmp/queen-run/sock port=5488 user=postgres".into());
    let queue = args.next().unwrap_or_else(|| "demo".into());
    let n: usize = args.next().map_or(4, |s| s.parse().unwrap_or(4));
    let pool = Builder::new(&queue, "pool").batch(10).build_pool(&dsn, n).await?;
    let stop = pool.shutdown_token();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        stop.cancel();
    });
    pool.run(|m, _cancel| async move {
        println!("{} #{}: {}", m.partition, m.offset, m.payload);
        Ok(Outcome::Completed)
    })
    .await?;
    Ok(())
}
