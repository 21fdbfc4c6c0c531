//! Large transactions in bounded memory, for the change-stream sources (PostgreSQL logical
//! replication, the MySQL binlog).
//!
//! A stream source may hand over a transaction's events only at its commit, so it buffers them
//! while the transaction is open. [`TxnBuffer`] keeps at most [`SpillSettings::after_events`]
//! events (or [`SpillSettings::after_bytes`] of them) in memory; past that it writes them, as one
//! *run*, to a scratch file, and goes on buffering. At the commit, [`TxnBuffer::take`] returns
//! either the events themselves ([`Buffered::Memory`], the common case) or a [`SpilledTxn`]
//! that reads them back in batches, in the order they were pushed (or, with an order function,
//! in that order: each run is sorted before it is written and the runs are merged, which gives
//! exactly what a stable sort of the whole transaction gives). The stream ledger
//! ([`crate::stream_ledger::Ledger::commit_spilled`]) loads those batches as room frees up.
//!
//! The scratch file is anonymous (`tempfile`: unlinked at once where the OS allows it, as on
//! Linux): it has no name on disk, and it is gone when the process ends, however it ends. It is
//! scratch only: after a crash the stream resumes from its confirmed position and sends the
//! transaction again.

use std::cmp;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::{Event, Position};

/// When an open transaction goes to disk, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpillSettings {
    /// Events of one open transaction kept in memory; at this many, they go to the scratch
    /// file (`source.spill_after_events`).
    pub after_events: usize,
    /// The same, as an estimate of their size in memory (`source.spill_after_bytes`).
    pub after_bytes: u64,
    /// Directory of the scratch files; `None`: the OS temporary directory (`source.spill_dir`).
    pub dir: Option<PathBuf>,
}

/// Default of `source.spill_after_events`.
pub const DEFAULT_AFTER_EVENTS: usize = 10_000;
/// Default of `source.spill_after_bytes` (32 MiB).
pub const DEFAULT_AFTER_BYTES: u64 = 32 << 20;

impl Default for SpillSettings {
    fn default() -> Self {
        Self {
            after_events: DEFAULT_AFTER_EVENTS,
            after_bytes: DEFAULT_AFTER_BYTES,
            dir: None,
        }
    }
}

impl SpillSettings {
    /// Checks the `source.spill_*` keys; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.after_events == 0 {
            return Err("source.spill_after_events: must be at least 1".into());
        }
        if self.after_bytes == 0 {
            return Err("source.spill_after_bytes: must be at least 1".into());
        }
        if let Some(dir) = &self.dir
            && !dir.is_dir()
        {
            return Err(format!(
                "source.spill_dir: `{}` is not a directory",
                dir.display()
            ));
        }
        Ok(())
    }

    fn dir_name(&self) -> String {
        self.dir
            .clone()
            .unwrap_or_else(std::env::temp_dir)
            .display()
            .to_string()
    }
}

/// What a stream source buffers, written to and read back from a scratch file.
pub trait Spillable: Sized {
    /// About how many bytes the value holds in memory (for [`SpillSettings::after_bytes`]).
    fn memory_size(&self) -> usize;
    /// Appends the value's bytes.
    fn encode(&self, out: &mut Vec<u8>);
    /// Reads a value written by [`Spillable::encode`] from the front of `input`.
    fn decode(input: &mut &[u8]) -> io::Result<Self>;
}

/// Appends `v` (little-endian).
pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends `bytes` with their length.
pub fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u64(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn corrupt(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("spill file: truncated or corrupt {what}"),
    )
}

fn take_array<const N: usize>(input: &mut &[u8]) -> io::Result<[u8; N]> {
    let (head, rest) = input
        .split_first_chunk::<N>()
        .ok_or_else(|| corrupt("record"))?;
    *input = rest;
    Ok(*head)
}

/// Reads a value written by [`put_u64`].
pub fn take_u64(input: &mut &[u8]) -> io::Result<u64> {
    take_array(input).map(u64::from_le_bytes)
}

/// Reads bytes written by [`put_bytes`].
pub fn take_bytes<'a>(input: &mut &'a [u8]) -> io::Result<&'a [u8]> {
    let len = usize::try_from(take_u64(input)?).map_err(|_| corrupt("length"))?;
    if input.len() < len {
        return Err(corrupt("field"));
    }
    let (bytes, rest) = input.split_at(len);
    *input = rest;
    Ok(bytes)
}

