//! Retention against a real PostgreSQL: batched deletes while a relay keeps publishing, and
//! partition rotation that never drops an undelivered event.
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

mod support;

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use anyhow::ensure;
use outbox_core::{DeadLetterPolicy, NewEvent, Ordering, SinkErrorKind};
use outbox_postgres::{
    MigrateOptions, OnDelivered, Partitioning, PgPollSource, PgRetention, PostgresConfig,
    RetentionSettings,
};
use outbox_testkit::conformance::{RunningRelay, test_relay_config};
use outbox_testkit::faults::{ScriptedSink, Times};
use outbox_testkit::services::Postgres;
use sqlx::PgPool;
use support::PgHarness;
use time::OffsetDateTime;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

fn events(aggregate_prefix: &str, n: usize) -> Vec<NewEvent> {
    (0..n)
        .map(|i| {
            NewEvent::new(
                "Order",
                format!("{aggregate_prefix}{}", i % 20),
                "order.changed",
                format!("{{\"n\":{i}}}"),
            )
        })
        .collect()
}

async fn count(pool: &PgPool, sql: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await?)
}

fn no_stop() -> impl FnMut(u64) -> ControlFlow<()> + Send {
    |_| ControlFlow::Continue(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retention_deletes_only_delivered_rows_past_the_window_while_the_relay_publishes()
-> anyhow::Result<()> {
    let h = PgHarness::new(OnDelivered::Mark).await?;
    let sink = Arc::new(ScriptedSink::new());
    sink.fail_aggregate("poison", SinkErrorKind::Rejected, Times::Forever);
    let mut relay_config = test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::Skip, 2);
    relay_config.batch_size = NonZeroUsize::new(200).expect("nonzero");
    let sources = vec![
        PgPollSource::new(
            h.pool.clone(),
            &h.config,
            relay_config.ordering,
            relay_config.dead_letter,
        ),
        PgPollSource::new(
            h.pool.clone(),
            &h.config,
            relay_config.ordering,
            relay_config.dead_letter,
        ),
    ];
    let relay = RunningRelay::start(relay_config, sink.clone(), sources);

    // Before the window's edge: 2,000 events delivered, 3 dead letters, 5 pending events
    // waiting for a retry far in the future.
    let mut old_ids = Vec::new();
    for chunk in events("old-", 2000).chunks(250) {
        old_ids.extend(write(&h, chunk.to_vec()).await?);
    }
    let dead_ids = write(
        &h,
        vec![
            NewEvent::new("Order", "poison", "order.bad", "{}"),
            NewEvent::new("Order", "poison", "order.bad", "{}"),
            NewEvent::new("Order", "poison", "order.bad", "{}"),
        ],
    )
    .await?;
    sink.wait_for_published(2000, WAIT).await?;
    outbox_testkit::wait::eventually(WAIT, || async {
        count(&h.pool, "SELECT count(*) FROM outbox WHERE state = 'dead'")
            .await
            .unwrap_or(0)
            == 3
    })
    .await?;
    // Written already waiting (as after a failed attempt), so no relay can claim them first.
    let waiting_ids: Vec<Uuid> = sqlx::query_scalar(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts,
                             next_attempt_at)
         SELECT 'Order', 'waiting-' || n, 'order.changed', '\\x7b7d', 1, 'infinity'
         FROM generate_series(1, 5) AS n
         RETURNING id",
    )
    .fetch_all(&h.pool)
    .await?;
    let edge = OffsetDateTime::now_utc();

    // After the edge: producers keep writing while retention runs in small batches.
    let producer = {
        let pool = h.pool.clone();
        let outbox = h.outbox.clone();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for chunk in events("new-", 2000).chunks(50) {
                let mut tx = pool.begin().await?;
                ids.extend(outbox.enqueue_batch(&mut *tx, chunk).await?);
                tx.commit().await?;
            }
            anyhow::Ok(ids)
        })
    };
    let retention = PgRetention::new(h.pool.clone(), &h.config);
    let keep = Duration::from_secs(3600);
    let settings = RetentionSettings {
        keep,
        batch: 100,
        pause: Duration::ZERO,
        ..RetentionSettings::default()
    };
    let preview = retention.preview(edge + keep, keep).await?;
    let report = retention
        .run(edge + keep, &settings, &mut no_stop())
        .await?;
    let new_ids = producer.await??;
    sink.wait_for_published(4000, WAIT).await?;
    relay.stop().await?;

    ensure!(
        preview.rows == 2000,
        "preview counted {} rows",
        preview.rows
    );
    ensure!(report.deleted == 2000, "deleted {} rows", report.deleted);
    ensure!(report.batches >= 20, "{} batches", report.batches);
    // Every event reached the broker.
    let published: HashSet<Uuid> = sink.published().iter().map(|e| e.id).collect();
    for id in old_ids.iter().chain(&new_ids) {
        ensure!(published.contains(id), "event {id} was never published");
    }
    // Nothing pending or dead was removed; nothing delivered after the edge was removed.
    let rows: Vec<(Uuid, String)> = sqlx::query_as("SELECT id, state FROM outbox")
        .fetch_all(&h.pool)
        .await?;
    let left: HashSet<Uuid> = rows.iter().map(|(id, _)| *id).collect();
    for id in dead_ids.iter().chain(&waiting_ids).chain(&new_ids) {
        ensure!(left.contains(id), "event {id} was removed by retention");
    }
    for id in &old_ids {
        ensure!(
            !left.contains(id),
            "delivered event {id} past the window was kept"
        );
    }
    ensure!(rows.len() == 2000 + 3 + 5, "{} rows left", rows.len());
    // A second run finds nothing.
    let again = retention
        .run(edge + keep, &settings, &mut no_stop())
        .await?;
    ensure!(again.deleted == 0 && again.batches == 1, "{again:?}");
    Ok(())
}

