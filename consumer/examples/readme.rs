use queen_consumer::{Builder, Outcome};
use tokio_postgres::NoTls;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dsn = std::env::var("QUEEN_DSN")?;
    let (producer, connection) = tokio_postgres::connect(&dsn, NoTls).await?;
    tokio::spawn(connection);
    producer.execute("SELECT count(*) FROM queen.push('emails', '{\"to\": \"ada@example.com\"}')", &[]).await?;
    let (client, connection) = tokio_postgres::connect(&dsn, NoTls).await?;
    let consumer = Builder::new("emails", "mailer").build_with_connection(client, connection).await?;
    let send = |m: queen_consumer::Message, _| async move {
        println!("sending to {}", m.payload["to"]);
        Ok(Outcome::Completed)
    };
    consumer.run_once(send, None).await?;
    Ok(())
}
