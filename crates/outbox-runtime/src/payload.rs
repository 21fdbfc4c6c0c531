//! `[payload]` and what happens to each event's payload on its way to a sink
//! (docs/payloads.md): checked against its JSON Schema ([`crate::schemas`]), encrypted,
//! then offloaded to a claim-check store when too large ([`outbox_payload`]).
//!
//! `schemas` is global; `claim_check` and `encryption` may be set in `[payload]` for every
//! sink, or in a `[sink]` / `[sinks.NAME]` for that sink only (its key replaces the global
//! one). The stage wraps the built sink: an event refused by a step (a schema mismatch, a
//! payload that still does not fit) gets its own `Rejected` delivery, the others are
//! published in their order; a store or key service that cannot be reached fails the whole
//! batch as `Unavailable`, so nothing is published and nothing dead-lettered.

use std::path::PathBuf;
use std::sync::Arc;

use futures::future::join_all;
use outbox_core::sink::{BoxFuture, Delivery};
use outbox_core::{DynSink, Event, SinkError, SinkErrorKind};
use outbox_payload::claim_check::ClaimCheckConfig;
use outbox_payload::encryption::EncryptionConfig;
use outbox_payload::{Encoder, PayloadOptions};
use serde::{Deserialize, Serialize};

use crate::registry::SinkConfig;
use outbox_payload::schemas::Schemas;

/// `[payload]`: what the relay does with payloads before publishing them, for every sink.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct PayloadConfig {
    /// A directory of JSON Schema files named by event type (`order.placed.json`), then
    /// aggregate type (`Order.json`), then `default.json`. Unset: no validation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schemas: Option<PathBuf>,
    /// Large payloads to a store, a reference on the broker, for every sink without its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_check: Option<ClaimCheckConfig>,
    /// Payloads (or some JSON fields) encrypted, for every sink without its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionConfig>,
}

impl PayloadConfig {
    /// The claim-check and encryption options every sink inherits.
    pub fn options(&self) -> PayloadOptions {
        PayloadOptions {
            claim_check: self.claim_check.clone(),
            encryption: self.encryption.clone(),
        }
    }

    /// Checks the global options against `sink`, which inherits them (the limit of each sink
    /// decides whether `above` is required); the error names the key.
    pub(crate) fn validate_for(&self, sink: &SinkConfig, name: &str) -> Result<(), String> {
        let inherited = PayloadOptions {
            claim_check: self
                .claim_check
                .clone()
                .filter(|_| sink.claim_check.is_none()),
            encryption: self
                .encryption
                .clone()
                .filter(|_| sink.encryption.is_none()),
        };
        inherited.validate(sink.message_limit()).map_err(|e| {
            format!(
                "payload.{e} (inherited by {name}, kind = \"{}\")",
                sink.kind()
            )
        })
    }
}

/// What one sink's events go through before it publishes them.
#[derive(Clone, Default)]
pub struct PayloadStage {
    schemas: Option<Arc<Schemas>>,
    encoder: Option<Arc<Encoder>>,
}

impl PayloadStage {
    /// The stage of `sink`: the global `schemas`, then its claim-check and encryption (its own
    /// or `[payload]`'s). No request is made.
    pub async fn for_sink(
        sink: &SinkConfig,
        global: &PayloadConfig,
        schemas: Option<Arc<Schemas>>,
    ) -> Result<Self, SinkError> {
        let options = sink.payload(&global.options());
        let encoder = Encoder::connect(&options, sink.message_limit())
            .await?
            .map(Arc::new);
        Ok(Self { schemas, encoder })
    }

    /// True when events pass unchanged and unchecked.
    pub fn is_empty(&self) -> bool {
        self.schemas.is_none() && self.encoder.is_none()
    }

    /// The claim-check and encryption part, when on (for `doctor` and `migrate`).
    pub fn encoder(&self) -> Option<&Encoder> {
        self.encoder.as_deref()
    }

    /// `event` as the sink must publish it, or why not.
    async fn prepare(&self, event: &Event) -> Result<Option<Event>, SinkError> {
        if let Some(schemas) = &self.schemas {
            schemas.check(event)?;
        }
        match &self.encoder {
            Some(encoder) => encoder.encode(event).await.map(Some),
            None => Ok(None),
        }
    }

    /// `sink` behind this stage, or `sink` itself when the stage does nothing.
    pub fn wrap(self, sink: Box<dyn DynSink>) -> Box<dyn DynSink> {
        if self.is_empty() {
            sink
        } else {
            Box::new(Staged {
                inner: sink,
                stage: self,
            })
        }
    }
}

/// A sink behind a [`PayloadStage`].
struct Staged {
    inner: Box<dyn DynSink>,
    stage: PayloadStage,
}

