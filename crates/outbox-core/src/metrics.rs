//! Metric names, in one place. Labels are low-cardinality (`sink`, `outcome`); never an
//! aggregate id or event id.

/// Counter: events the broker acknowledged. Label `sink`.
pub const EVENTS_PUBLISHED: &str = "outbox_events_published_total";
/// Counter: failed publish attempts that will be retried. Labels `sink`, `kind`.
pub const EVENTS_FAILED: &str = "outbox_events_failed_total";
/// Counter: events dead-lettered. Label `sink`.
pub const EVENTS_DEAD_LETTERED: &str = "outbox_events_dead_lettered_total";
/// Counter: batches whose outcomes could not be recorded (their events will be published
/// again: the source of duplicates).
pub const SETTLE_FAILURES: &str = "outbox_settle_failures_total";
/// Counter: fetches that failed because the database was unavailable.
pub const SOURCE_ERRORS: &str = "outbox_source_errors_total";
/// Counter: events a relay did not publish, or whose retry or dead letter it did not record,
/// because its claim ran out first (a paused relay: SIGSTOP, a frozen VM, a starved CPU);
/// the replica that owns them now delivers them. Label `sink`.
pub const EVENTS_FENCED: &str = "outbox_events_fenced_total";
/// Histogram (seconds): from the event's `created_at` to the broker's acknowledgement.
pub const COMMIT_TO_ACK_SECONDS: &str = "outbox_commit_to_ack_seconds";
/// Histogram: events per fetched batch.
pub const BATCH_SIZE: &str = "outbox_batch_size";
/// Gauge: events pending delivery.
pub const PENDING: &str = "outbox_pending_events";
/// Gauge: pending events waiting for a retry.
pub const RETRYING: &str = "outbox_retrying_events";
/// Gauge: dead-lettered events.
pub const DEAD: &str = "outbox_dead_events";
/// Gauge (seconds): age of the oldest pending event not waiting on backoff.
pub const OLDEST_PENDING_AGE_SECONDS: &str = "outbox_oldest_pending_age_seconds";
/// Gauge: pending events (backoff included) older than `metrics.stuck_after`.
pub const STUCK_EVENTS: &str = "outbox_stuck_events";
/// Gauge (seconds): age of the oldest open transaction in the outbox's database, the relay's
/// own claims excluded (it holds the xmin horizon); 0 when none.
pub const OLDEST_TRANSACTION_AGE_SECONDS: &str = "outbox_oldest_transaction_age_seconds";
/// Gauge: backend pid of that transaction (0 when none), for `pg_terminate_backend`.
pub const OLDEST_TRANSACTION_PID: &str = "outbox_oldest_transaction_pid";
/// Gauge: 1 while the sink is considered unavailable, else 0.
pub const SINK_UP: &str = "outbox_sink_up";
/// Gauge (bytes): WAL the CDC replication slot keeps for the relay
/// (`pg_current_wal_lsn() - confirmed_flush_lsn`).
pub const REPLICATION_SLOT_RETAINED_WAL_BYTES: &str = "outbox_replication_slot_retained_wal_bytes";
/// Counter: publish spans never exported (`[tracing]` set): label `reason` = `queue_full`
/// (the bounded export queue was full: the OTLP endpoint is slow or unreachable),
/// `export_failed` (the endpoint refused or did not answer) or `shutdown` (still queued when
/// the relay stopped). Delivery never waits for the export.
pub const TRACE_SPANS_DROPPED: &str = "outbox_trace_spans_dropped_total";
/// Counter: CDC slot recoveries begun (the slot was gone: a failover, a drop; docs/cdc.md,
/// "Failover").
pub const CDC_SLOT_RECOVERIES: &str = "outbox_cdc_slot_recoveries_total";
/// Counter: events a CDC slot recovery published from the table.
pub const CDC_RECOVERED_EVENTS: &str = "outbox_cdc_recovered_events_total";
/// Counter: slot recoveries whose lost window may have held table-less events
/// (`pg_logical_emit_message`), which no table keeps; the log names the LSN range.
pub const CDC_MESSAGE_LOSS_WINDOWS: &str = "outbox_cdc_message_loss_windows_total";
/// Gauge: events of committed transactions the CDC relay holds until the synchronous
/// standbys have flushed them (`source.wait_for_standby`).
pub const CDC_WAITING_FOR_STANDBY: &str = "outbox_cdc_waiting_for_standby_events";
/// Histogram (seconds): a canary probe's commit to its arrival at the destination
/// (`[canary]`; the broker's stored time where it says, else when the relay saw it).
pub const CANARY_LATENCY_SECONDS: &str = "outbox_canary_latency_seconds";
/// Counter: canary probes written.
pub const CANARY_PROBES: &str = "outbox_canary_probes_total";
/// Counter: canary probes the table no longer holds as pending that the destination did not
/// show within `canary.lost_after`.
pub const CANARY_LOST: &str = "outbox_canary_lost_total";
/// Counter: canary probes that arrived after a later probe of the same relay.
pub const CANARY_OUT_OF_ORDER: &str = "outbox_canary_out_of_order_total";
/// Gauge: canary probes written and not yet seen at the destination.
pub const CANARY_IN_FLIGHT: &str = "outbox_canary_in_flight_probes";
/// Counter: configuration reloads (SIGHUP, the console), `result="ok"` (applied, or nothing
/// to change) or `result="refused"` (invalid, or a key that needs a restart).
pub const CONFIG_RELOADS: &str = "outbox_config_reloads_total";
/// Gauge: the running configuration's generation, 1 at start, +1 per applied reload.
pub const CONFIG_GENERATION: &str = "outbox_config_generation";

