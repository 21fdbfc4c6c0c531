use outbox_core::SinkErrorKind;

use super::*;

async fn s3_store(prefix: &str) -> S3Store {
    // No request is made: the client is only built.
    S3Store::connect(
        "orders-big",
        prefix,
        7,
        Some("us-east-1"),
        Some("http://127.0.0.1:9"),
    )
    .await
}

fn service(code: &str, status: u16) -> Failure {
    Failure::Service {
        code: code.into(),
        status,
        detail: format!("{code}: the service's words"),
    }
}

#[tokio::test]
async fn refusals_name_the_permission_to_give_and_never_dead_letter() {
    let store = s3_store("outbox/large").await;
    let put = store.put_needs();
    let denied = store.error(&put, service("AccessDenied", 403));
    assert_eq!(denied.kind(), SinkErrorKind::Unavailable);
    assert_eq!(
        denied.to_string(),
        "the claim-check store refused the write (AccessDenied): give the relay \
         s3:PutObject on arn:aws:s3:::orders-big/outbox/large/*"
    );
    let forbidden = store.error(&put, service("", 403));
    assert!(forbidden.to_string().contains("(HTTP 403)"), "{forbidden}");
    let no_bucket = store.error(&put, service("NoSuchBucket", 404));
    assert_eq!(no_bucket.kind(), SinkErrorKind::Unavailable);
    assert_eq!(
        no_bucket.to_string(),
        "the claim-check bucket `orders-big` does not exist (S3 at http://127.0.0.1:9): \
         create it, or correct claim_check.store"
    );
    for code in ["SlowDown", "InternalError", "InvalidArgument"] {
        let err = store.error(&put, service(code, 503));
        assert_eq!(err.kind(), SinkErrorKind::Unavailable, "{code}: {err}");
    }
    let too_long = store.error(&put, service("KeyTooLongError", 400));
    assert_eq!(too_long.kind(), SinkErrorKind::Rejected, "{too_long}");
    let unsigned = store.error(&put, Failure::Unsigned("no credentials".into()));
    assert_eq!(unsigned.kind(), SinkErrorKind::Unavailable);
    assert!(
        unsigned
            .to_string()
            .contains("are AWS credentials configured?")
    );
    let without_prefix = s3_store("").await;
    assert!(
        without_prefix
            .error(&without_prefix.put_needs(), service("AccessDenied", 403))
            .to_string()
            .ends_with("s3:PutObject on arn:aws:s3:::orders-big/*")
    );
    assert_eq!(without_prefix.rule_id(), "outbox-claim-check-all");
    assert_eq!(store.rule_id(), "outbox-claim-check-outbox/large");
}

#[tokio::test]
async fn a_key_over_s3s_limit_is_rejected_before_any_request() {
    let store = s3_store("p").await;
    let key = format!("p/{}/x", "a".repeat(MAX_KEY));
    let err = store
        .put(Put {
            key: &key,
            body: &Bytes::from_static(b"x"),
            event_id: "id",
            aggregate_type: "a",
            event_type: "t",
            content_type: "application/octet-stream",
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    assert!(err.to_string().contains("over S3's limit of 1024"), "{err}");
}

#[test]
fn a_rule_covers_the_prefix_when_enabled_unconditional_and_above_it() {
    let rule = |prefix: &str, status: ExpirationStatus, days: i32| {
        LifecycleRule::builder()
            .id("r")
            .filter(LifecycleRuleFilter::builder().prefix(prefix).build())
            .status(status)
            .expiration(LifecycleExpiration::builder().days(days).build())
            .build()
            .unwrap()
    };
    let on = ExpirationStatus::Enabled;
    assert_eq!(
        expiry_days(&rule("outbox/", on.clone(), 7), "outbox/large/"),
        Some(7)
    );
    assert_eq!(
        expiry_days(&rule("", on.clone(), 9), "outbox/large/"),
        Some(9)
    );
    assert_eq!(
        expiry_days(&rule("logs/", on.clone(), 7), "outbox/large/"),
        None
    );
    assert_eq!(
        expiry_days(&rule("outbox/", ExpirationStatus::Disabled, 7), "outbox/"),
        None
    );
    let tagged = LifecycleRule::builder()
        .filter(
            LifecycleRuleFilter::builder()
                .prefix("outbox/")
                .object_size_greater_than(1 << 20)
                .build(),
        )
        .status(on)
        .expiration(LifecycleExpiration::builder().days(7).build())
        .build()
        .unwrap();
    assert_eq!(expiry_days(&tagged, "outbox/"), None, "only some objects");
}
