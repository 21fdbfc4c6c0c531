//! The PostgreSQL side of the shared stream ledger ([`outbox_core::stream_ledger`]): what
//! each event remembers for dead-lettering.

use outbox_core::Event;
use outbox_core::spill::{self, Spillable};

/// Where an event came from, which decides how it is dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A row of the outbox table: dead-lettering updates the row.
    Row {
        /// The row's per-aggregate commit order.
        seq: i64,
        /// A dead letter put back in line by `outbox dead retry`, not delivered since.
        put_back: bool,
    },
    /// A `pg_logical_emit_message` event: dead-lettering inserts a row.
    Message,
}

/// What the ledger keeps with each event.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meta {
    pub(crate) origin: Origin,
    /// Its transaction's id in the database.
    pub(crate) xid: u32,
}

pub(crate) type Entry = outbox_core::stream_ledger::Entry<Meta>;

impl Meta {
    /// The row's seq (`None` for a table-less event).
    pub(crate) fn seq(&self) -> Option<i64> {
        match self.origin {
            Origin::Row { seq, .. } => Some(seq),
            Origin::Message => None,
        }
    }

    /// Whether this is a dead letter put back in line and not delivered since.
    pub(crate) fn put_back(&self) -> bool {
        matches!(self.origin, Origin::Row { put_back: true, .. })
    }
}

impl outbox_core::change_stream::StreamMeta for Meta {
    fn put_back(&self) -> bool {
        Meta::put_back(self)
    }
}

/// How a large transaction's events are kept in its scratch file.
impl Spillable for Meta {
    fn memory_size(&self) -> usize {
        std::mem::size_of::<Self>()
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let (tag, seq) = match self.origin {
            Origin::Row {
                seq,
                put_back: false,
            } => (0, seq),
            Origin::Row {
                seq,
                put_back: true,
            } => (1, seq),
            Origin::Message => (2, 0),
        };
        spill::put_u64(out, tag);
        spill::put_u64(out, seq as u64);
        spill::put_u64(out, u64::from(self.xid));
    }

    fn decode(input: &mut &[u8]) -> std::io::Result<Self> {
        let tag = spill::take_u64(input)?;
        let seq = spill::take_u64(input)? as i64;
        let origin = match tag {
            0 | 1 => Origin::Row {
                seq,
                put_back: tag == 1,
            },
            _ => Origin::Message,
        };
        let xid = u32::try_from(spill::take_u64(input)?)
            .map_err(|_| std::io::Error::other("spill file: corrupt xid"))?;
        Ok(Self { origin, xid })
    }
}

/// A committed transaction's events with their metadata.
pub(crate) fn with_meta(events: Vec<(Event, Origin)>, xid: u32) -> Vec<(Event, Meta)> {
    events
        .into_iter()
        .map(|(event, origin)| (event, Meta { origin, xid }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_through_a_scratch_file() {
        for origin in [
            Origin::Row {
                seq: 42,
                put_back: false,
            },
            Origin::Row {
                seq: -1,
                put_back: true,
            },
            Origin::Message,
        ] {
            let meta = Meta {
                origin,
                xid: 4_000_000_000,
            };
            let mut out = Vec::new();
            meta.encode(&mut out);
            let mut input = &out[..];
            let back = Meta::decode(&mut input).expect("decode");
            assert_eq!((back.origin, back.xid), (meta.origin, meta.xid));
            assert!(input.is_empty());
        }
    }
}
