//! Errors of the MySQL crate.

pub use outbox_core::EnqueueError;