/// Registers descriptions with the installed recorder (call once after installing it).
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(EVENTS_PUBLISHED, "Events acknowledged by the broker");
    describe_counter!(
        EVENTS_FAILED,
        "Failed publish attempts that will be retried"
    );
    describe_counter!(EVENTS_DEAD_LETTERED, "Events dead-lettered");
    describe_counter!(
        SETTLE_FAILURES,
        "Batches whose outcomes could not be recorded (redelivered later)"
    );
    describe_counter!(
        SOURCE_ERRORS,
        "Fetches that failed because the database was unavailable"
    );
    describe_counter!(
        EVENTS_FENCED,
        "Events left to another replica because this relay's claim ran out (a paused relay)"
    );
    describe_histogram!(
        COMMIT_TO_ACK_SECONDS,
        Unit::Seconds,
        "From event creation to broker acknowledgement"
    );
    describe_histogram!(BATCH_SIZE, Unit::Count, "Events per fetched batch");
    describe_gauge!(PENDING, "Events pending delivery");
    describe_gauge!(RETRYING, "Pending events waiting for a retry");
    describe_gauge!(DEAD, "Dead-lettered events");
    describe_gauge!(
        OLDEST_PENDING_AGE_SECONDS,
        Unit::Seconds,
        "Age of the oldest pending event not waiting on backoff"
    );
    describe_gauge!(
        STUCK_EVENTS,
        "Pending events (backoff included) older than metrics.stuck_after"
    );
    describe_gauge!(
        OLDEST_TRANSACTION_AGE_SECONDS,
        Unit::Seconds,
        "Age of the oldest open transaction in the outbox database (holds the xmin horizon)"
    );
    describe_gauge!(
        OLDEST_TRANSACTION_PID,
        "Backend pid of the oldest open transaction, 0 when none"
    );
    describe_gauge!(
        SINK_UP,
        "1 while the sink accepts publishes, 0 while it is unavailable"
    );
    describe_gauge!(
        REPLICATION_SLOT_RETAINED_WAL_BYTES,
        Unit::Bytes,
        "WAL the CDC replication slot retains: current WAL position minus confirmed flush"
    );
    describe_counter!(
        CDC_SLOT_RECOVERIES,
        "CDC slot recoveries begun: the slot was gone and the relay created it again"
    );
    describe_counter!(
        CDC_RECOVERED_EVENTS,
        "Events a CDC slot recovery published from the outbox table"
    );
    describe_counter!(
        CDC_MESSAGE_LOSS_WINDOWS,
        "CDC slot recoveries whose lost WAL window may have held table-less events (see the log)"
    );
    describe_gauge!(
        CDC_WAITING_FOR_STANDBY,
        "Events the CDC relay holds until the synchronous standbys have flushed their transaction"
    );
    describe_histogram!(
        CANARY_LATENCY_SECONDS,
        Unit::Seconds,
        "Canary probe: from its commit to its arrival at the destination"
    );
    describe_counter!(CANARY_PROBES, "Canary probes written");
    describe_counter!(
        CANARY_LOST,
        "Canary probes delivered per the table but not at the destination within canary.lost_after"
    );
    describe_counter!(
        CANARY_OUT_OF_ORDER,
        "Canary probes that arrived after a later probe of the same relay"
    );
    describe_gauge!(
        CANARY_IN_FLIGHT,
        "Canary probes written and not yet seen at the destination"
    );
    describe_counter!(
        CONFIG_RELOADS,
        "Configuration reloads by result: ok (applied or unchanged), refused (the old one runs)"
    );
    describe_gauge!(
        CONFIG_GENERATION,
        "The running configuration's generation: 1 at start, +1 per applied reload"
    );
    describe_counter!(
        TRACE_SPANS_DROPPED,
        "Publish spans dropped instead of exported over OTLP (queue full, export failed, shutdown)"
    );
}
