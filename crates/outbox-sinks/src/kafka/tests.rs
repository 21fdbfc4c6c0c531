use super::*;

#[test]
fn kafka_errors_map_to_the_kind_the_relay_acts_on() {
    use RDKafkaErrorCode as C;
    let cases = [
        (C::MessageSizeTooLarge, SinkErrorKind::Rejected),
        (C::InvalidMessageSize, SinkErrorKind::Rejected),
        (C::InvalidTopic, SinkErrorKind::Rejected),
        (C::InvalidRecord, SinkErrorKind::Rejected),
        (C::UnknownTopicOrPartition, SinkErrorKind::Transient),
        (C::UnknownTopic, SinkErrorKind::Transient),
        (C::NotEnoughReplicas, SinkErrorKind::Transient),
        (C::TopicAuthorizationFailed, SinkErrorKind::Transient),
        (C::MessageTimedOut, SinkErrorKind::Unavailable),
        (C::AllBrokersDown, SinkErrorKind::Unavailable),
        (C::BrokerTransportFailure, SinkErrorKind::Unavailable),
        (C::PurgeInflight, SinkErrorKind::Unavailable),
        (C::Fatal, SinkErrorKind::Unavailable),
    ];
    for (code, kind) in cases {
        assert_eq!(Verdict::of(Some(code)).kind(), kind, "{code:?}");
    }
    assert_eq!(Verdict::of(None).kind(), SinkErrorKind::Transient);
}

#[test]
fn a_timeout_makes_the_sink_check_the_brokers_and_the_topic_again() {
    let timed_out = Verdict::of(Some(RDKafkaErrorCode::MessageTimedOut)).aftermath();
    assert!(timed_out.suspect_brokers && timed_out.forget_topic);
    let missing = Verdict::of(Some(RDKafkaErrorCode::UnknownTopicOrPartition)).aftermath();
    assert!(!missing.suspect_brokers && missing.forget_topic);
    let too_large = Verdict::of(Some(RDKafkaErrorCode::MessageSizeTooLarge)).aftermath();
    assert!(!too_large.suspect_brokers && !too_large.forget_topic);
}
