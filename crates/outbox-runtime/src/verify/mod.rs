//! `outbox verify`: proves delivery for a window by reconciling what the outbox table says
//! was delivered with what the destination holds.
//!
//! The database side is the backend's [`DeliveryLedger`](outbox_core::verify::DeliveryLedger)
//! ability, the broker side the sink's [`ReadBack`](outbox_core::verify::ReadBack); the
//! comparison (`reconcile.rs`) knows neither. The order of the steps is what makes a clean
//! result mean something: the table is read **before** the destination, so every event the
//! table recorded as delivered had been acknowledged by the broker before the read began.
//!
//! Exit codes (what [`Report::verdict`] maps to, and [`CannotVerify`]): 0 nothing lost, no
//! phantom, no order break; 1 any of them; 2 delivery could not be checked (an unreachable
//! broker or database, no permission, a destination that cannot be read back, rows deleted on
//! delivery, a window the destination no longer holds).

mod reconcile;
mod report;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use outbox_core::backend::OpenOptions;
use outbox_core::relay::ErrorChain;
use outbox_core::verify::{
    Basis, LOOKUP_CHUNK, LedgerEvent, ReadBackErrorKind, ReadProgress, Window,
};
use outbox_core::{Ordering, Unsupported};
use time::OffsetDateTime;

pub use report::{
    DestinationReport, Finding, OrderBreak, Report, SourceReport, Verdict, WindowReport,
};

use crate::Config;

/// How far before `--since` the destination is read: messages a broker with a slower clock
/// stored "before" the window still count (what the read brings from before the window is
/// sorted out as outside it).
pub const READ_MARGIN: Duration = Duration::from_secs(60);

/// What to verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Events written at or after this time (and before the start of the run).
    pub since: OffsetDateTime,
    /// Ids listed per finding.
    pub max_ids: usize,
}

/// Delivery could not be checked at all; the message names what is missing (secrets
/// redacted). `outbox verify` exits 2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot verify: {0}")]
pub struct CannotVerify(pub String);

