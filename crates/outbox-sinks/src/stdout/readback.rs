//! `outbox verify` for the file sink: the file is read from its start, line by line. Each
//! line (plain or a CloudEvents envelope) gives the event's id, aggregate and
//! `aggregate_seq`, and its `created_at` (or `time`) stands for when it was stored. The file
//! is one lane, in the order the relay appended it.

use std::path::PathBuf;

use outbox_core::Destination;
use outbox_core::verify::{Identity, Lane, ReadBackError, ReadMessage, ReadOutcome};
use serde::Deserialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::fs::File;
use tokio::io::{AsyncBufReadExt, BufReader};
use uuid::Uuid;

use super::FileConfig;
use crate::read_back::Read;

/// Reads a file sink's file back.
#[derive(Debug, Clone)]
pub struct FileReadBack {
    path: PathBuf,
    destination: Destination,
}

/// Checks the file exists and is readable.
pub(super) async fn read_back(config: &FileConfig) -> Result<FileReadBack, ReadBackError> {
    config
        .validate()
        .map_err(|e| ReadBackError::refused(e.to_string()))?;
    if let Err(e) = File::open(&config.path).await {
        return Err(ReadBackError::refused(format!(
            "cannot read `{}` (sink.path): {e}",
            config.path.display()
        )));
    }
    Ok(FileReadBack {
        path: config.path.clone(),
        destination: config.destination.clone(),
    })
}

/// The fields of a line that identify its event: the plain line's and a CloudEvents
/// envelope's (the payload and the other fields are skipped, not parsed into values).
#[derive(Deserialize)]
struct Line {
    id: Option<String>,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    headers: Option<Headers>,
    created_at: Option<String>,
    // CloudEvents structured mode.
    subject: Option<String>,
    aggregatetype: Option<String>,
    aggregateseq: Option<serde_json::Value>,
    time: Option<String>,
}

#[derive(Deserialize)]
struct Headers {
    aggregate_seq: Option<String>,
}

impl Line {
    fn identity(self) -> (Identity, Option<OffsetDateTime>) {
        let seq = self
            .headers
            .and_then(|h| h.aggregate_seq)
            .or_else(|| match self.aggregateseq {
                Some(serde_json::Value::String(s)) => Some(s),
                Some(serde_json::Value::Number(n)) => Some(n.to_string()),
                _ => None,
            })
            .and_then(|s| outbox_core::aggregate_seq::parse(&s));
        let at = self
            .created_at
            .or(self.time)
            .and_then(|t| OffsetDateTime::parse(&t, &Rfc3339).ok());
        (
            Identity {
                id: self.id.and_then(|id| Uuid::parse_str(&id).ok()),
                aggregate_type: self.aggregate_type.or(self.aggregatetype),
                aggregate_id: self.aggregate_id.or(self.subject),
                aggregate_seq: seq,
            },
            at,
        )
    }
}

/// How often (in lines) the progress is reported.
const PROGRESS_EVERY: u64 = 10_000;

impl FileReadBack {
    async fn read_all(&self, call: Read<'_>) -> Result<ReadOutcome, ReadBackError> {
        let file = File::open(&self.path).await.map_err(|e| {
            ReadBackError::refused(format!("cannot read `{}`: {e}", self.path.display()))
        })?;
        let mut reader = BufReader::with_capacity(1 << 20, file);
        let mut out = ReadOutcome::default();
        let (mut line_no, mut unreadable) = (0_u64, 0_u64);
        let mut buf = Vec::with_capacity(4096);
        loop {
            buf.clear();
            let n = reader.read_until(b'\n', &mut buf).await.map_err(|e| {
                ReadBackError::failed(format!("reading `{}`: {e}", self.path.display()))
            })?;
            if n == 0 {
                break;
            }
            line_no += 1;
            if line_no.is_multiple_of(PROGRESS_EVERY) {
                call.progress.advance(line_no, None);
            }
            let text = buf.trim_ascii();
            if text.is_empty() {
                continue;
            }
            let Ok(line) = serde_json::from_slice::<Line>(text) else {
                unreadable += 1;
                continue;
            };
            let (identity, at) = line.identity();
            if at.is_some_and(|t| t < call.since) {
                continue;
            }
            out.messages.push(ReadMessage {
                identity,
                lane: 0,
                offset: line_no,
                stored_at: at,
            });
        }
        call.progress.advance(line_no, Some(line_no));
        out.lanes.push(Lane {
            name: format!("file `{}`", self.path.display()),
            messages: out.messages.len() as u64,
        });
        if unreadable > 0 {
            out.notes.push(format!(
                "{unreadable} line(s) of `{}` are not JSON objects (a half-written line, or written by something else); they are not counted",
                self.path.display()
            ));
        }
        Ok(out)
    }
}

crate::read_back::impl_read_back!(
    FileReadBack,
    describe: |r| format!("file `{}`", r.path.display()),
    destination: destination,
);