#[tokio::test]
async fn retention_stops_when_asked_between_batches() -> anyhow::Result<()> {
    let h = PgHarness::new(OnDelivered::Mark).await?;
    let ids = write(&h, events("a-", 50)).await?;
    sqlx::query("UPDATE outbox SET state = 'delivered', delivered_at = now() - interval '2 days'")
        .execute(&h.pool)
        .await?;
    let retention = PgRetention::new(h.pool.clone(), &h.config);
    let settings = RetentionSettings {
        keep: Duration::from_secs(86_400),
        batch: 10,
        pause: Duration::ZERO,
        ..RetentionSettings::default()
    };
    let mut seen = Vec::new();
    let report = retention
        .run(OffsetDateTime::now_utc(), &settings, &mut |n| {
            seen.push(n);
            if n >= 20 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .await?;
    ensure!(report.stopped && report.deleted == 20, "{report:?}");
    ensure!(seen == [10, 20], "{seen:?}");
    ensure!(count(&h.pool, "SELECT count(*) FROM outbox").await? == 30);
    ensure!(ids.len() == 50);
    Ok(())
}

async fn partitioned_outbox(
    partitioning: Partitioning,
) -> anyhow::Result<(PgPool, PostgresConfig)> {
    outbox_testkit::init_tracing();
    let pg = Postgres::shared().await?;
    let mut config = PostgresConfig::new(pg.fresh_database().await?);
    config.partitioning = partitioning;
    let pool = outbox_postgres::connect(&config, 8).await?;
    outbox_postgres::migrate_with(
        &pool,
        &config.qualified_table(),
        MigrateOptions::from_config(&config),
    )
    .await?;
    Ok((pool, config))
}

async fn partitions(pool: &PgPool) -> anyhow::Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'public.outbox'::regclass ORDER BY 1",
    )
    .fetch_all(pool)
    .await?)
}

fn day(t: OffsetDateTime) -> String {
    format!(
        "outbox_d{:04}{:02}{:02}",
        t.year(),
        u8::from(t.month()),
        t.day()
    )
}

