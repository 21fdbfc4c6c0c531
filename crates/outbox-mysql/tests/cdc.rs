//! The binlog CDC source beyond the conformance suite, on a real MariaDB: a binlog rotation in
//! the middle of the stream, dead letters retried (`outbox dead retry` puts rows back to
//! `pending`, and the stream publishes them again, in order), and a kept position the server
//! no longer has (a clear fatal error, not a silent skip), and on MariaDB the GTID position:
//! kept with every save, and what the stream resumes by when the kept binlog file is not on
//! the server (a failover to a replica).

mod cdc_support;
mod support;

use std::sync::Arc;
use std::time::Duration;

use anyhow::ensure;
use cdc_support::CdcHarness;
use outbox_core::admin::RetrySelection;
use outbox_core::{DeadLetterPolicy, NewEvent, Ordering, SinkErrorKind, Source as _};
use outbox_mysql::{MySqlAdmin, MySqlCdcSource};
use outbox_testkit::conformance::{Harness as _, RunningRelay, test_relay_config};
use outbox_testkit::faults::{ScriptedSink, Times};
use uuid::Uuid;

fn event(aggregate: &str, n: usize) -> NewEvent {
    NewEvent::new("Order", aggregate, "order.changed", n.to_string())
}

async fn relay(h: &CdcHarness, sink: Arc<ScriptedSink>) -> anyhow::Result<RunningRelay> {
    let source = h
        .source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)
        .await?;
    Ok(RunningRelay::start(
        test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate, 3),
        sink,
        vec![source],
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binlog_rotation_mid_stream_loses_nothing_and_the_kept_position_follows_it()
-> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    let sink = Arc::new(ScriptedSink::new());
    let running = relay(&h, sink.clone()).await?;
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.extend(h.write(vec![event("r", n)], true).await?);
    }
    sink.wait_for_published(5, Duration::from_secs(30)).await?;
    let (before, _) = h.kept().await?;
    sqlx::raw_sql("FLUSH BINARY LOGS").execute(&h.pool).await?;
    for n in 5..10 {
        ids.extend(h.write(vec![event("r", n)], true).await?);
    }
    let published = sink.wait_for_published(10, Duration::from_secs(30)).await?;
    running.stop().await?;
    let got: Vec<Uuid> = published.iter().map(|e| e.id).collect();
    ensure!(got == ids, "published {got:?}, expected {ids:?}");
    let (after, _) = h.kept().await?;
    ensure!(
        after > before,
        "the kept position stayed in {before} after the rotation (now {after})"
    );
    // A new relay resumes in the new file: nothing delivered before comes again.
    let sink = Arc::new(ScriptedSink::new());
    let running = relay(&h, sink.clone()).await?;
    let last = h.write(vec![event("r", 10)], true).await?;
    let published = sink.wait_for_published(1, Duration::from_secs(30)).await?;
    running.stop().await?;
    let got: Vec<Uuid> = published.iter().map(|e| e.id).collect();
    ensure!(
        got == last,
        "after the restart: {got:?}, expected only {last:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_retried_are_streamed_again_in_order() -> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    let sink = Arc::new(ScriptedSink::new());
    sink.fail_aggregate("p", SinkErrorKind::Rejected, Times::Forever);
    let running = relay(&h, sink.clone()).await?;
    let mut poison = Vec::new();
    for n in 0..3 {
        poison.extend(h.write(vec![event("p", n)], true).await?);
    }
    let fine = h.write(vec![event("f", 0)], true).await?;
    sink.wait_for_published(1, Duration::from_secs(30)).await?;
    // p/0 is dead; p/1 and p/2 are parked behind it (hold-aggregate).
    outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        let mut dead = 0;
        for id in &poison {
            if h.stored(*id)
                .await
                .ok()
                .flatten()
                .is_some_and(|s| s.state == "dead")
            {
                dead += 1;
            }
        }
        dead == poison.len()
    })
    .await?;
    ensure!(
        sink.published().iter().map(|e| e.id).collect::<Vec<_>>() == fine,
        "only the healthy aggregate was published"
    );
    sink.clear_failures();
    let admin = MySqlAdmin::new(h.pool.clone(), &h.config);
    let retried = admin.retry(&RetrySelection::All).await?;
    ensure!(retried.len() == 3, "retried {retried:?}");
    let published = sink.wait_for_published(4, Duration::from_secs(30)).await?;
    running.stop().await?;
    let again: Vec<Uuid> = published.iter().skip(1).map(|e| e.id).collect();
    ensure!(
        again == poison,
        "retried dead letters streamed as {again:?}, expected {poison:?} (seq order)"
    );
    Ok(())
}

