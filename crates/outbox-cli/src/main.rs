//! outbox-cli
fn main() {}