/// Inserts one event dated `days` from now, in state `state`, as a plain-SQL producer would.
async fn insert_dated(pool: &PgPool, days: i32, state: &str) -> anyhow::Result<Uuid> {
    Ok(sqlx::query_scalar(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, state,
                             delivered_at, dead_lettered_at)
         VALUES ('Order', 'o-' || $1::int, 'order.placed', '\\x7b7d',
                 clock_timestamp() + make_interval(days => $1::int), $2,
                 CASE WHEN $2 = 'delivered' THEN clock_timestamp() END,
                 CASE WHEN $2 = 'dead' THEN clock_timestamp() END)
         RETURNING id",
    )
    .bind(days)
    .bind(state)
    .fetch_one(pool)
    .await?)
}

#[tokio::test]
async fn partition_rotation_keeps_every_undelivered_event() -> anyhow::Result<()> {
    let (pool, config) = partitioned_outbox(Partitioning::Daily).await?;
    let now = OffsetDateTime::now_utc();
    let created = partitions(&pool).await?;
    let expected: Vec<String> = (0..4)
        .map(|d| day(now + time::Duration::days(d)))
        .chain(["outbox_default".to_owned()])
        .collect();
    ensure!(created == expected, "migrate created {created:?}");

    // Today: delivered only. Tomorrow: one pending event among delivered ones. The day after:
    // one dead letter. The day after that: empty.
    let mut delivered = Vec::new();
    for _ in 0..3 {
        delivered.push(insert_dated(&pool, 0, "delivered").await?);
        delivered.push(insert_dated(&pool, 1, "delivered").await?);
    }
    let pending = insert_dated(&pool, 1, "pending").await?;
    let dead = insert_dated(&pool, 2, "dead").await?;
    // A row far in the past lands in the DEFAULT partition, which is never dropped.
    let ancient = insert_dated(&pool, -400, "pending").await?;

    // Ten days later, with one day of retention: all four partitions are past the window.
    let later = now + time::Duration::days(10);
    let retention = PgRetention::new(pool.clone(), &config);
    let keep = Duration::from_secs(86_400);
    let preview = retention.preview(later, keep).await?;
    let dropped_names = |v: &[(String, u64)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    ensure!(
        dropped_names(&preview.partitions_dropped)
            == [day(now), day(now + time::Duration::days(3))],
        "{preview:?}"
    );
    let settings = RetentionSettings {
        keep,
        ..RetentionSettings::default()
    };
    let report = retention.run(later, &settings, &mut no_stop()).await?;
    ensure!(
        report.partitions_dropped == [(day(now), 3), (day(now + time::Duration::days(3)), 0)],
        "{report:?}"
    );
    let kept: Vec<&str> = report
        .partitions_kept
        .iter()
        .map(|k| k.name.as_str())
        .collect();
    ensure!(
        kept == [
            day(now + time::Duration::days(1)).as_str(),
            day(now + time::Duration::days(2)).as_str()
        ],
        "{report:?}"
    );
    ensure!(
        report
            .partitions_kept
            .iter()
            .all(|k| k.reason.contains("undelivered")),
        "{report:?}"
    );
    // New partitions ahead of the (moved) clock.
    ensure!(
        report.partitions_created.contains(&day(later)),
        "{report:?}"
    );
    // The kept partition's delivered rows went row by row; every undelivered row is there.
    ensure!(report.deleted == 3, "{report:?}");
    let left: Vec<(Uuid, String)> = sqlx::query_as("SELECT id, state FROM outbox ORDER BY seq")
        .fetch_all(&pool)
        .await?;
    ensure!(
        left == [
            (pending, "pending".to_owned()),
            (dead, "dead".to_owned()),
            (ancient, "pending".to_owned())
        ],
        "{left:?}"
    );
    ensure!(delivered.len() == 6);
    let names = partitions(&pool).await?;
    ensure!(names.contains(&"outbox_default".to_owned()));
    ensure!(!names.contains(&day(now)), "{names:?}");
    ensure!(
        names.contains(&day(now + time::Duration::days(1))),
        "{names:?}"
    );

    // The kept pending event is still delivered by a relay.
    let sink = Arc::new(ScriptedSink::new());
    let relay = RunningRelay::start(
        test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::Skip, 3),
        sink.clone(),
        vec![PgPollSource::new(
            pool.clone(),
            &config,
            Ordering::PerAggregate,
            DeadLetterPolicy::Skip,
        )],
    );
    let published = sink.wait_for_published(2, WAIT).await?;
    relay.stop().await?;
    let ids: HashSet<Uuid> = published.iter().map(|e| e.id).collect();
    ensure!(ids.contains(&pending) && ids.contains(&ancient), "{ids:?}");
    Ok(())
}

