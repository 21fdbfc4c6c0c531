//! What the claim-check store (S3) and the KMS keys share: checking `region` and
//! `endpoint_url` (and refusing them where no AWS client is made), showing the config with
//! `endpoint_url` masked, and loading the SDK configuration as the AWS sinks do (the standard
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

/// Refuses `region` and `endpoint_url` where the config makes no AWS client: the error names
/// the first one set, followed by `why`.
pub(crate) fn refuse_unused(
    region: Option<&str>,
    endpoint_url: Option<&str>,
    why: &str,
) -> Result<(), String> {
    for (key, set) in [
        ("region", region.is_some()),
        ("endpoint_url", endpoint_url.is_some()),
    ] {
        if set {
            return Err(format!("{key}: {why}"));
        }
    }
    Ok(())
}

/// `Debug` for a config with AWS client settings: the listed fields as they are, then
/// `endpoint_url` with its credentials masked. A macro because `Debug` is a foreign trait: no
/// blanket impl can give it to both configs.
macro_rules! debug_masking_endpoint {
    ($config:ident { $($field:ident),* $(,)? }) => {
        impl std::fmt::Debug for $config {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($config))
                    $(.field(stringify!($field), &self.$field))*
                    .field(
                        "endpoint_url",
                        &self
                            .endpoint_url
                            .as_deref()
                            .map(outbox_core::redact::redact_url),
                    )
                    .finish()
            }
        }
    };
}
pub(crate) use debug_masking_endpoint;

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
