//! Test support for `outbox`: real servers on 127.0.0.1 ([`services`]), a fault-injecting sink
//! ([`faults`]), a switchable TCP forwarder for failover tests ([`forwarder`]), the source and
//! sink conformance suites ([`conformance`], [`sink_conformance`]), an OTLP trace receiver
//! ([`otlp`]), waiting and settling helpers ([`wait`]), this process's memory for benchmarks
//! ([`memory`]) and test logging ([`init_tracing`]).
//!
//! Typical integration test:
//!
//! ```no_run
//! use outbox_testkit::services::Postgres;
//!
//! #[tokio::test]
//! async fn committed_event_reaches_the_broker() -> anyhow::Result<()> {
//!     outbox_testkit::init_tracing();
//!     let database_url = Postgres::shared().await?.fresh_database().await?;
//!     // ... migrate, enqueue, run the relay against a ScriptedSink or a real broker ...
//!     Ok(())
//! }
//! ```
//!
//! `scripts/test.sh` starts one server of each kind for the whole run and passes them through
//! `OUTBOX_TEST_DATABASE_URL`, `OUTBOX_TEST_NATS_URL`, `OUTBOX_TEST_REDIS_URL`,
//! `OUTBOX_TEST_AMQP_URL` (and the others named in [`services`]); without them, each test
//! process starts its own on first use.

/// Runs the checks of a conformance suite in turn, each against a fresh harness from
/// `$new_harness` (a closure returning a future of one), and stops at the first failure with
/// an error naming the suite and the check: the body of a suite's `run_all`.
macro_rules! run_checks {
    ($suite:literal, $new_harness:ident, [$($check:ident),+ $(,)?]) => {{
        $(
            $check(&$new_harness().await?).await.with_context(|| {
                concat!($suite, " check `", stringify!($check), "` failed")
            })?;
        )+
        Ok(())
    }};
}
pub(crate) use run_checks;

pub mod admin_conformance;
pub mod conformance;
pub mod faults;
pub mod forwarder;
pub mod memory;
pub mod nats_auth;
pub mod oracle;
pub mod otlp;
pub mod serial_proxy;
pub mod services;
pub mod sink_conformance;
pub mod stream_faults;
pub mod tls;
pub mod wait;

use std::sync::{Mutex, MutexGuard, Once, PoisonError};

/// Installs a `tracing` subscriber that writes to the test's captured output, filtered by
/// `RUST_LOG` (default `warn`). Safe to call from every test: only the first call does
/// anything, and an already installed global subscriber is left alone.
pub fn init_tracing() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

/// Locks `m`, ignoring poisoning: a test that panicked while holding a lock must not hide
/// the state from the test's own failure report.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
