//! `[payload] schemas`: JSON payloads validated against JSON Schema files before they are
//! published (docs/payloads.md), by the relay and, opt-in, by the producer before it writes
//! the event ([`Schemas::check_new`]).
//!
//! The directory's `*.json` files are read and compiled once, when the relay starts; a file
//! that is not JSON or not a valid schema stops the start, naming the file. Each event is
//! checked against the first schema that exists of:
//!
//! 1. `<event_type>.json` (`order.placed.json` for `event_type = "order.placed"`),
//! 2. `<aggregate_type>.json` (`Order.json`),
//! 3. `default.json`;
//!
//! an event with none of them passes unvalidated, and so does the relay's canary probe. An
//! event that does not match its schema, or whose payload is not JSON, is refused
//! ([`SinkErrorKind::Rejected`](outbox_core::SinkErrorKind::Rejected): dead-lettered at
//! once, never retried) with the failing JSON pointer and rule as the reason
//! (`/total_cents: -5 is less than the minimum of 0`); the other events of the batch go on to
//! the sink. No `$ref` outside the schema's own document is resolved: jsonschema is built
//! without its HTTP and file resolvers, so such a schema is refused at start.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use outbox_core::{Event, NewEvent, SinkError};

/// At most this many failures are named in one reason; the rest are counted.
const ERRORS_NAMED: usize = 5;

/// One compiled schema and the file it came from.
#[derive(Debug)]
struct Schema {
    file: String,
    validator: jsonschema::Validator,
}

/// The compiled schemas of a `[payload] schemas` directory, by file stem.
#[derive(Debug)]
pub struct Schemas {
    dir: PathBuf,
    by_name: HashMap<String, Schema>,
}

/// A schema file that cannot be used, for the start-up error and `outbox doctor`.
#[derive(Debug, thiserror::Error)]
#[error("payload.schemas: {}: {reason}", path.display())]
pub struct SchemaError {
    /// The file (or the directory, when it cannot be read).
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

impl Schemas {
    /// Reads and compiles every `*.json` file of `dir` (other files and subdirectories are
    /// left alone). Every broken file is returned, each naming itself.
    pub fn load(dir: &Path) -> Result<Self, Vec<SchemaError>> {
        let entries = std::fs::read_dir(dir).map_err(|e| {
            vec![SchemaError {
                path: dir.to_owned(),
                reason: format!("cannot read the schema directory: {e}"),
            }]
        })?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        let mut by_name = HashMap::with_capacity(paths.len());
        let mut errors = Vec::new();
        for path in paths {
            let (Some(stem), Some(file)) = (
                path.file_stem().and_then(|s| s.to_str()),
                path.file_name().and_then(|s| s.to_str()),
            ) else {
                errors.push(SchemaError {
                    path: path.clone(),
                    reason: "the file name is not UTF-8".into(),
                });
                continue;
            };
            match compile(&path) {
                Ok(validator) => {
                    by_name.insert(
                        stem.to_owned(),
                        Schema {
                            file: file.to_owned(),
                            validator,
                        },
                    );
                }
                Err(reason) => errors.push(SchemaError { path, reason }),
            }
        }
        if errors.is_empty() {
            Ok(Self {
                dir: dir.to_owned(),
                by_name,
            })
        } else {
            Err(errors)
        }
    }

    /// The directory they were read from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The schema files, sorted.
    pub fn files(&self) -> Vec<&str> {
        let mut files: Vec<&str> = self.by_name.values().map(|s| s.file.as_str()).collect();
        files.sort_unstable();
        files
    }

    /// The file that applies to an event of this type and aggregate type (see the module
    /// documentation), if any.
    pub fn file_for(&self, event_type: &str, aggregate_type: &str) -> Option<&str> {
        self.schema_for(event_type, aggregate_type)
            .map(|s| s.file.as_str())
    }

    fn schema_for(&self, event_type: &str, aggregate_type: &str) -> Option<&Schema> {
        self.by_name
            .get(event_type)
            .or_else(|| self.by_name.get(aggregate_type))
            .or_else(|| self.by_name.get("default"))
    }

    /// Checks one event the relay is about to publish: `Err` (rejected, with the reason)
    /// when its payload is not JSON or does not match its schema. The relay's canary probes
    /// pass unchecked.
    pub fn check(&self, event: &Event) -> Result<(), SinkError> {
        if event.aggregate_type == outbox_core::canary::AGGREGATE_TYPE {
            return Ok(());
        }
        self.check_payload(&event.event_type, &event.aggregate_type, &event.payload)
            .map_err(SinkError::rejected)
    }