#[tokio::test]
async fn a_kept_position_the_server_no_longer_has_is_a_clear_fatal_error() -> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    // Without a GTID position (as on MySQL) the stream resumes by file and offset.
    sqlx::query(
        "UPDATE outbox_cdc_position SET binlog_file = 'binlog.999999', binlog_pos = 4, gtid = NULL",
    )
    .execute(&h.pool)
    .await?;
    let mut source = MySqlCdcSource::new(
        h.pool.clone(),
        &h.config,
        Ordering::PerAggregate,
        DeadLetterPolicy::HoldAggregate,
    )?;
    // The server answers the request on the stream: the error comes with a later fetch.
    let err = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match source.fetch(10, time::OffsetDateTime::now_utc()).await {
                Err(e) => return e,
                Ok(f) => ensure_empty(&f),
            }
            source.wait_for_events(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("a purged position cannot stream");
    ensure!(
        err.kind() == outbox_core::SourceErrorKind::Fatal,
        "not fatal: {err}"
    );
    ensure!(
        err.to_string()
            .contains("no longer has binlog binlog.999999:4"),
        "unclear: {err}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_mariadb_the_stream_resumes_by_gtid_where_the_kept_file_is_unknown() -> anyhow::Result<()>
{
    let h = CdcHarness::new().await?;
    let gtid = || async {
        sqlx::query_scalar::<_, Option<String>>(
            "SELECT gtid FROM outbox_cdc_position WHERE stream = 'relay'",
        )
        .fetch_one(&h.pool)
        .await
    };
    let at_migrate = gtid().await?.unwrap_or_default();
    ensure!(!at_migrate.is_empty(), "migrate records the GTID position");
    let sink = Arc::new(ScriptedSink::new());
    let running = relay(&h, sink.clone()).await?;
    let first = h.write(vec![event("g", 0), event("g", 1)], true).await?;
    sink.wait_for_published(2, Duration::from_secs(30)).await?;
    running.stop().await?;
    let after = gtid().await?.unwrap_or_default();
    ensure!(
        after != at_migrate,
        "the kept GTID position moved with the stream ({at_migrate} -> {after})"
    );
    // As after a failover: the kept file is unknown to this server, the GTID is not.
    sqlx::query(
        "UPDATE outbox_cdc_position SET binlog_file = 'other-host-bin.000007', binlog_pos = 1234",
    )
    .execute(&h.pool)
    .await?;
    let sink = Arc::new(ScriptedSink::new());
    let running = relay(&h, sink.clone()).await?;
    let next = h.write(vec![event("g", 2)], true).await?;
    let published = sink.wait_for_published(1, Duration::from_secs(30)).await?;
    running.stop().await?;
    let got: Vec<Uuid> = published.iter().map(|e| e.id).collect();
    ensure!(
        got == next,
        "resumed by GTID: {got:?}, expected only {next:?} (not {first:?} again)"
    );
    let (file, _) = h.kept().await?;
    ensure!(
        file.starts_with("binlog."),
        "the kept position is on this server's binlog again: {file}"
    );
    Ok(())
}

/// After a failover to a replica whose binlog has a file of the kept name holding the same
/// transactions at lower offsets (a replica seeded after the primary's binlog began), the
/// kept position must follow this server's positions: left comparing them with the old
/// primary's offset, it would stay at the failover for good and every restart would publish
/// everything since again. Found by `crates/outbox-cli/tests/failover.rs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_mariadb_a_kept_offset_from_another_binlog_of_the_same_name_is_left_behind()
-> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    let sink = Arc::new(ScriptedSink::new());
    let running = relay(&h, sink.clone()).await?;
    h.write(vec![event("o", 0)], true).await?;
    sink.wait_for_published(1, Duration::from_secs(30)).await?;
    running.stop().await?;
    let (file, _) = h.kept().await?;
    // As on the old primary: the same file name, the same GTID, an offset this server's
    // file never reaches.
    let far: i64 = 3_000_000_000;
    sqlx::query("UPDATE outbox_cdc_position SET binlog_pos = ?, token = (token >> 32 << 32) | ?")
        .bind(far)
        .bind(far)
        .execute(&h.pool)
        .await?;
    let sink = Arc::new(ScriptedSink::new());
    let running = relay(&h, sink.clone()).await?;
    let next = h.write(vec![event("o", 1), event("o", 2)], true).await?;
    let published = sink.wait_for_published(2, Duration::from_secs(30)).await?;
    running.stop().await?;
    let got: Vec<Uuid> = published.iter().map(|e| e.id).collect();
    ensure!(got == next, "resumed by GTID: {got:?}, expected {next:?}");
    let (after_file, after_pos) = h.kept().await?;
    ensure!(
        after_file == file && after_pos < u64::try_from(far)?,
        "the kept position follows this server's binlog again: {after_file}:{after_pos}"
    );
    Ok(())
}

fn ensure_empty(fetched: &outbox_core::Fetched) {
    assert!(
        fetched.events.is_empty(),
        "streamed from a purged position: {fetched:?}"
    );
}
