//! The CDC source (`source.mode = "cdc"`): the outbox table's inserts and table-less
//! `pg_logical_emit_message` events, streamed over logical replication with `pgoutput`.
//!
//! - `slot.rs`: the publication and the slot (created by `migrate`), start checks, status.
//! - `stream.rs`: the replication session (pgwire-replication), standby, clean close.
//! - `decode.rs`: pgoutput messages to events, emitted only at commit.
//! - `ledger.rs`: what is in memory, and the rule that confirms the slot's position.
//! - `offset.rs`: the acknowledged position saved in a table, so a database crash replays little.
//! - `source.rs`: [`PgCdcSource`], the [`outbox_core::Source`] over all of that, on the shared
//!   change-stream machinery ([`outbox_core::change_stream`]); its parts in `source/`: taking
//!   the slot (`open.rs`), the stream read into the ledger (`wal.rs`), a lost slot
//!   (`recover.rs`), dead letters and put-back order (`dead.rs`).
//! - `message.rs`: the table-less event encoding and [`emit_message`].
//! - `inspect.rs`: [`PgCdcInspector`], backlog and slot lag.
//!
//! Why these crates: published `tokio-postgres` cannot open a replication connection;
//! `pgwire-replication` speaks the streaming-replication protocol (START_REPLICATION,
//! keepalives, standby status updates with an explicit applied LSN) and nothing more, and
//! `pg_walstream`'s parser (without its own connection layer) decodes pgoutput's Relation and
//! Insert messages. Design and operations: `docs/cdc.md`.

mod decode;
mod inspect;
mod ledger;
mod message;
mod offset;
pub(crate) mod queries;
mod recovery;
mod slot;
mod source;
mod standby;
mod stream;

pub use inspect::PgCdcInspector;
pub use message::{
    DEFAULT_MESSAGE_PREFIX, DecodedMessage, MESSAGE_VERSION, MessageDecodeError, decode_message,
    emit_message, emit_message_with_prefix, encode_message,
};
pub use recovery::{RecoveryStatus, recovery_status};
pub use slot::{CdcSetupError, CdcSetupReport, SlotStatus, setup_cdc, slot_status};
pub use source::{CdcClosed, PgCdcSource, STANDBY_RETRY};