/// Reads text written by [`put_bytes`].
pub fn take_string(input: &mut &[u8]) -> io::Result<String> {
    String::from_utf8(take_bytes(input)?.to_vec()).map_err(|_| corrupt("text"))
}

impl Spillable for Event {
    fn memory_size(&self) -> usize {
        std::mem::size_of::<Event>()
            + self.aggregate_type.len()
            + self.aggregate_id.len()
            + self.event_type.len()
            + self.payload.len()
            + self
                .headers
                .iter()
                .map(|(k, v)| std::mem::size_of::<(String, String)>() + k.len() + v.len())
                .sum::<usize>()
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.id.as_bytes());
        put_u64(out, self.position.0 as u64);
        put_bytes(out, self.aggregate_type.as_bytes());
        put_bytes(out, self.aggregate_id.as_bytes());
        put_bytes(out, self.event_type.as_bytes());
        put_bytes(out, &self.payload);
        put_u64(out, self.headers.len() as u64);
        for (k, v) in &self.headers {
            put_bytes(out, k.as_bytes());
            put_bytes(out, v.as_bytes());
        }
        out.extend_from_slice(&self.created_at.unix_timestamp_nanos().to_le_bytes());
        put_u64(out, u64::from(self.attempts));
    }

    fn decode(input: &mut &[u8]) -> io::Result<Self> {
        let id = Uuid::from_bytes(take_array(input)?);
        let position = Position(take_u64(input)? as i64);
        let aggregate_type = take_string(input)?;
        let aggregate_id = take_string(input)?;
        let event_type = take_string(input)?;
        let payload = Bytes::copy_from_slice(take_bytes(input)?);
        let count = take_u64(input)?;
        let mut headers = Vec::with_capacity(usize::try_from(count).unwrap_or(0).min(64));
        for _ in 0..count {
            headers.push((take_string(input)?, take_string(input)?));
        }
        let nanos = i128::from_le_bytes(take_array(input)?);
        let created_at =
            OffsetDateTime::from_unix_timestamp_nanos(nanos).map_err(|_| corrupt("timestamp"))?;
        let attempts = u32::try_from(take_u64(input)?).map_err(|_| corrupt("attempts"))?;
        Ok(Event {
            id,
            position,
            aggregate_type,
            aggregate_id,
            event_type,
            payload,
            headers,
            created_at,
            attempts,
        })
    }
}

impl Spillable for () {
    fn memory_size(&self) -> usize {
        0
    }
    fn encode(&self, _out: &mut Vec<u8>) {}
    fn decode(_input: &mut &[u8]) -> io::Result<Self> {
        Ok(())
    }
}

impl<A: Spillable, B: Spillable> Spillable for (A, B) {
    fn memory_size(&self) -> usize {
        self.0.memory_size() + self.1.memory_size()
    }

    fn encode(&self, out: &mut Vec<u8>) {
        self.0.encode(out);
        self.1.encode(out);
    }

    fn decode(input: &mut &[u8]) -> io::Result<Self> {
        Ok((A::decode(input)?, B::decode(input)?))
    }
}

/// The order a source hands a transaction's events over in, when it is not the order they
/// arrived in (a stable sort).
pub type Order<T> = fn(&T, &T) -> cmp::Ordering;

/// A committed transaction's events, from [`TxnBuffer::take`].
#[derive(Debug)]
pub enum Buffered<T> {
    /// All of them, in memory.
    Memory(Vec<T>),
    /// In a scratch file, read back in batches.
    Spilled(SpilledTxn<T>),
}

/// The events of one open transaction: in memory up to the thresholds, then in a scratch file.
pub struct TxnBuffer<T> {
    settings: Arc<SpillSettings>,
    order: Option<Order<T>>,
    memory: Vec<T>,
    bytes: usize,
    file: Option<Writing>,
}

impl<T> std::fmt::Debug for TxnBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxnBuffer")
            .field("in_memory", &self.memory.len())
            .field("spilled", &self.file.as_ref().map_or(0, |w| w.count))
            .finish_non_exhaustive()
    }
}

/// The scratch file being written: its runs, each a sorted stretch of records.
struct Writing {
    out: BufWriter<File>,
    /// Offset and record count of each run.
    runs: Vec<(u64, usize)>,
    written: u64,
    count: usize,
    scratch: Vec<u8>,
}

