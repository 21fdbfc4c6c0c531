//! outbox