/// Verifies the window of `options` for `config` (one outbox table and its sink: for a
/// fan-out, the config of one subscription, see [`crate::subscription::for_subscription`]).
pub async fn verify(
    config: &Config,
    options: &Options,
    progress: &dyn ReadProgress,
) -> Result<Report, CannotVerify> {
    let started = Instant::now();
    if !config.subscriptions.is_empty() {
        let names: Vec<&str> = config
            .subscriptions
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        return Err(CannotVerify(format!(
            "this outbox fans out to subscriptions, each with its own table and destination; verify one at a time with --subscription NAME ({})",
            names.join(", ")
        )));
    }
    let now = OffsetDateTime::now_utc();
    if options.since >= now {
        return Err(CannotVerify(
            "--since is in the future: nothing to verify".into(),
        ));
    }
    let window = Window {
        since: options.since,
        until: now,
    };

    progress.stage(&format!("opening {}", config.source.describe()));
    let backend = config
        .source
        .open(OpenOptions { connections: 2 })
        .await
        .map_err(|e| CannotVerify(ErrorChain(&e).to_string()))?;
    let ledger_reader = backend
        .delivery_ledger()
        .map_err(|e: Unsupported| CannotVerify(e.to_string()))?;

    // Connect to the destination before the (possibly long) table read: an unreachable broker
    // fails fast.
    progress.stage(&format!(
        "connecting to the {} destination",
        config.sink.kind()
    ));
    let reader = config
        .sink
        .read_back()
        .await
        .map_err(|e| CannotVerify(read_back_message(e.kind, &e.message)))?;

    progress.stage(&format!("reading outbox table {}", backend.table()));
    let ledger = ledger_reader.delivered(window).await.map_err(|e| {
        CannotVerify(format!(
            "reading outbox table {}: {}",
            backend.table(),
            ErrorChain(&e)
        ))
    })?;

    progress.stage(&format!("reading {}", reader.describe()));
    let read_from = window.since - READ_MARGIN;
    let read = reader
        .read(read_from, &ledger.delivered, progress)
        .await
        .map_err(|e| CannotVerify(read_back_message(e.kind, &e.message)))?;

    progress.stage("looking up ids the window does not explain");
    let unexplained = reconcile::unexplained_ids(&ledger, &read);
    let mut known = HashMap::with_capacity(unexplained.len());
    for chunk in unexplained.chunks(LOOKUP_CHUNK) {
        let rows = ledger_reader.lookup(chunk).await.map_err(|e| {
            CannotVerify(format!(
                "looking up ids in outbox table {}: {}",
                backend.table(),
                ErrorChain(&e)
            ))
        })?;
        known.extend(rows.into_iter().map(|r| (r.id, r)));
    }

    let table_horizon = config.retention.enabled.then(|| {
        now - time::Duration::try_from(config.retention.keep).unwrap_or(time::Duration::MAX)
    });
    let destination_of = |e: &LedgerEvent| reader.destination_of(e);
    let order_promised = config.relay.ordering != Ordering::None;
    let tally = reconcile::reconcile(
        &ledger,
        &read,
        &known,
        &reconcile::Context {
            window,
            table_horizon,
            order_promised,
            destination_of: &destination_of,
            max_ids: options.max_ids,
        },
    );

    let mut notes = ledger.notes.clone();
    notes.extend(read.notes.iter().cloned());
    if !order_promised {
        notes.push(
            "relay.ordering = \"none\": order is not promised, so it was not checked".to_owned(),
        );
    }
    if let Some(h) = table_horizon
        && h > window.since
    {
        notes.push(format!(
            "the window starts before the table's retention horizon ({}, retention.keep = {}): rows delivered before it may be deleted, and messages of theirs are counted as deleted from the table, not as phantoms",
            outbox_core::admin::when(h),
            humantime::format_duration(config.retention.keep)
        ));
    }
    let delivered = ledger.delivered.len() as u64;
    let (verdict, cannot_verify) = if !tally.is_clean() {
        (Verdict::Failed, None)
    } else if ledger.basis == Basis::Deleted {
        (
            Verdict::CannotVerify,
            Some(format!(
                "outbox table {} deletes delivered rows (source.on_delivered = \"delete\"), so it cannot say which events should be at the destination: lost events and phantoms cannot be told apart from deleted rows. Order and duplicates were checked; to prove delivery, run with on_delivered = \"mark\" and retention",
                backend.table()
            )),
        )
    } else if delivered > 0 && tally.expired_at_destination.count == delivered {
        (
            Verdict::CannotVerify,
            Some(format!(
                "the destination no longer holds any of the {delivered} delivered event(s) of the window (its retention removed them); choose a shorter --since"
            )),
        )
    } else {
        (Verdict::Ok, None)
    };
    let seconds = started.elapsed().as_secs_f64();
    #[allow(clippy::cast_precision_loss)]
    let events_per_second = if seconds > 0.0 {
        delivered as f64 / seconds
    } else {
        0.0
    };
    Ok(Report {
        verdict,
        exit_code: verdict.exit_code(),
        cannot_verify,
        window: WindowReport {
            since: window.since,
            until: window.until,
        },
        source: SourceReport {
            database: backend.database(),
            table: backend.table(),
            basis: ledger.basis.clone(),
            delivered,
            undelivered: ledger.undelivered,
            dead: ledger.dead,
        },
        destination: DestinationReport {
            describe: reader.describe(),
            read: read.messages.len() as u64,
            lanes: read.lanes.clone(),
            trimmed: read.trimmed.clone(),
        },
        matched: tally.matched,
        lost: tally.lost,
        phantom: tally.phantom,
        duplicates: tally.duplicates,
        order_breaks: tally.order_breaks,
        order_break_details: tally.breaks,
        order_checked: order_promised,
        expired_at_destination: tally.expired_at_destination,
        deleted_from_table: tally.deleted_from_table,
        dead_at_destination: tally.dead_at_destination,
        in_flight: tally.in_flight,
        outside_window: tally.outside_window,
        without_id: tally.without_id,
        notes,
        seconds,
        events_per_second,
    })
}

/// A read-back failure as the one line `outbox verify` prints.
fn read_back_message(kind: ReadBackErrorKind, message: &str) -> String {
    match kind {
        ReadBackErrorKind::Unsupported => message.to_owned(),
        ReadBackErrorKind::Unreachable => format!("the destination cannot be reached: {message}"),
        ReadBackErrorKind::Refused => format!("the destination refused the read: {message}"),
        ReadBackErrorKind::Failed => format!("reading the destination failed: {message}"),
    }
}
