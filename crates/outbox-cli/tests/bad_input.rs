//! Guarantee 6: every mistake a user can make gets one clear line naming the problem, a
//! non-zero exit, no panic, and no change in the database.

mod support;

use anyhow::{Context, ensure};
use outbox_testkit::services::Postgres;
use support::Workdir;

fn cfg(work: &Workdir, toml: &str) -> anyhow::Result<String> {
    Ok(work
        .write_config("outbox.toml", toml)?
        .to_str()
        .context("utf-8")?
        .to_owned())
}

#[tokio::test]
async fn malformed_toml_names_the_file_and_the_line() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let c = cfg(&work, "[source\nkind = \"postgres\"\n")?;
    let out = work.run(&["check-config", "--config", &c]).await?;
    out.assert_clear_error("outbox.toml")?;
    ensure!(
        out.stderr.contains("line 1"),
        "no line number: {}",
        out.stderr
    );
    Ok(())
}

#[tokio::test]
async fn unknown_key_is_refused_with_its_path() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let c = cfg(&work, "[relay]\nbatch_sise = 10\n")?;
    work.run(&["check-config", "--config", &c])
        .await?
        .assert_clear_error("relay.batch_sise")?;
    Ok(())
}

#[tokio::test]
async fn a_bad_value_inside_source_or_sink_names_its_key() -> anyhow::Result<()> {
    // [source] and [sink] are chosen by `kind`; the error must still name the key inside.
    let work = Workdir::new()?;
    for (toml, key) in [
        (
            "[source]\nkind = \"postgres\"\nurl = \"postgres://a@127.0.0.1/b\"\nclaim_timeout = \"banana\"\n",
            "source.claim_timeout",
        ),
        (
            "[source]\nkind = \"postgres\"\nurl = \"postgres://a@127.0.0.1/b\"\nmode = \"cdcx\"\n",
            "source.mode",
        ),
        (
            "[sink]\nkind = \"nats\"\nack_timeout = \"banana\"\n",
            "sink.ack_timeout",
        ),
        (
            "[sink]\nkind = \"http\"\nurl = \"http://127.0.0.1:1/\"\nmax_concurrency = 0\n",
            "sink.max_concurrency",
        ),
    ] {
        let c = cfg(&work, toml)?;
        work.run(&["check-config", "--config", &c])
            .await?
            .assert_clear_error(key)?;
    }
    Ok(())
}

#[tokio::test]
async fn unknown_sink_kind_is_refused() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let c = cfg(&work, "[sink]\nkind = \"kafak\"\n")?;
    work.run(&["relay", "--config", &c])
        .await?
        .assert_clear_error("kafak")?;
    Ok(())
}

#[tokio::test]
async fn invalid_destination_template_is_refused() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let c = cfg(
        &work,
        "[sink]\nkind = \"stdout\"\ndestination = \"x.{tenant}\"\n",
    )?;
    work.run(&["check-config", "--config", &c])
        .await?
        .assert_clear_error("{tenant}")?;
    Ok(())
}

#[tokio::test]
async fn zero_batch_size_is_refused() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let c = cfg(&work, "[relay]\nbatch_size = 0\n")?;
    work.run(&["check-config", "--config", &c])
        .await?
        .assert_clear_error("relay.batch_size")?;
    Ok(())
}

#[tokio::test]
async fn missing_config_file_is_reported() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    work.run(&["relay", "--config", "nope.toml"])
        .await?
        .assert_clear_error("nope.toml")?;
    Ok(())
}

#[tokio::test]
async fn table_name_with_sql_in_it_is_refused_and_nothing_is_created() -> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let work = Workdir::new()?;
    let c = cfg(
        &work,
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{url}\"\ntable = \"outbox; DROP TABLE users\"\n"
        ),
    )?;
    let out = work.run(&["migrate", "--config", &c]).await?;
    out.assert_clear_error("not a plain identifier")?;
    let pool = sqlx::PgPool::connect(&url).await?;
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
            .fetch_one(&pool)
            .await?;
    ensure!(
        tables == 0,
        "migrate created {tables} table(s) despite the bad name"
    );
    Ok(())
}

#[tokio::test]
async fn unreachable_database_fails_fast_with_its_address() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let c = cfg(
        &work,
        "[source]\nkind = \"postgres\"\nurl = \"postgres://app:secret@127.0.0.1:1/app\"\nconnect_timeout = \"2s\"\n",
    )?;
    let out = work.run(&["relay", "--config", &c]).await?;
    out.assert_clear_error("127.0.0.1:1")?;
    ensure!(
        !out.stderr.contains("secret"),
        "password leaked: {}",
        out.stderr
    );
    Ok(())
}

#[tokio::test]
async fn relay_before_migrate_says_to_run_migrate() -> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let work = Workdir::new()?;
    let c = cfg(
        &work,
        &format!("[source]\nkind = \"postgres\"\nurl = \"{url}\"\n"),
    )?;
    work.run(&["relay", "--config", &c])
        .await?
        .assert_clear_error("outbox migrate")?;
    Ok(())
}

#[tokio::test]
async fn total_ordering_with_the_polling_source_is_refused() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let c = cfg(
        &work,
        "[source]\nkind = \"postgres\"\nurl = \"postgres://x@127.0.0.1/x\"\n[relay]\nordering = \"total\"\n",
    )?;
    work.run(&["check-config", "--config", &c])
        .await?
        .assert_clear_error("relay.ordering")?;
    Ok(())
}

#[tokio::test]
async fn database_url_from_the_environment_overrides_the_file() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let c = cfg(&work, "[relay]\nbatch_size = 7\n")?;
    let out = work
        .command(&["check-config", "--config", &c])
        .env("OUTBOX_DATABASE_URL", "postgres://u:pw@127.0.0.1:5/db")
        .env("OUTBOX_RELAY__MAX_ATTEMPTS", "3")
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        stdout.contains("kind = \"postgres\""),
        "source kind not inferred: {stdout}"
    );
    ensure!(
        stdout.contains("max_attempts = 3"),
        "env override ignored: {stdout}"
    );
    ensure!(
        stdout.contains("batch_size = 7"),
        "file value lost: {stdout}"
    );
    ensure!(!stdout.contains("pw@"), "password printed: {stdout}");
    ensure!(
        stdout.contains("url = \"postgres://u:***@127.0.0.1:5/db\""),
        "{stdout}"
    );
    Ok(())
}

/// `outbox check-config | head -1`: the reader went away before the report was printed. The
/// command stops quietly with 141 (128 + SIGPIPE), as Unix tools do: no panic, no backtrace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_a_command_quietly() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let (reader, writer) = std::io::pipe()?;
    drop(reader);
    let mut command = work.command(&["check-config"]);
    command
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .env("RUST_BACKTRACE", "1");
    // `output()` would pipe stdout again; `spawn` keeps the closed pipe.
    let out = command.spawn()?.wait_with_output().await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "stderr: {stderr}"
    );
    ensure!(
        out.status.code() == Some(141),
        "exit {:?}: {stderr}",
        out.status
    );
    Ok(())
}
