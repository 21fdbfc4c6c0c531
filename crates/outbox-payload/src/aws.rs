//! What the claim-check store (S3) and the KMS keys share: checking `region` and
//! `endpoint_url`, and loading the SDK configuration as the AWS sinks do (the standard
//! credential chain, two attempts per request, short connect timeout).

/// Checks `region` and `endpoint_url` without the network; the error names the key.
/// `service` says whose requests are signed (`KMS`, `AWS`).
pub(crate) fn validate(
    region: Option<&str>,
    endpoint_url: Option<&str>,
    service: &str,
) -> Result<(), String> {
    if let Some(region) = region
        && (region.is_empty()
            || !region
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-'))
    {
        return Err(format!(
            "region: `{region}` is not an AWS region name (like `eu-west-1`)"
        ));
    }
    if let Some(url) = endpoint_url {
        let shown = outbox_core::redact::redact_url(url);
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "endpoint_url: `{shown}` must start with http:// or https://"
            ));
        }
        let authority = url.split("://").nth(1).unwrap_or("").split('/').next();
        if authority.is_some_and(|a| a.contains('@')) {
            return Err(format!(
                "endpoint_url: `{shown}` must not carry a user or password: {service} requests \
                 are signed with the keys of the standard credential chain"
            ));
        }
    }
    Ok(())
}

/// The SDK configuration: the standard chain, `region` and `endpoint_url` when set, two
/// attempts per request (an outage surfaces quickly; the relay backs off itself).
#[cfg(feature = "aws")]
pub(crate) async fn sdk_config(
    region: Option<&str>,
    endpoint_url: Option<&str>,
    connect_timeout: std::time::Duration,
    attempt_timeout: std::time::Duration,
) -> aws_config::SdkConfig {
    use aws_smithy_types::retry::RetryConfig;
    use aws_smithy_types::timeout::TimeoutConfig;
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .retry_config(RetryConfig::standard().with_max_attempts(2))
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(connect_timeout)
                .operation_attempt_timeout(attempt_timeout)
                .build(),
        );
    if let Some(region) = region {
        loader = loader.region(aws_config::Region::new(region.to_owned()));
    }
    if let Some(url) = endpoint_url {
        loader = loader.endpoint_url(url);
    }
    loader.load().await
}

/// Where requests go, for messages: `S3 at http://127.0.0.1:5000` (credentials masked) or
/// `KMS in eu-west-1`.
#[cfg(feature = "aws")]
pub(crate) fn describe(service: &str, sdk: &aws_config::SdkConfig) -> String {
    match sdk.endpoint_url() {
        Some(url) => format!("{service} at {}", outbox_core::redact::redact_url(url)),
        None => format!(
            "{service} in {}",
            sdk.region().map_or("the default region", |r| r.as_ref())
        ),
    }
}
