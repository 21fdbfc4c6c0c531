//! [`Readiness`]: what `/readyz` and the console report, fed by the watchdog.

use std::sync::atomic::{AtomicBool, Ordering};

/// What `/readyz` reports: the database answered the last backlog query and the broker
/// passed the last healthcheck.
///
/// With `[[subscription]]` there is one broker per subscription: ready means every one
/// passed its last healthcheck.
#[derive(Debug, Default)]
pub struct Readiness {
    database: AtomicBool,
    /// Sinks (by pipeline) whose last healthcheck failed or that were not checked yet.
    sinks_not_ready: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Whether any sink was checked at all.
    sink_checked: AtomicBool,
}

impl Readiness {
    pub(crate) fn ready(&self) -> bool {
        let (database, sink) = self.parts();
        database && sink
    }

    /// (database answered, every broker passed its healthcheck), as last seen.
    pub(crate) fn parts(&self) -> (bool, bool) {
        let sinks = self.sink_checked.load(Ordering::Relaxed)
            && self
                .sinks_not_ready
                .lock()
                .map(|s| s.is_empty())
                .unwrap_or(false);
        (self.database.load(Ordering::Relaxed), sinks)
    }

    /// Records the healthcheck verdict of the sink of `pipeline`.
    pub(crate) fn set_sink(&self, pipeline: &str, ok: bool) {
        if let Ok(mut not_ready) = self.sinks_not_ready.lock() {
            if ok {
                not_ready.remove(pipeline);
            } else {
                not_ready.insert(pipeline.to_owned());
            }
        }
        self.sink_checked.store(true, Ordering::Relaxed);
    }

    /// Records whether the database answered the last backlog query.
    pub(crate) fn set_database(&self, answered: bool) {
        self.database.store(answered, Ordering::Relaxed);
    }

    /// Marks the sink of `pipeline` as not checked yet (a subscription whose broker may be
    /// down at start keeps `/readyz` red until it answers).
    pub(crate) fn expect_sink(&self, pipeline: &str) {
        if let Ok(mut not_ready) = self.sinks_not_ready.lock() {
            not_ready.insert(pipeline.to_owned());
        }
    }

    /// Forgets every sink's verdict: a reload started new pipelines, which report afresh (a
    /// subscription the new configuration dropped no longer counts).
    pub(crate) fn forget_sinks(&self) {
        if let Ok(mut not_ready) = self.sinks_not_ready.lock() {
            not_ready.clear();
        }
    }
}
