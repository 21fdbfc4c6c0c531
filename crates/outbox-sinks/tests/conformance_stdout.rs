//! The sink conformance suite for the JSON-lines sinks (`file`, and `stdout`, which writes the
//! same lines to a different descriptor), read back by parsing the file as a consumer would.
//!
//! Two checks of the suite cannot apply to a local file, and the harness says so rather than
//! faking them: there is no broker to stop and restart (a full disk or a vanished file is
//! covered by the sink's own tests in `tests/stdout.rs`), and a line has no size limit, so
//! nothing is ever `Rejected` for its size. Every other check runs unchanged.

#![cfg(feature = "stdout")]

use std::path::PathBuf;

use bytes::Bytes;
use outbox_sinks::stdout::JsonLine;
use outbox_sinks::{FileConfig, FileSink};
use outbox_testkit::sink_conformance::{self, Dedupe, Received, SinkHarness, Target};

struct FileHarness {
    dir: tempfile::TempDir,
}

impl FileHarness {
    fn path(&self, target: &Target) -> PathBuf {
        self.dir.path().join(format!("{}.jsonl", target.scope))
    }
}

impl SinkHarness for FileHarness {
    type Sink = FileSink;

    async fn sink(&self, target: &Target) -> anyhow::Result<FileSink> {
        let config = FileConfig {
            path: self.path(target),
            destination: target.template.clone(),
            sync: true,
            ..FileConfig::default()
        };
        Ok(config.build().await?)
    }

    async fn received(&self, target: &Target, _at_least: usize) -> anyhow::Result<Vec<Received>> {
        // The sink acknowledges after the write (and fsync): everything is there already.
        let text = match tokio::fs::read_to_string(self.path(target)).await {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e.into()),
        };
        text.lines()
            .map(|line| {
                let line = JsonLine::parse(line)?;
                let headers: Vec<(String, String)> = line.headers.clone().into_iter().collect();
                Ok(Received {
                    destination: line.destination.clone(),
                    key: Some(line.key.clone()),
                    headers,
                    body: Bytes::from(line.payload_bytes()?),
                })
            })
            .collect()
    }

    async fn stop_broker(&self) -> anyhow::Result<()> {
        anyhow::bail!("a local file has no broker to stop")
    }

    async fn restart_broker(&self) -> anyhow::Result<()> {
        anyhow::bail!("a local file has no broker to restart")
    }

    fn broker_address(&self) -> String {
        self.dir.path().display().to_string()
    }

    fn max_message_size(&self) -> usize {
        usize::MAX
    }

    fn dedupe(&self) -> Dedupe {
        Dedupe::No
    }

    fn keyed(&self) -> bool {
        true
    }
}

#[tokio::test]
async fn the_file_sink_passes_every_conformance_check_that_applies_to_a_local_file()
-> anyhow::Result<()> {
    let h = FileHarness {
        dir: tempfile::tempdir()?,
    };
    sink_conformance::an_empty_batch_publishes_nothing(&h).await?;
    sink_conformance::messages_carry_exact_bytes_headers_and_key(&h).await?;
    sink_conformance::the_destination_template_is_rendered_per_event(&h).await?;
    sink_conformance::events_of_one_aggregate_keep_their_order_across_batches(&h).await?;
    sink_conformance::publishing_an_event_twice_is_harmless(&h).await?;
    // Not applicable, see the file's doc comment:
    // an_oversized_message_is_rejected_while_the_rest_flow (no size limit),
    // a_broker_outage_fails_whole_batches_and_loses_nothing (no broker).
    Ok(())
}
