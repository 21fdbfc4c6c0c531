//! Stdout and JSON-lines file sinks (feature `stdout`).
//!
//! Both write one JSON object per event, one per line (`\n`-terminated, UTF-8), in batch
//! order. The keys always come in this order:
//!
//! ```json
//! {"id":"0190f3c2-7d1e-7a4b-9c61-3f5e0b2a8d10","destination":"outbox.event.Order","key":"o_91f2","event_type":"order.placed","aggregate_type":"Order","aggregate_id":"o_91f2","headers":{"id":"0190f3c2-7d1e-7a4b-9c61-3f5e0b2a8d10","event_type":"order.placed","aggregate_type":"Order","aggregate_id":"o_91f2","tenant":"acme"},"created_at":"2026-11-22T10:15:30.123456Z","payload":{"order_id":"o_91f2","total_cents":1250}}
//! ```
//!
//! | key | value |
//! | --- | --- |
//! | `id` | the event id (lowercase hyphenated UUID), the consumer's deduplication key |
//! | `destination` | the `destination` template rendered for the event |
//! | `key` | the message key: `aggregate_id` |
//! | `event_type`, `aggregate_type`, `aggregate_id` | as stored |
//! | `headers` | an object of string values: the message headers exactly as other sinks send them (the four contract headers, then the row's own; if a row repeats a name, the first value is kept) |
//! | `created_at` | when the producer wrote the event, RFC 3339 in UTC |
//! | `payload` | present when the payload is a JSON text: that text itself, embedded as a JSON value (its line breaks, which JSON only allows between tokens, become spaces; surrounding whitespace is dropped) |
//! | `payload_base64` | present instead when the payload is not JSON (binary, empty, invalid UTF-8): the exact bytes, standard base64 with padding |
//!
//! With `format = "cloudevents-structured"` each line is instead the event's CloudEvents JSON
//! envelope ([`outbox_core::cloudevents`]; line breaks inside an embedded JSON `data` become
//! spaces, as above).
//!
//! Exactly one of `payload` and `payload_base64` is present. [`JsonLine`] parses a line
//! back, and [`JsonLine::payload_bytes`] returns the payload bytes.
//!
//! `stdout` writes a whole batch with one locked write and a flush; `file` appends it with
//! one write and (with `sync = true`) an `fsync`, and truncates a half-written batch away on
//! failure. A batch is reported delivered only after that succeeded; a failed write fails
//! the whole batch as [`Unavailable`](outbox_core::SinkErrorKind::Unavailable).

mod config;
mod readback;
mod scratch;

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use outbox_core::cloudevents::MessageFormat;
use outbox_core::sink::Delivery;
use outbox_core::{Destination, Event, Sink, SinkError};

mod line;

use crate::json_lines::{render_envelope, render_line};
pub use config::{FileConfig, StdoutConfig};
pub use line::{JsonLine, PayloadError};
pub use readback::FileReadBack;

/// Renders a batch; an event that cannot be encoded fails alone, the others still go out.
fn render(
    destination: &Destination,
    format: &MessageFormat,
    batch: &[Event],
) -> (Vec<u8>, Vec<Delivery>) {
    let mut out = Vec::with_capacity(batch.len() * 256);
    let deliveries = batch
        .iter()
        .map(|event| {
            if format.is_plain() {
                render_line(&destination.render(event), event, &mut out)
            } else {
                render_envelope(format, event, &mut out)
            }
        })
        .collect();
    (out, deliveries)
}

/// Runs blocking file or terminal I/O off the async threads.
async fn blocking_io(
    what: String,
    job: impl FnOnce() -> io::Result<()> + Send + 'static,
) -> Result<(), SinkError> {
    match tokio::task::spawn_blocking(job).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(SinkError::unavailable(what).with_source(e)),
        Err(e) => Err(SinkError::unavailable(what).with_source(e)),
    }
}

/// Writes events as JSON lines to standard output; built from a [`StdoutConfig`].
#[derive(Debug)]
pub struct StdoutSink {
    destination: Destination,
    format: MessageFormat,
}

impl StdoutSink {
    /// A sink rendering the `destination` field with `destination`.
    pub fn new(destination: Destination) -> Self {
        Self {
            destination,
            format: MessageFormat::Plain,
        }
    }

    /// The same sink writing lines in `format` (plain or CloudEvents structured).
    pub fn with_format(self, format: MessageFormat) -> Self {
        Self { format, ..self }
    }
}

impl Sink for StdoutSink {
    fn name(&self) -> &'static str {
        "stdout"
    }

    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        let (out, deliveries) = render(&self.destination, &self.format, batch);
        if !out.is_empty() {
            blocking_io("writing to standard output failed".to_owned(), move || {
                let mut stdout = io::stdout().lock();
                stdout.write_all(&out)?;
                stdout.flush()
            })
            .await?;
        }
        Ok(deliveries)
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        Ok(())
    }
}