    /// Checks an event before the producer writes it (opt-in, docs/payloads.md "In the
    /// producer"): the same files, the same rules and the same reason as the relay's check,
    /// so a payload refused here would have been dead-lettered there.
    pub fn check_new(&self, event: &NewEvent) -> Result<(), SchemaViolation> {
        self.check_payload(&event.event_type, &event.aggregate_type, &event.payload)
            .map_err(SchemaViolation)
    }

    /// The check itself: `Err` with the reason naming the schema file, then each failure as
    /// its JSON pointer and rule (at most five).
    pub fn check_payload(
        &self,
        event_type: &str,
        aggregate_type: &str,
        payload: &[u8],
    ) -> Result<(), String> {
        let Some(schema) = self.schema_for(event_type, aggregate_type) else {
            return Ok(());
        };
        let instance: serde_json::Value = serde_json::from_slice(payload).map_err(|e| {
            format!(
                "payload is not JSON, and schema {} applies to it: {e}",
                schema.file
            )
        })?;
        let mut errors = schema.validator.iter_errors(&instance);
        let Some(first) = errors.next() else {
            return Ok(());
        };
        let mut reason = format!("payload does not match schema {}: ", schema.file);
        push_error(&mut reason, &first);
        let mut more = 0usize;
        for (i, error) in errors.enumerate() {
            if i + 1 < ERRORS_NAMED {
                reason.push_str("; ");
                push_error(&mut reason, &error);
            } else {
                more += 1;
            }
        }
        if more > 0 {
            reason.push_str(&format!("; and {more} more"));
        }
        Err(reason)
    }
}

/// Why the producer's check refused an event: the reason, as the relay would have given it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SchemaViolation(pub String);

/// `/total_cents: -5 is less than the minimum of 0` (`/` for the payload as a whole).
fn push_error(out: &mut String, error: &jsonschema::ValidationError<'_>) {
    use std::fmt::Write as _;
    let path = error.instance_path().as_str();
    let path = if path.is_empty() { "/" } else { path };
    let _ = write!(out, "{path}: {error}");
}

fn compile(path: &Path) -> Result<jsonschema::Validator, String> {
    let text = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
    let schema: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| format!("not JSON: {e}"))?;
    jsonschema::validator_for(&schema).map_err(|e| {
        let at = e.instance_path().as_str();
        if at.is_empty() {
            format!("not a valid JSON Schema: {e}")
        } else {
            format!("not a valid JSON Schema: at {at}: {e}")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::Schemas;

    fn event(event_type: &str, aggregate_type: &str, payload: &str) -> outbox_core::Event {
        outbox_core::Event {
            id: uuid::Uuid::now_v7(),
            position: outbox_core::Position(1),
            aggregate_type: aggregate_type.into(),
            aggregate_id: "a1".into(),
            event_type: event_type.into(),
            payload: payload.as_bytes().to_vec().into(),
            headers: Vec::new(),
            created_at: time::OffsetDateTime::now_utc(),
            attempts: 0,
        }
    }

    fn dir(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("write");
        }
        dir
    }

    const MIN_ZERO: &str = r#"{"type":"object","properties":{"total_cents":{"type":"integer","minimum":0}},"required":["total_cents"]}"#;

    /// The event type's file first, then the aggregate type's, then `default.json`; none of
    /// them: no schema.
    #[test]
    fn the_schema_is_found_by_event_type_then_aggregate_type_then_default() {
        let with_default = dir(&[
            ("order.placed.json", "{}"),
            ("Order.json", "{}"),
            ("default.json", "{}"),
            ("README.md", "not a schema: ignored"),
        ]);
        let schemas = Schemas::load(with_default.path()).expect("valid");
        assert_eq!(
            schemas.files(),
            ["Order.json", "default.json", "order.placed.json"]
        );
        assert_eq!(
            schemas.file_for("order.placed", "Order"),
            Some("order.placed.json")
        );
        assert_eq!(schemas.file_for("order.paid", "Order"), Some("Order.json"));
        assert_eq!(
            schemas.file_for("invoice.sent", "Invoice"),
            Some("default.json")
        );
        let without_default = dir(&[("order.placed.json", "{}"), ("Order.json", "{}")]);
        let schemas = Schemas::load(without_default.path()).expect("valid");
        assert_eq!(schemas.file_for("invoice.sent", "Invoice"), None);
        assert_eq!(schemas.file_for("order.paid", "Order"), Some("Order.json"));
    }

    #[test]
    fn an_invalid_payload_is_rejected_with_the_pointer_and_the_rule() {
        let d = dir(&[("order.placed.json", MIN_ZERO)]);
        let schemas = Schemas::load(d.path()).expect("valid");
        assert!(
            schemas
                .check(&event("order.placed", "Order", r#"{"total_cents":5}"#))
                .is_ok()
        );
        let e = schemas
            .check(&event("order.placed", "Order", r#"{"total_cents":-5}"#))
            .expect_err("invalid");
        assert_eq!(e.kind(), outbox_core::SinkErrorKind::Rejected);
        assert!(
            e.report()
                .contains("/total_cents: -5 is less than the minimum of 0"),
            "{}",
            e.report()
        );
        assert!(e.report().contains("order.placed.json"), "{}", e.report());
        let e = schemas
            .check(&event("order.placed", "Order", "{}"))
            .expect_err("missing");
        assert!(
            e.report()
                .contains("/: \"total_cents\" is a required property"),
            "{}",
            e.report()
        );
        let e = schemas
            .check(&event("order.placed", "Order", "not json"))
            .expect_err("not json");
        assert!(
            e.report().starts_with("payload is not JSON"),
            "{}",
            e.report()
        );
        // `format` is an annotation only (2020-12, the default draft).
        let d = dir(&[("user.created.json", r#"{"type":"string","format":"email"}"#)]);
        let formats = Schemas::load(d.path()).expect("valid");
        assert!(
            formats
                .check(&event("user.created", "User", r#""not an email""#))
                .is_ok()
        );
        // No schema for this type, no default: anything passes, JSON or not.
        assert!(
            schemas
                .check(&event("order.paid", "Order", "not json"))
                .is_ok()
        );
    }

    /// Every broken file is named: not JSON, not a schema, a `$ref` to another file.
    #[test]
    fn broken_schema_files_are_named() {
        let d = dir(&[
            ("good.json", MIN_ZERO),
            ("bad-json.json", "{\"type\":"),
            ("bad-schema.json", r#"{"type": 12}"#),
            (
                "remote.json",
                r#"{"$ref": "https://example.invalid/s.json"}"#,
            ),
        ]);
        let errors = Schemas::load(d.path()).expect_err("broken");
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 3, "{text:?}");
        assert!(
            text[0].contains("bad-json.json") && text[0].contains("not JSON"),
            "{text:?}"
        );
        assert!(
            text[1].contains("bad-schema.json") && text[1].contains("not a valid JSON Schema"),
            "{text:?}"
        );
        assert!(text[2].contains("remote.json"), "{text:?}");
    }

    /// The validation cost per event (docs/benchmarks.md, "Schema validation"):
    /// `cargo test --release -p outbox-payload --no-default-features --features schemas --lib schemas::tests::validation_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a benchmark: run it in release, see the doc comment"]
    fn validation_cost() {
        const ORDER: &str = r#"{
            "type": "object",
            "required": ["order_id", "customer_id", "total_cents", "currency", "lines"],
            "properties": {
                "order_id": {"type": "string", "pattern": "^o_[0-9a-z]+$"},
                "customer_id": {"type": "string", "minLength": 1},
                "total_cents": {"type": "integer", "minimum": 0},
                "currency": {"enum": ["EUR", "USD", "GBP"]},
                "lines": {"type": "array", "minItems": 1, "items": {
                    "type": "object",
                    "required": ["sku", "quantity", "price_cents"],
                    "properties": {
                        "sku": {"type": "string"},
                        "quantity": {"type": "integer", "minimum": 1},
                        "price_cents": {"type": "integer", "minimum": 0}
                    }
                }}
            }
        }"#;
        let payload = r#"{"order_id":"o_91f2","customer_id":"c_17","total_cents":4250,"currency":"EUR","lines":[{"sku":"A-1","quantity":2,"price_cents":1250},{"sku":"B-7","quantity":1,"price_cents":1750}]}"#;
        let d = dir(&[("order.placed.json", ORDER), ("default.json", "{}")]);
        let schemas = Schemas::load(d.path()).expect("valid");
        let events: Vec<outbox_core::Event> = (0..1000)
            .map(|_| event("order.placed", "Order", payload))
            .collect();
        let rounds = 200;
        // The payload parsed only (what validation cannot avoid), then parsed and validated.
        let parse = |e: &outbox_core::Event| {
            serde_json::from_slice::<serde_json::Value>(&e.payload).is_ok()
        };
        let check = |e: &outbox_core::Event| schemas.check(e).is_ok();
        type Run<'a> = &'a dyn Fn(&outbox_core::Event) -> bool;
        let cases: [(&str, Run<'_>); 2] = [("parse only", &parse), ("parse + validate", &check)];
        for (label, run) in cases {
            let start = std::time::Instant::now();
            for _ in 0..rounds {
                for e in &events {
                    assert!(run(std::hint::black_box(e)));
                }
            }
            let elapsed = start.elapsed();
            let n = (rounds * events.len()) as f64;
            println!(
                "{label}: {:.0} events/s, {:.2} µs/event ({} B payload)",
                n / elapsed.as_secs_f64(),
                elapsed.as_secs_f64() * 1e6 / n,
                payload.len()
            );
        }
    }
}