#[tokio::test]
async fn a_partitioned_table_keeps_the_ordering_and_wakeup_triggers() -> anyhow::Result<()> {
    let (pool, mut config) = partitioned_outbox(Partitioning::Weekly).await?;
    config.listen_notify = true;
    let report = outbox_postgres::migrate_with(
        &pool,
        &config.qualified_table(),
        MigrateOptions::from_config(&config),
    )
    .await?;
    ensure!(
        report.wakeup_trigger && report.applied.is_empty(),
        "{report:?}"
    );
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
    listener.listen("outbox_wakeup").await?;
    let seqs: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('Order', 'o1', 'a', '\\x00'), ('Order', 'o1', 'b', '\\x00') RETURNING seq",
    )
    .fetch_all(&pool)
    .await?;
    ensure!(seqs.len() == 2 && seqs[0] < seqs[1], "{seqs:?}");
    let note = tokio::time::timeout(WAIT, listener.recv()).await??;
    ensure!(note.channel() == "outbox_wakeup");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_aggregate_written_into_two_partitions_still_serializes_its_writers()
-> anyhow::Result<()> {
    let (pool, _config) = partitioned_outbox(Partitioning::Daily).await?;
    let insert =
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
                  VALUES ('Order', 'o1', $1, '\\x00', now() + make_interval(days => $2::int))";
    // Today's partition, transaction left open.
    let mut first = pool.begin().await?;
    sqlx::query(insert)
        .bind("first")
        .bind(0)
        .execute(&mut *first)
        .await?;
    // Tomorrow's partition, same aggregate: must wait for the first writer.
    let second = tokio::spawn({
        let pool = pool.clone();
        async move {
            sqlx::query(insert)
                .bind("second")
                .bind(1)
                .execute(&pool)
                .await
        }
    });
    outbox_testkit::wait::eventually(WAIT, || async {
        second.is_finished()
            || count(
                &pool,
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            )
            .await
            .unwrap_or(0)
                > 0
    })
    .await?;
    ensure!(
        !second.is_finished(),
        "the second writer of the aggregate did not wait for the first (different partition, different lock)"
    );
    first.commit().await?;
    second.await??;
    let order: Vec<String> = sqlx::query_scalar("SELECT event_type FROM outbox ORDER BY seq")
        .fetch_all(&pool)
        .await?;
    ensure!(order == ["first", "second"], "{order:?}");
    Ok(())
}

#[tokio::test]
async fn an_existing_plain_table_is_never_converted_silently() -> anyhow::Result<()> {
    let h = PgHarness::new(OnDelivered::Mark).await?;
    let options = MigrateOptions {
        listen_notify: false,
        partitioning: Partitioning::Daily,
    };
    let err = outbox_postgres::migrate_with(&h.pool, &h.config.qualified_table(), options)
        .await
        .expect_err("a plain table must not become partitioned");
    let text = err.to_string();
    ensure!(
        text.contains("plain (not partitioned)") && text.contains("never converted silently"),
        "{text}"
    );
    let mut config = h.config.clone();
    config.partitioning = Partitioning::Daily;
    let err = PgRetention::new(h.pool.clone(), &config)
        .run(
            OffsetDateTime::now_utc(),
            &RetentionSettings::default(),
            &mut no_stop(),
        )
        .await
        .expect_err("layout mismatch");
    ensure!(
        err.to_string().contains("never converted silently"),
        "{err}"
    );

    // And the other way round: a partitioned table with partitioning = "none".
    let (pool, mut config) = partitioned_outbox(Partitioning::Hourly).await?;
    config.partitioning = Partitioning::None;
    let err = outbox_postgres::migrate(&pool, &config.qualified_table(), false)
        .await
        .expect_err("partitioned table, partitioning none");
    ensure!(err.to_string().contains("is partitioned"), "{err}");
    Ok(())
}