/// Appends events as JSON lines to a file; built from a [`FileConfig`].
#[derive(Debug)]
pub struct FileSink {
    destination: Destination,
    format: MessageFormat,
    path: PathBuf,
    sync: bool,
    /// False for a device or a pipe (`/dev/null`): no fsync, no truncation after a failure.
    regular: bool,
    file: Arc<Mutex<File>>,
}

impl FileSink {
    async fn open(config: FileConfig) -> Result<Self, SinkError> {
        let path = config.path.clone();
        let opened = tokio::task::spawn_blocking(move || {
            OpenOptions::new().create(true).append(true).open(&path)
        })
        .await
        .map_err(|e| SinkError::unavailable("opening the output file failed").with_source(e))?;
        let file = opened.map_err(|e| open_error(&config.path, e))?;
        let format = crate::cloudevents::message_format(
            config.format,
            &config.cloudevents_source,
            &config.cloudevents_content_type,
        )
        .map_err(|e| SinkError::rejected(e.to_string()))?;
        let regular = file
            .metadata()
            .map_err(|e| open_error(&config.path, e))?
            .is_file();
        Ok(Self {
            destination: config.destination,
            format,
            path: config.path,
            sync: config.sync,
            regular,
            file: Arc::new(Mutex::new(file)),
        })
    }

    /// The file being appended to.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn open_error(path: &Path, e: io::Error) -> SinkError {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    let message = match parent {
        Some(dir) if e.kind() == io::ErrorKind::NotFound && !dir.exists() => format!(
            "cannot open `{}` for appending: directory `{}` does not exist",
            path.display(),
            dir.display()
        ),
        _ => format!("cannot open `{}` for appending", path.display()),
    };
    SinkError::rejected(message).with_source(e)
}

impl Sink for FileSink {
    fn name(&self) -> &'static str {
        "file"
    }

    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        let (out, deliveries) = render(&self.destination, &self.format, batch);
        if out.is_empty() {
            return Ok(deliveries);
        }
        let file = Arc::clone(&self.file);
        let (sync, regular) = (self.sync && self.regular, self.regular);
        blocking_io(
            format!("appending to `{}` failed", self.path.display()),
            move || {
                let file = file.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                let mut handle: &File = &file;
                let before = if regular { handle.metadata()?.len() } else { 0 };
                let written = handle
                    .write_all(&out)
                    .and_then(|()| if sync { handle.sync_data() } else { Ok(()) });
                if let Err(e) = written {
                    // Best effort: leave no half line behind for readers; the batch is retried.
                    if regular {
                        let _ = handle.set_len(before);
                    }
                    return Err(e);
                }
                Ok(())
            },
        )
        .await?;
        Ok(deliveries)
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        match tokio::fs::metadata(&self.path).await {
            // A regular file, or a device or pipe such as /dev/null.
            Ok(meta) if !meta.is_dir() => Ok(()),
            Ok(_) => Err(SinkError::unavailable(format!(
                "`{}` is a directory",
                self.path.display()
            ))),
            Err(e) => Err(SinkError::unavailable(format!(
                "`{}` is gone (moved or deleted while the relay runs; restart it to reopen the file)",
                self.path.display()
            ))
            .with_source(e)),
        }
    }
}

crate::build_sink!(StdoutConfig, "stdout", |config, event| format!(
    "stdout ({})",
    config.destination.render(event)
), destination: destination,
cannot_read_back: "standard output cannot be read back, so `outbox verify` cannot check it; with kind = \"file\" the events are kept in a file that it reads");

crate::build_sink!(
    FileConfig,
    "file",
    |config, event| format!("file ({})", config.destination.render(event)),
    destination: destination,
    check: check_file,
    read_back: readback::read_back,
    scratch: scratch::scratch,
    remove_scratch: scratch::remove_scratch
);

