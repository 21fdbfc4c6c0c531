//! What every sink with a broker or service behind it (all but `stdout`) shares: how a
//! batch's per-event deliveries become the batch's answer, and the sample event that
//! `validate()` renders a destination template with.

/// Collapses per-event deliveries into one batch error when every event failed because the
/// broker was unreachable: then nothing of the batch was published, which is exactly what the
/// whole-batch `Err` of the [`outbox_core::Sink`] contract says.
pub(crate) fn collapse_unavailable(
    deliveries: Vec<outbox_core::sink::Delivery>,
) -> Result<Vec<outbox_core::sink::Delivery>, outbox_core::SinkError> {
    use outbox_core::SinkErrorKind;
    let all_unavailable = !deliveries.is_empty()
        && deliveries
            .iter()
            .all(|d| matches!(d, Err(e) if e.kind() == SinkErrorKind::Unavailable));
    if all_unavailable && let Some(Err(first)) = deliveries.first() {
        return Err(first.clone());
    }
    Ok(deliveries)
}

/// The deliveries of a batch whose events were decided one by one (`None`: never attempted,
/// which fails `Transient` with `unattempted`), collapsed as [`collapse_unavailable`] does.
#[cfg(any(feature = "redis", feature = "aws", feature = "pubsub"))]
pub(crate) fn collapse_decided(
    deliveries: Vec<Option<outbox_core::sink::Delivery>>,
    unattempted: &'static str,
) -> Result<Vec<outbox_core::sink::Delivery>, outbox_core::SinkError> {
    collapse_unavailable(
        deliveries
            .into_iter()
            .map(|d| d.unwrap_or_else(|| Err(outbox_core::SinkError::transient(unattempted))))
            .collect(),
    )
}

/// An event used by `validate()` to render a destination template without a database: it
/// checks what the literal parts of the template make of an ordinary event.
pub(crate) fn sample_event(
    aggregate_type: &str,
    aggregate_id: &str,
    event_type: &str,
) -> outbox_core::Event {
    outbox_core::Event {
        id: uuid::Uuid::nil(),
        position: outbox_core::Position(0),
        aggregate_type: aggregate_type.to_owned(),
        aggregate_id: aggregate_id.to_owned(),
        event_type: event_type.to_owned(),
        payload: bytes::Bytes::new(),
        headers: Vec::new(),
        created_at: time::OffsetDateTime::UNIX_EPOCH,
        attempts: 0,
    }
}