impl<T: Spillable> TxnBuffer<T> {
    /// An empty buffer; `order`, when given, is the order [`TxnBuffer::take`] returns.
    pub fn new(settings: Arc<SpillSettings>, order: Option<Order<T>>) -> Self {
        Self {
            settings,
            order,
            memory: Vec::new(),
            bytes: 0,
            file: None,
        }
    }

    /// Events buffered, in memory and on disk.
    pub fn len(&self) -> usize {
        self.memory.len() + self.file.as_ref().map_or(0, |w| w.count)
    }

    /// True when nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds one event; past a threshold, writes what is in memory to the scratch file.
    pub fn push(&mut self, item: T) -> io::Result<()> {
        self.bytes += item.memory_size();
        self.memory.push(item);
        if self.memory.len() >= self.settings.after_events
            || self.bytes as u64 >= self.settings.after_bytes
        {
            self.spill_run()?;
        }
        Ok(())
    }

    fn spill_run(&mut self) -> io::Result<()> {
        if self.memory.is_empty() {
            return Ok(());
        }
        let writing = match &mut self.file {
            Some(w) => w,
            None => {
                let dir = self.settings.dir_name();
                let file = match &self.settings.dir {
                    Some(d) => tempfile::tempfile_in(d),
                    None => tempfile::tempfile(),
                }
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("creating a scratch file in {dir} (source.spill_dir): {e}"),
                    )
                })?;
                tracing::info!(
                    spill_dir = %dir,
                    after_events = self.settings.after_events,
                    after_bytes = self.settings.after_bytes,
                    "a large open transaction goes to a scratch file; it is read back in batches after its commit"
                );
                self.file.insert(Writing {
                    out: BufWriter::with_capacity(1 << 16, file),
                    runs: Vec::new(),
                    written: 0,
                    count: 0,
                    scratch: Vec::new(),
                })
            }
        };
        if let Some(order) = self.order {
            self.memory.sort_by(order);
        }
        writing.runs.push((writing.written, self.memory.len()));
        for item in self.memory.drain(..) {
            writing.scratch.clear();
            item.encode(&mut writing.scratch);
            let len = writing.scratch.len() as u64;
            writing.out.write_all(&len.to_le_bytes())?;
            writing.out.write_all(&writing.scratch)?;
            writing.written += 8 + len;
            writing.count += 1;
        }
        self.bytes = 0;
        Ok(())
    }

    /// The transaction's events at its commit; the buffer is empty again after.
    pub fn take(&mut self) -> io::Result<Buffered<T>> {
        if self.file.is_none() {
            let mut events = std::mem::take(&mut self.memory);
            self.bytes = 0;
            if let Some(order) = self.order {
                events.sort_by(order);
            }
            return Ok(Buffered::Memory(events));
        }
        self.spill_run()?;
        let Some(writing) = self.file.take() else {
            return Ok(Buffered::Memory(Vec::new()));
        };
        let file = writing.out.into_inner().map_err(|e| e.into_error())?;
        Ok(Buffered::Spilled(SpilledTxn::new(
            file,
            writing.written,
            writing.runs,
            writing.count,
            self.order,
        )))
    }
}

/// A committed transaction's events in a scratch file, read back in batches. Dropping it
/// closes (and so removes) the file.
pub struct SpilledTxn<T> {
    file: File,
    /// The file's size.
    bytes: u64,
    total: usize,
    remaining: usize,
    /// One cursor over the whole file, or one per run to merge.
    cursors: Vec<Cursor>,
    merge: Option<(Order<T>, BinaryHeap<Head<T>>)>,
}

impl<T> std::fmt::Debug for SpilledTxn<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpilledTxn")
            .field("total", &self.total)
            .field("remaining", &self.remaining)
            .field("runs", &self.cursors.len())
            .finish_non_exhaustive()
    }
}

/// Where one run is read from, with its own read-ahead.
struct Cursor {
    offset: u64,
    left: usize,
    buf: Vec<u8>,
    at: usize,
    chunk: usize,
}

