//! Micro-benchmark: one relay round trip against a real PostgreSQL — claim a 500-event batch
//! (`outbox_claim_batch.sql`, per-aggregate ordering) and settle it as delivered
//! (`outbox_mark_delivered.sql` or `outbox_delete_delivered.sql`), committed — through the
//! polling source exactly as the relay calls it.
//!
//! The testkit starts a private PostgreSQL (or uses `OUTBOX_TEST_DATABASE_URL`); without one
//! the benchmark says why and measures nothing. Before each timed round trip a fresh
//! 500-event batch is written (not timed), so every claim finds a full batch at the head.
//!
//! `cargo bench -p outbox-postgres --bench claim` (add `-- --quick` for a short run).
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use outbox_core::source::{Outcome, Settlement};
use outbox_core::{DeadLetterPolicy, NewEvent, Ordering, Source};
use outbox_postgres::{OnDelivered, PgOutbox, PgPollSource, PostgresConfig};
use sqlx::PgPool;
use time::OffsetDateTime;

const BATCH: usize = 500;

struct Bench {
    pool: PgPool,
    source: PgPollSource,
    outbox: PgOutbox,
    next: u64,
}

async fn setup(on_delivered: OnDelivered) -> anyhow::Result<Bench> {
    let server = outbox_testkit::services::Postgres::shared().await?;
    let url = server.fresh_database().await?;
    let mut config = PostgresConfig::new(url);
    config.on_delivered = on_delivered;
    let pool = outbox_postgres::connect(&config, 2).await?;
    outbox_postgres::migrate(&pool, &config.qualified_table(), false).await?;
    let source = PgPollSource::new(
        pool.clone(),
        &config,
        Ordering::PerAggregate,
        DeadLetterPolicy::HoldAggregate,
    );
    Ok(Bench {
        pool,
        source,
        outbox: PgOutbox::new(config.qualified_table()),
        next: 0,
    })
}

impl Bench {
    /// Writes one batch (untimed), then times claim + settle.
    async fn round_trip(&mut self) -> anyhow::Result<Duration> {
        let events: Vec<NewEvent> = (self.next..self.next + BATCH as u64)
            .map(|i| {
                NewEvent::new(
                    "Order",
                    format!("o_{}", i % 1000),
                    "order.placed",
                    vec![b'x'; 200],
                )
            })
            .collect();
        self.next += BATCH as u64;
        self.outbox.enqueue_batch(&self.pool, &events).await?;
        let start = Instant::now();
        let fetched = self.source.fetch(BATCH, OffsetDateTime::now_utc()).await?;
        let settlements: Vec<Settlement> = fetched
            .events
            .iter()
            .map(|e| Settlement {
                position: e.position,
                outcome: Outcome::Delivered,
            })
            .collect();
        self.source
            .settle(&settlements, OffsetDateTime::now_utc())
            .await?;
        let took = start.elapsed();
        anyhow::ensure!(
            fetched.events.len() == BATCH,
            "claimed {} events, expected {BATCH}",
            fetched.events.len()
        );
        Ok(took)
    }
}

fn claim_and_settle(c: &mut Criterion) {
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("skipping the claim benchmarks: no tokio runtime: {e}");
            return;
        }
    };
    let mut group = c.benchmark_group("claim_settle_500");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.sample_size(30);
    for (name, on_delivered) in [("mark", OnDelivered::Mark), ("delete", OnDelivered::Delete)] {
        let mut bench = match rt.block_on(setup(on_delivered)) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("skipping claim_settle_500/{name}: cannot start PostgreSQL: {e:#}");
                continue;
            }
        };
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        match bench.round_trip().await {
                            Ok(d) => total += d,
                            Err(e) => panic!("round trip failed: {e:#}"),
                        }
                    }
                    total
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, claim_and_settle);
criterion_main!(benches);
