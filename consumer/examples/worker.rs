//! A worker: `cargo run -p queen-consumer --example worker -- "host=... user=postgres" orders`.
//! Prints each message; Ctrl-C stops it after the claim in hand is recorded.

use std::time::Duration;

use queen_consumer::{Builder, Outcome};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dsn = args.next().unwrap_or_else(|| "host=/var/tmp/queen-run/sock port=5488 user=postgres".into());
    let queue = args.next().unwrap_or_else(|| "demo".into());
    // The consumer drives the connection itself, so it sees the server's warnings.
    let (client, connection) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls).await?;
    let consumer = Builder::new(&queue, "worker")
        .batch(10)
        .handler_timeout(Duration::from_secs(5))
        .queue_margin(Duration::from_secs(10))
        .build_with_connection(client, connection)
        .await?;
    let stop = consumer.shutdown_token();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    consumer
        .run(|m, _cancel| async move {
            // A producer that pushed a W3C traceparent in the headers: continue its trace.
            match m.traceparent() {
                Some(trace) => println!("{} #{}: {} (trace {trace})", m.partition, m.offset, m.payload),
                None => println!("{} #{}: {}", m.partition, m.offset, m.payload),
            }
            Ok(Outcome::Completed)
        })
        .await?;
    Ok(())
}
