//! `loyalty`: seed 001's scenario end to end. See `examples/loyalty/README.md`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use outbox_example_loyalty::{Options, Summary, run_embedded, run_postgres_nats};

/// Places orders (order + `order.placed` in one transaction), relays the events, and awards
/// loyalty points exactly once per order while the relay redelivers and the consumer loses
/// acknowledgements on purpose.
#[derive(Debug, Parser)]
#[command(name = "loyalty", version, about)]
struct Args {
    /// Orders to place.
    #[arg(long, default_value_t = 50)]
    orders: usize,
    /// Customers the orders are spread over.
    #[arg(long, default_value_t = 5)]
    customers: usize,
    /// Fraction of relay batches published twice (a relay crash after publish, before mark).
    #[arg(long, default_value_t = 0.3, value_parser = fraction)]
    redeliver: f64,
    /// Fraction of first deliveries whose ack is lost after the consumer's commit.
    #[arg(long, default_value_t = 0.1, value_parser = fraction)]
    lost_acks: f64,
    /// Embedded setup: where the SQLite files go.
    #[arg(long, default_value = "loyalty-demo")]
    dir: PathBuf,
    /// PostgreSQL URL: run on PostgreSQL + NATS instead of the embedded setup.
    #[arg(long, requires = "nats")]
    postgres: Option<String>,
    /// NATS URL (with --postgres).
    #[arg(long, requires = "postgres")]
    nats: Option<String>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

fn fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(format!("`{s}` is not a fraction between 0 and 1")),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LOYALTY_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let options = Options {
        orders: args.orders,
        customers: args.customers,
        redeliver: args.redeliver,
        lost_acks: args.lost_acks,
    };
    let result = match (&args.postgres, &args.nats) {
        (Some(pg), Some(nats)) => run_postgres_nats(pg, nats, &options).await,
        _ => run_embedded(&args.dir, &options).await,
    };
    match result {
        Ok(summary) => {
            if args.json {
                match serde_json::to_string_pretty(&summary) {
                    Ok(json) => println!("{json}"),
                    Err(e) => eprintln!("error: {e}"),
                }
            } else {
                print_story(&summary);
            }
            if summary.exactly_once() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn print_story(s: &Summary) {
    println!("setup: {}", s.setup);
    println!(
        "shop      placed {} orders, each with its order.placed event in the same transaction",
        s.orders
    );
    println!(
        "loyalty   received {} deliveries: {} duplicates skipped by the inbox ({} after a lost ack; the rest were relay redeliveries)",
        s.deliveries, s.duplicates, s.lost_acks
    );
    println!(
        "          {} awards for {} distinct orders, {} points (the orders are worth {})",
        s.awards, s.awarded_orders, s.points, s.expected_points
    );
    if s.exactly_once() {
        println!("exactly once per order: yes");
    } else {
        println!("exactly once per order: NO — this is a bug, please report it");
    }
    println!("look at:");
    for l in &s.look_at {
        println!("  {l}");
    }
}
