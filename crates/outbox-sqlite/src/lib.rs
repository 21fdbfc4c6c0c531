//! outbox-sqlite
