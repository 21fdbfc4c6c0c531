//! The layer under outbox's three SQL database crates (`outbox-postgres`, `outbox-mysql`,
//! `outbox-sqlite`) that names sqlx but no database: what they would otherwise each write
//! again around sqlx's types.
//!
//! `outbox-core` knows no sqlx, so its shared flows take their database steps as arguments
//! or traits. Where the step itself is the same sqlx code for every database (sorting a
//! `sqlx::Error` into retry-or-stop, running a drop script on a pool), it
//! lives here once, generic over `sqlx::Database`. Each database crate keeps its SQL, its
//! column types and what its server's error codes mean.

pub mod backfill;
pub mod error;
pub mod migrate;
pub mod poll;
mod query_set;
pub mod rows;
pub mod scratch;
pub mod snapshot;