impl DynSink for Staged {
    fn dyn_name(&self) -> &'static str {
        self.inner.dyn_name()
    }

    fn dyn_publish<'a>(
        &'a self,
        batch: &'a [Event],
    ) -> BoxFuture<'a, Result<Vec<Delivery>, SinkError>> {
        Box::pin(async move {
            // Each event's store write or data key runs concurrently with the others'.
            let prepared = join_all(batch.iter().map(|event| self.stage.prepare(event))).await;
            if let Some(Err(e)) = prepared
                .iter()
                .find(|p| matches!(p, Err(e) if e.kind() == SinkErrorKind::Unavailable))
            {
                return Err(e.clone());
            }
            if prepared.iter().all(|p| matches!(p, Ok(None))) {
                // Nothing changed (schemas only, all valid): the batch as it came.
                return self.inner.dyn_publish(batch).await;
            }
            let mut outgoing = Vec::with_capacity(batch.len());
            let mut refused = Vec::with_capacity(batch.len());
            for (event, prepared) in batch.iter().zip(prepared) {
                match prepared {
                    Ok(changed) => {
                        outgoing.push(changed.unwrap_or_else(|| event.clone()));
                        refused.push(None);
                    }
                    Err(e) => refused.push(Some(e)),
                }
            }
            let mut published = if outgoing.is_empty() {
                Vec::new()
            } else {
                self.inner.dyn_publish(&outgoing).await?
            }
            .into_iter();
            Ok(refused
                .into_iter()
                .map(|r| match r {
                    Some(error) => Err(error),
                    None => published.next().unwrap_or_else(|| {
                        Err(SinkError::transient(
                            "the sink returned fewer deliveries than events",
                        ))
                    }),
                })
                .collect())
        })
    }

    fn dyn_healthcheck(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        self.inner.dyn_healthcheck()
    }
}

#[cfg(test)]
mod tests {
    use crate::Config;

    fn nats(extra: &str) -> String {
        format!("[sink]\nkind = \"nats\"\nurl = \"nats://127.0.0.1:4222\"\n{extra}\n")
    }

    /// `claim_check` and `encryption` sit in the `[sink]` table beside the broker's keys, and
    /// the broker's own type still refuses a key it does not know, naming it.
    #[test]
    fn payload_keys_sit_beside_the_broker_keys_and_unknown_keys_are_still_refused() {
        let config = Config::from_toml(&nats(
            "claim_check = { store = \"file:///tmp/outbox-claims\", above = \"64KiB\" }",
        ))
        .expect("valid");
        assert_eq!(config.sink.kind(), "nats");
        let claim = config.sink.claim_check.as_ref().expect("claim_check read");
        assert_eq!(claim.store, "file:///tmp/outbox-claims");
        assert_eq!(claim.above.map(|a| a.0), Some(64 * 1024));
        assert_eq!(config.sink.message_limit(), Some(1024 * 1024));

        let e = Config::from_toml(&nats("bogus = 1"))
            .expect_err("unknown key")
            .to_string();
        assert!(
            e.contains("sink.bogus") || e.contains("unknown key `bogus`"),
            "{e}"
        );

        let e = Config::from_toml(&nats(
            "claim_check = { store = \"file:///tmp/x\", above = \"lots\" }",
        ))
        .expect_err("bad size")
        .to_string();
        assert!(e.contains("`lots` is not a size"), "{e}");
        assert!(
            e.contains("sink.claim_check"),
            "the error names the key: {e}"
        );

        let e = Config::from_toml(&nats(
            "claim_check = { store = \"file:///tmp/x\", colour = 1 }",
        ))
        .expect_err("unknown payload key")
        .to_string();
        assert!(e.contains("colour"), "{e}");
    }

    /// `[payload]`'s options reach every sink without its own; a sink's own key replaces the
    /// global one, and the printed config reads back the same.
    #[test]
    fn a_sink_inherits_the_global_options_unless_it_sets_its_own() {
        let text = format!(
            "{}\n[payload]\nclaim_check = {{ store = \"file:///tmp/global\", above = \"100KiB\" }}\n",
            nats("claim_check = { store = \"file:///tmp/own\", above = \"10KiB\" }")
        );
        let config = Config::from_toml(&text).expect("valid");
        let options = config.sink.payload(&config.payload.options());
        assert_eq!(
            options.claim_check.as_ref().map(|c| c.store.as_str()),
            Some("file:///tmp/own")
        );
        let config = Config::from_toml(&format!(
            "{}\n[payload]\nclaim_check = {{ store = \"file:///tmp/global\", above = \"100KiB\" }}\n",
            nats("")
        ))
        .expect("valid");
        let options = config.sink.payload(&config.payload.options());
        assert_eq!(
            options.claim_check.as_ref().map(|c| c.store.as_str()),
            Some("file:///tmp/global")
        );
        let printed = config.to_redacted_toml().expect("printable");
        let again = Config::from_toml(&printed).expect("the printed config reads back");
        assert_eq!(again.payload, config.payload);
    }

    /// A sink with no message limit of its own (HTTP) cannot default `above`: the inherited
    /// option is refused at load, naming the key and the sink.
    #[test]
    fn an_inherited_claim_check_without_above_is_refused_for_a_sink_without_a_limit() {
        let text = "[sink]\nkind = \"http\"\nurl = \"http://127.0.0.1:9/hook\"\n\n[payload]\nclaim_check = { store = \"file:///tmp/x\" }\n";
        let e = Config::from_toml(text).expect_err("no limit").to_string();
        assert!(e.contains("payload.claim_check.above"), "{e}");
        assert!(e.contains("kind = \"http\""), "{e}");
    }
}