async fn write(h: &PgHarness, events: Vec<NewEvent>) -> anyhow::Result<Vec<Uuid>> {
    let mut tx = h.pool.begin().await?;
    let ids = h.outbox.enqueue_batch(&mut *tx, &events).await?;
    tx.commit().await?;
    Ok(ids)
}

/// Relay throughput with and without a retention run deleting at the same time. Prints
/// figures; asserts nothing about speed (speed belongs in benchmarks). Run with
/// `cargo nextest run -p outbox-postgres --test retention --run-ignored only --no-capture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "measurement: prints relay throughput with and without retention"]
async fn measure_relay_throughput_while_retention_runs() -> anyhow::Result<()> {
    const EVENTS: i64 = 100_000;
    const OLD: i64 = 800_000;
    for round in 1..=3 {
        for with_retention in [false, true] {
            let h = PgHarness::new(OnDelivered::Mark).await?;
            sqlx::query(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at,
                                     state, delivered_at)
                 SELECT 'Order', 'old-' || (i % 1000), 'order.placed', '\\x7b7d',
                        now() - interval '3 days', 'delivered', now() - interval '3 days'
                 FROM generate_series(1, $1) AS i",
            )
            .bind(OLD)
            .execute(&h.pool)
            .await?;
            sqlx::query(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
                 SELECT 'Order', 'o-' || (i % 1000), 'order.placed', '\\x7b7d'
                 FROM generate_series(1, $1) AS i",
            )
            .bind(EVENTS)
            .execute(&h.pool)
            .await?;
            sqlx::query("VACUUM ANALYZE outbox")
                .execute(&h.pool)
                .await?;
            let sink = Arc::new(ScriptedSink::new());
            let mut config = test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::Skip, 10);
            config.batch_size = NonZeroUsize::new(500).expect("nonzero");
            let sources = (0..2)
                .map(|_| {
                    PgPollSource::new(
                        h.pool.clone(),
                        &h.config,
                        config.ordering,
                        config.dead_letter,
                    )
                })
                .collect();
            let retention = PgRetention::new(h.pool.clone(), &h.config);
            let started = std::time::Instant::now();
            let relay = RunningRelay::start(config, sink.clone(), sources);
            let deleting = with_retention.then(|| {
                tokio::spawn(async move {
                    let t = std::time::Instant::now();
                    let r = retention
                        .run(
                            OffsetDateTime::now_utc(),
                            &RetentionSettings {
                                keep: Duration::from_secs(86_400),
                                ..RetentionSettings::default()
                            },
                            &mut no_stop(),
                        )
                        .await;
                    (r, t.elapsed())
                })
            });
            sink.wait_for_published(usize::try_from(EVENTS)?, Duration::from_secs(600))
                .await?;
            let drained = started.elapsed();
            relay.stop().await?;
            let retention_figure = match deleting {
                Some(task) => {
                    let (report, took) = task.await?;
                    let report = report?;
                    format!(
                        "; retention deleted {} rows in {:.2}s ({:.0} rows/s, {} batches)",
                        report.deleted,
                        took.as_secs_f64(),
                        report.deleted as f64 / took.as_secs_f64(),
                        report.batches
                    )
                }
                None => String::new(),
            };
            println!(
                "round {round}, retention {}: relay drained {EVENTS} events in {:.2}s = {:.0} events/s{retention_figure}",
                if with_retention { "running" } else { "off    " },
                drained.as_secs_f64(),
                EVENTS as f64 / drained.as_secs_f64(),
            );
        }
    }
    Ok(())
}
