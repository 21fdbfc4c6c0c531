//! `bookings`: the example's booking service and a stand-in webhook receiver. See
//! `examples/bookings/README.md`.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context;
use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "bookings", version, about)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The booking service: `POST /bookings {"customer_id", "starts_at", "amount_cents"}`
    /// inserts one row (creating the table on start if it is missing).
    Serve {
        /// PostgreSQL URL.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
    },
    /// A stand-in for the SMS provider or the payment processor: answers every POST with 200
    /// and prints one line per webhook (the event id, the customer and the body).
    Receiver {
        /// Address to listen on.
        #[arg(long)]
        listen: SocketAddr,
        /// A name for the printed lines (`sms`, `payments`).
        #[arg(long)]
        name: String,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BOOKINGS_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Serve {
            database_url,
            listen,
        } => {
            let pool = sqlx::PgPool::connect(&database_url)
                .await
                .context("connecting to the database (--database-url)")?;
            outbox_example_bookings::create_schema(&pool)
                .await
                .context("creating the bookings table")?;
            serve(listen, outbox_example_bookings::router(pool)).await
        }
        Command::Receiver { listen, name } => {
            let app = Router::new().fallback(post(move |headers: HeaderMap, body: Bytes| {
                let name = name.clone();
                async move {
                    let header = |h: &str| {
                        headers
                            .get(h)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("-")
                            .to_owned()
                    };
                    println!(
                        "{name}: id={} customer={} {}",
                        header("outbox-id"),
                        header("outbox-aggregate_id"),
                        String::from_utf8_lossy(&body)
                    );
                    StatusCode::OK
                }
            }));
            serve(listen, app).await
        }
    }
}

async fn serve(listen: SocketAddr, app: Router) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    tracing::info!(%listen, "listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("serving")
}