impl Cursor {
    /// Makes `need` unread bytes available in `buf[at..]`.
    fn fill(&mut self, file: &File, need: usize) -> io::Result<()> {
        let available = self.buf.len() - self.at;
        if available >= need {
            return Ok(());
        }
        self.buf.drain(..self.at);
        self.at = 0;
        let want = need.max(self.chunk) - self.buf.len();
        let start = self.buf.len();
        self.buf.resize(start + want, 0);
        let mut reader = file;
        reader.seek(SeekFrom::Start(self.offset))?;
        let mut got = 0;
        while got < want {
            match reader.read(&mut self.buf[start + got..])? {
                0 => break,
                n => got += n,
            }
        }
        self.buf.truncate(start + got);
        self.offset += got as u64;
        if self.buf.len() < need {
            return Err(corrupt("file (ends early)"));
        }
        Ok(())
    }

    fn next<T: Spillable>(&mut self, file: &File) -> io::Result<Option<T>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.fill(file, 8)?;
        let mut len = [0; 8];
        len.copy_from_slice(&self.buf[self.at..self.at + 8]);
        let len = usize::try_from(u64::from_le_bytes(len)).map_err(|_| corrupt("length"))?;
        self.fill(file, 8 + len)?;
        let mut record = &self.buf[self.at + 8..self.at + 8 + len];
        let item = T::decode(&mut record)?;
        self.at += 8 + len;
        self.left -= 1;
        if self.left == 0 {
            self.buf = Vec::new();
        }
        Ok(Some(item))
    }
}

/// A run's next item in the merge (a min-heap by the order, then by run).
struct Head<T> {
    item: T,
    run: usize,
    order: Order<T>,
}

impl<T> PartialEq for Head<T> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == cmp::Ordering::Equal
    }
}
impl<T> Eq for Head<T> {}
impl<T> PartialOrd for Head<T> {
    fn partial_cmp(&self, other: &Self) -> Option<cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Head<T> {
    fn cmp(&self, other: &Self) -> cmp::Ordering {
        // Reversed: BinaryHeap pops the greatest.
        (other.order)(&other.item, &self.item).then(other.run.cmp(&self.run))
    }
}

impl<T> SpilledTxn<T> {
    /// Events in the transaction.
    pub fn len(&self) -> usize {
        self.total
    }

    /// True for a transaction without events.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Events not read back yet.
    pub fn remaining(&self) -> usize {
        self.remaining
    }

    /// The scratch file's size in bytes.
    pub fn file_bytes(&self) -> u64 {
        self.bytes
    }
}

/// Read-ahead of all the runs together, at most.
const READ_AHEAD: usize = 8 << 20;

impl<T: Spillable> SpilledTxn<T> {
    fn new(
        file: File,
        bytes: u64,
        runs: Vec<(u64, usize)>,
        total: usize,
        order: Option<Order<T>>,
    ) -> Self {
        let cursor = |offset, left, chunk| Cursor {
            offset,
            left,
            buf: Vec::new(),
            at: 0,
            chunk,
        };
        let (cursors, merge) = match order {
            Some(order) if runs.len() > 1 => {
                let chunk = (READ_AHEAD / runs.len()).clamp(4 << 10, 1 << 16);
                let cursors = runs.iter().map(|(o, n)| cursor(*o, *n, chunk)).collect();
                (cursors, Some((order, BinaryHeap::new())))
            }
            _ => (vec![cursor(0, total, 1 << 16)], None),
        };
        Self {
            file,
            bytes,
            total,
            remaining: total,
            cursors,
            merge,
        }
    }

    /// The next at most `max` events, in order.
    pub fn next_batch(&mut self, max: usize) -> io::Result<Vec<T>> {
        let mut batch = Vec::with_capacity(max.min(self.remaining));
        while batch.len() < max && self.remaining > 0 {
            let item = match &mut self.merge {
                None => self.cursors[0].next(&self.file)?,
                Some((order, heap)) => {
                    if heap.is_empty() {
                        // First read: one head per run.
                        for (run, c) in self.cursors.iter_mut().enumerate() {
                            if let Some(item) = c.next(&self.file)? {
                                heap.push(Head {
                                    item,
                                    run,
                                    order: *order,
                                });
                            }
                        }
                    }
                    match heap.pop() {
                        None => None,
                        Some(Head { item, run, .. }) => {
                            if let Some(next) = self.cursors[run].next(&self.file)? {
                                heap.push(Head {
                                    item: next,
                                    run,
                                    order: *order,
                                });
                            }
                            Some(item)
                        }
                    }
                }
            };
            let Some(item) = item else {
                return Err(corrupt("file (fewer records than written)"));
            };
            batch.push(item);
            self.remaining -= 1;
        }
        Ok(batch)
    }
}

#[cfg(test)]
mod tests;