/// `outbox doctor`'s check: an existing file must open for appending; a missing one needs a
/// directory to be created in. Creates nothing.
async fn check_file(config: &FileConfig) -> Result<String, SinkError> {
    config
        .validate()
        .map_err(|e| SinkError::rejected(e.to_string()))?;
    let path = config.path.clone();
    let found = tokio::task::spawn_blocking(move || {
        if path.exists() {
            OpenOptions::new().append(true).open(&path).map(|_| true)
        } else {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
                _ => std::path::PathBuf::from("."),
            };
            std::fs::metadata(&dir).and_then(|m| {
                if m.is_dir() {
                    Ok(false)
                } else {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::NotADirectory,
                        format!("`{}` is not a directory", dir.display()),
                    ))
                }
            })
        }
    })
    .await
    .map_err(|e| SinkError::unavailable("checking the output file failed").with_source(e))?
    .map_err(|e| open_error(&config.path, e))?;
    Ok(if found {
        format!("file sink: `{}` opens for appending", config.path.display())
    } else {
        format!(
            "file sink: `{}` does not exist yet; the relay creates it",
            config.path.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use time::OffsetDateTime;
    use uuid::Uuid;

    use super::*;

    fn event(payload: &[u8]) -> Event {
        Event {
            id: Uuid::from_u128(0x0190_f3c2_7d1e_7a4b_9c61_3f5e_0b2a_8d10),
            position: outbox_core::Position(7),
            aggregate_type: "Order".into(),
            aggregate_id: "o_91f2".into(),
            event_type: "order.placed".into(),
            payload: bytes::Bytes::copy_from_slice(payload),
            headers: vec![
                ("tenant".into(), "acme".into()),
                ("tenant".into(), "other".into()),
            ],
            created_at: OffsetDateTime::from_unix_timestamp_nanos(1_795_342_530_123_456_000)
                .expect("valid"),
            attempts: 0,
        }
    }

    fn line_of(event: &Event) -> String {
        let (out, deliveries) = render(
            &Destination::default(),
            &MessageFormat::Plain,
            std::slice::from_ref(event),
        );
        assert!(deliveries.iter().all(Result::is_ok));
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn a_json_payload_is_embedded_as_is_and_keys_keep_their_order() {
        let line = line_of(&event(br#"{"order_id":"o_91f2","total_cents":1250}"#));
        assert_eq!(
            line,
            concat!(
                r#"{"id":"0190f3c2-7d1e-7a4b-9c61-3f5e0b2a8d10","destination":"outbox.event.Order","#,
                r#""key":"o_91f2","event_type":"order.placed","aggregate_type":"Order","aggregate_id":"o_91f2","#,
                r#""headers":{"id":"0190f3c2-7d1e-7a4b-9c61-3f5e0b2a8d10","event_type":"order.placed","#,
                r#""aggregate_type":"Order","aggregate_id":"o_91f2","tenant":"acme"},"#,
                r#""created_at":"2026-11-22T10:15:30.123456Z","payload":{"order_id":"o_91f2","total_cents":1250}}"#,
                "\n"
            )
        );
    }

    #[test]
    fn pretty_json_stays_on_one_line_with_the_same_value() {
        let pretty = b"{\n  \"a\": \"x\\ny\",\n  \"b\": [1,\r\n 2.50]\n}\n";
        let line = line_of(&event(pretty));
        assert_eq!(line.matches('\n').count(), 1);
        let parsed = JsonLine::parse(line.trim_end()).expect("parses");
        let original: serde_json::Value = serde_json::from_slice(pretty).expect("json");
        let back: serde_json::Value =
            serde_json::from_slice(&parsed.payload_bytes().expect("payload")).expect("json");
        assert_eq!(original, back);
        assert!(
            parsed.payload.expect("json").get().contains("2.50"),
            "number text kept"
        );
    }

    #[test]
    fn non_json_payloads_go_to_base64() {
        for payload in [
            &b"\x00\xff\xfe binary"[..],
            b"",
            b"not json",
            b"{\"a\":1} trailing",
        ] {
            let line = line_of(&event(payload));
            let parsed = JsonLine::parse(line.trim_end()).expect("parses");
            assert!(parsed.payload.is_none(), "{line}");
            assert_eq!(parsed.payload_bytes().expect("decodes"), payload);
        }
    }

    #[test]
    fn the_structured_format_writes_one_envelope_per_line() {
        use outbox_core::cloudevents::{DEFAULT_DATA_CONTENT_TYPE, DEFAULT_SOURCE, Format};
        let format = MessageFormat::new(
            Format::CloudeventsStructured,
            DEFAULT_SOURCE,
            DEFAULT_DATA_CONTENT_TYPE,
        )
        .expect("valid");
        let pretty = event(b"{\n  \"a\": \"x\\ny\"\r\n}\n");
        let (out, deliveries) = render(&Destination::default(), &format, &[pretty, event(b"\xff")]);
        assert!(deliveries.iter().all(Result::is_ok));
        let text = String::from_utf8(out).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        let first: serde_json::Value = serde_json::from_str(lines[0]).expect("JSON");
        assert_eq!(first["id"], "0190f3c2-7d1e-7a4b-9c61-3f5e0b2a8d10");
        assert_eq!(first["type"], "order.placed");
        assert_eq!(first["data"]["a"], "x\ny");
        assert_eq!(first["tenant"], "acme");
        let second: serde_json::Value = serde_json::from_str(lines[1]).expect("JSON");
        assert_eq!(second["data_base64"], "/w==");
    }

    #[test]
    fn scalar_json_payloads_are_embedded_too() {
        let line = line_of(&event(b"42"));
        assert!(line.contains(r#""payload":42}"#), "{line}");
        let line = line_of(&event(b"\"text\""));
        assert!(line.contains(r#""payload":"text"}"#), "{line}");
    }
}
