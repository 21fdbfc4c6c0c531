//! The scratch outbox of a crash test: the user's config rewritten to a table and a
//! destination of the run's own (named after its tag), created before the run and removed
//! after it, also when the run fails.
//!
//! The same rewrite runs in the crash test and in each relay it starts (`outbox relay
//! --crash-test-scratch TAG`, hidden): the relays load the user's config like any other
//! command, so no secret is ever written to a file.

use std::time::Duration;

use anyhow::{Context, anyhow};
use outbox_core::Identifier;
use outbox_core::backend::{OpenOptions, SCRATCH_PREFIX};
use outbox_runtime::Config;

/// The longest `relay.publish_timeout` of a scratch config: shorter than the scratch claim
/// ([`outbox_core::backend::SCRATCH_CLAIM_TIMEOUT`]), as every source requires.
const SCRATCH_PUBLISH_TIMEOUT: Duration = Duration::from_secs(2);

/// A new tag: `outbox_crash_` and 8 random hex digits.
pub(crate) fn new_tag() -> Identifier {
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
    Identifier::new(format!("{SCRATCH_PREFIX}{suffix}")).expect("a valid identifier")
}

/// The tag given to a relay (`--crash-test-scratch`), checked.
pub(crate) fn parse_tag(text: &str) -> anyhow::Result<Identifier> {
    let tag = Identifier::new(text).map_err(|e| anyhow!("--crash-test-scratch: {e}"))?;
    anyhow::ensure!(
        tag.as_str().starts_with(SCRATCH_PREFIX),
        "--crash-test-scratch: a scratch tag starts with `{SCRATCH_PREFIX}`"
    );
    Ok(tag)
}

/// `config` rewritten to the scratch outbox `tag`: the scratch table and destination, the
/// plain `[source]` → `[sink]` path only (no subscriptions, capture, metrics listener,
/// console, tracing or retention), claims short enough to pause a relay past them.
pub(crate) fn scratch_config(config: &Config, tag: &Identifier) -> anyhow::Result<Config> {
    let mut scratch = config.clone();
    scratch.source = config
        .source
        .scratch(tag)
        .map_err(|e| anyhow!("cannot make a scratch outbox: {e}"))?;
    scratch.sink = config
        .sink
        .scratch(tag)
        .map_err(|e| anyhow!("cannot make a scratch destination: {e}"))?;
    scratch.sinks.clear();
    scratch.subscriptions.clear();
    scratch.capture.clear();
    scratch.metrics.listen = None;
    scratch.ui.enabled = Some(false);
    scratch.tracing = outbox_runtime::TracingConfig::default();
    scratch.retention.enabled = false;
    scratch.relay.publish_timeout = scratch.relay.publish_timeout.min(SCRATCH_PUBLISH_TIMEOUT);
    scratch
        .validate()
        .map_err(|e| anyhow!("the scratch config is not valid: {e}"))?;
    Ok(scratch)
}

/// What the run created, to remove at the end.
#[derive(Debug, Default)]
pub(crate) struct Created {
    /// The scratch outbox table (and CDC slot and publication), once `migrate` ran.
    pub(crate) table: Option<String>,
    /// The scratch destination, once the sink was built.
    pub(crate) destination: Option<String>,
}

/// One removal: what, and whether it went (`--json`: `created`, then `removed`, the lines
/// of what went, or `error`, why it could not).
#[derive(Debug, Clone)]
pub(crate) struct Removal {
    /// What was created.
    pub(crate) created: String,
    /// What was removed (one line each), or why it could not be.
    pub(crate) removed: Result<Vec<String>, String>,
}

impl serde::Serialize for Removal {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("created", &self.created)?;
        match &self.removed {
            Ok(lines) => map.serialize_entry("removed", lines)?,
            Err(e) => map.serialize_entry("error", e)?,
        }
        map.end()
    }
}

/// Removes what `created` lists (relays must be stopped first: a CDC slot in use cannot be
/// dropped). Never fails: each removal says how it went.
pub(crate) async fn remove(scratch: &Config, created: &Created) -> Vec<Removal> {
    let mut out = Vec::new();
    if let Some(table) = &created.table {
        let removed = async {
            let backend = scratch
                .source
                .open(OpenOptions { connections: 1 })
                .await
                .map_err(|e| crate::chain(&e))?;
            let ability = backend.scratch().map_err(|e| e.to_string())?;
            ability.remove().await.map_err(|e| crate::chain(&e))
        }
        .await;
        out.push(Removal {
            created: table.clone(),
            removed,
        });
    }
    if let Some(destination) = &created.destination {
        let removed = scratch
            .sink
            .remove_scratch()
            .await
            .map(|line| vec![line])
            .map_err(|e| crate::chain(&e));
        out.push(Removal {
            created: destination.clone(),
            removed,
        });
    }
    out
}

/// Creates the scratch outbox table (the `migrate` of the scratch config); returns what it
/// is, for people.
pub(crate) async fn create_table(
    scratch: &Config,
) -> anyhow::Result<(std::sync::Arc<dyn outbox_core::Backend>, String)> {
    let backend = scratch
        .source
        .open(OpenOptions { connections: 8 })
        .await
        .map_err(|e| anyhow!("{}", crate::chain(&e)))
        .context("opening the database")?;
    backend
        .migrate()
        .await
        .map_err(|e| anyhow!("{}", crate::chain(&e)))
        .with_context(|| format!("creating scratch outbox table {}", backend.table()))?;
    let (table, database) = (backend.table(), backend.database());
    let what = if table.contains(&database) {
        format!("outbox table {table}")
    } else {
        format!("outbox table {table} in {database}")
    };
    Ok((backend, what))
}

/// Builds the scratch sink once, which creates the scratch destination where the broker needs
/// it (a JetStream stream) and proves the broker reachable; returns what it is, for people.
pub(crate) async fn create_destination(scratch: &Config) -> anyhow::Result<String> {
    let sink = scratch
        .sink
        .build()
        .await
        .map_err(|e| anyhow!("{}", crate::chain(&e)))
        .context("connecting to the broker")?;
    drop(sink);
    let sample = outbox_core::Event {
        id: uuid::Uuid::nil(),
        position: outbox_core::Position(0),
        aggregate_type: super::producers::AGGREGATE_TYPE.to_owned(),
        aggregate_id: "a".to_owned(),
        event_type: super::producers::EVENT_TYPE.to_owned(),
        payload: Default::default(),
        headers: Vec::new(),
        created_at: time::OffsetDateTime::now_utc(),
        attempts: 0,
    };
    Ok(scratch.sink.describe_destination(&sample))
}
