//! N consumers at once, each on its own connection: `cargo run -p queen-consumer --example
//! pool -- "host=... user=postgres" orders 4`. SIGTERM or Ctrl-C stops them all after the
//! claims in hand are recorded.

use queen_consumer::{Builder, CancellationToken, Outcome};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dsn = args.next().unwrap_or_else(|| "host=/var/tmp/queen-run/sock port=5488 user=postgres".into());
    let queue = args.next().unwrap_or_else(|| "demo".into());
    let n: usize = args.next().map_or(4, |s| s.parse().unwrap_or(4));
    let stop = CancellationToken::new();
    let mut workers = Vec::new();
    for _ in 0..n {
        let (client, connection) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls).await?;
        let consumer = Builder::new(&queue, "pool").batch(10).build_with_connection(client, connection).await?;
        let token = consumer.shutdown_token();
        let stop = stop.clone();
        tokio::spawn(async move {
            stop.cancelled().await;
            token.cancel();
        });
        workers.push(tokio::spawn(async move {
            consumer
                .run(|m, _cancel| async move {
                    println!("{} #{}: {}", m.partition, m.offset, m.payload);
                    Ok(Outcome::Completed)
                })
                .await
        }));
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    stop.cancel();
    for w in workers {
        w.await??;
    }
    Ok(())
}
