//! What the AWS sinks (`sqs`, `sns`, `kinesis`) share: the SDK configuration (the standard
//! credential chain, `region`, `endpoint_url`, timeouts), how an SDK failure maps to a
//! [`SinkError`] kind, and the message rules of SQS and SNS (`docs/contract.md`, "The message
//! on the broker"): text bodies and at most ten message attributes.

use std::error::Error as StdError;
use std::time::Duration;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::display::DisplayErrorContext;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use aws_smithy_types::retry::RetryConfig;
use aws_smithy_types::timeout::TimeoutConfig;
use futures::StreamExt as _;
use outbox_core::sink::Delivery;
use outbox_core::{Event, SinkError};

use crate::ConfigError;
use crate::secret::redact_url;

#[cfg(any(feature = "sqs", feature = "sns"))]
mod queue;
#[cfg(any(feature = "sqs", feature = "sns"))]
mod queue_api;
#[cfg(any(feature = "sqs", feature = "sns"))]
pub(crate) use queue::{QueueMessage, STRING_TYPE, entry_id, outcomes_by_id, queue_message};
#[cfg(any(feature = "sqs", feature = "sns"))]
pub(crate) use queue_api::{BatchAnswer, FailedEntry, QueueApi, healthcheck, publish, queue_sink};

/// The SDK configuration for one sink: the standard credential chain (environment, profile,
/// web identity, ECS/EC2 metadata), `region` when set (else the chain's), and `endpoint_url`
/// for local servers. One SDK retry on a failed connection: an outage surfaces quickly as
/// `Unavailable` and the relay backs off itself.
pub(crate) async fn sdk_config(
    region: Option<&str>,
    endpoint_url: Option<&str>,
    connect_timeout: Duration,
    timeout: Duration,
) -> SdkConfig {
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .retry_config(RetryConfig::standard().with_max_attempts(2))
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(connect_timeout)
                .operation_attempt_timeout(timeout)
                .build(),
        );
    if let Some(region) = region {
        loader = loader.region(Region::new(region.to_owned()));
    }
    if let Some(url) = endpoint_url {
        loader = loader.endpoint_url(url);
    }
    loader.load().await
}

/// Declares the `[sink]` table of an AWS sink: the key that names where events go (a
/// destination template, required), then the keys every AWS sink shares: `region`,
/// `endpoint_url`, `max_message_size`, `connect_timeout`, `timeout` and the message format
/// (`format`, `cloudevents_source`, `cloudevents_content_type`). Writes the struct
/// (serde, `deny_unknown_fields`), its `Default`, a `Debug` that masks the endpoint's
/// credentials, and `validate_shared()` and `sdk()` for the sink's own `validate` and `build`.
macro_rules! aws_sink_config {
    (
        $(#[$doc:meta])*
        pub struct $name:ident {
            $(#[$target_doc:meta])*
            $target:ident,
            service: $service:literal,
            max_message_size: $default_max:expr, at most $max:expr,
            $(#[$max_doc:meta])*
        }
    ) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, serde::Deserialize, serde::Serialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct $name {
            $(#[$target_doc])*
            pub $target: Option<outbox_core::Destination>,
            /// The AWS region (`eu-west-1`). Default: the standard chain's (`AWS_REGION`,
            /// the profile's `region`).
            pub region: Option<String>,
            #[doc = concat!("Another endpoint for the ", $service, " API, for a local server                              (`http://127.0.0.1:5000`). Credentials in it are never printed.")]
            #[serde(serialize_with = "outbox_core::redact::serde_redacted::optional_url")]
            pub endpoint_url: Option<String>,
            $(#[$max_doc])*
            pub max_message_size: usize,
            /// Longest wait for a connection. Default `3s`.
            #[serde(with = "humantime_serde")]
            pub connect_timeout: std::time::Duration,
            /// Longest wait for one request's answer. Default `10s`.
            #[serde(with = "humantime_serde")]
            pub timeout: std::time::Duration,
            /// The message format: `plain` (the default), `cloudevents-binary` (the
            /// attributes as `ce-` message attributes) or `cloudevents-structured` (the JSON
            /// envelope as body) (`docs/sinks.md`, "CloudEvents").
            pub format: outbox_core::cloudevents::Format,
            /// CloudEvents `source`, a template with `{aggregate_type}`, `{event_type}` and
            /// `{aggregate_id}`. Default `urn:outbox:{aggregate_type}`. Only used by the
            /// CloudEvents formats.
            pub cloudevents_source: String,
            /// CloudEvents `datacontenttype` of an event without a `content-type` header.
            /// Default `application/json`. Only used by the CloudEvents formats.
            pub cloudevents_content_type: String,
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    $target: None,
                    region: None,
                    endpoint_url: None,
                    max_message_size: $default_max,
                    connect_timeout: std::time::Duration::from_secs(3),
                    timeout: std::time::Duration::from_secs(10),
                    format: outbox_core::cloudevents::Format::Plain,
                    cloudevents_source: crate::cloudevents::default_source(),
                    cloudevents_content_type: crate::cloudevents::default_content_type(),
                }
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field(stringify!($target), &self.$target.as_ref().map(|d| d.template()))
                    .field("region", &self.region)
                    .field(
                        "endpoint_url",
                        &self.endpoint_url.as_deref().map(crate::secret::redact_url),
                    )
                    .field("max_message_size", &self.max_message_size)
                    .field("connect_timeout", &self.connect_timeout)
                    .field("timeout", &self.timeout)
                    .field("format", &self.format)
                    .field("cloudevents_source", &self.cloudevents_source)
                    .field("cloudevents_content_type", &self.cloudevents_content_type)
                    .finish()
            }
        }

        impl $name {
            /// The checked `format`, `cloudevents_source` and `cloudevents_content_type`.
            fn message_format(
                &self,
            ) -> Result<outbox_core::cloudevents::MessageFormat, crate::ConfigError> {
                crate::cloudevents::message_format(
                    self.format,
                    &self.cloudevents_source,
                    &self.cloudevents_content_type,
                )
            }

            /// Checks the keys every AWS sink has.
            fn validate_shared(&self) -> Result<(), crate::ConfigError> {
                self.message_format()?;
                crate::aws::validate_shared(
                    self.region.as_deref(),
                    self.endpoint_url.as_deref(),
                    [
                        ("connect_timeout", self.connect_timeout),
                        ("timeout", self.timeout),
                    ],
                )?;
                if !(1024..=$max).contains(&self.max_message_size) {
                    return Err(crate::ConfigError::new(
                        "max_message_size",
                        format!(
                            "{} is out of range: {} accepts 1024 to {} bytes",
                            self.max_message_size, $service, $max
                        ),
                    ));
                }
                Ok(())
            }

            /// The SDK configuration these keys make, and where the sink sends.
            pub(crate) async fn connect(
                self,
            ) -> Result<(aws_config::SdkConfig, crate::aws::Place), outbox_core::SinkError> {
                let format = self
                    .message_format()
                    .map_err(|e| outbox_core::SinkError::rejected(e.to_string()))?;
                let sdk = crate::aws::sdk_config(
                    self.region.as_deref(),
                    self.endpoint_url.as_deref(),
                    self.connect_timeout,
                    self.timeout,
                )
                .await;
                let target = self.$target.ok_or_else(|| {
                    outbox_core::SinkError::rejected(concat!(
                        "sink.",
                        stringify!($target),
                        ": is required"
                    ))
                })?;
                let place = crate::aws::Place {
                    target,
                    max_message_size: self.max_message_size,
                    endpoint: crate::aws::endpoint_label($service, &sdk),
                    format,
                };
                Ok((sdk, place))
            }
        }
    };
}
pub(crate) use aws_sink_config;

/// Where an AWS sink sends and the limit it enforces.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    /// The queue URL, topic ARN or stream name template.
    pub(crate) target: outbox_core::Destination,
    /// The largest message sent; larger events are rejected.
    pub(crate) max_message_size: usize,
    /// The service and its endpoint for messages (`SQS at http://127.0.0.1:5000`), with any
    /// credentials masked.
    pub(crate) endpoint: String,
    /// `format` and the CloudEvents keys.
    pub(crate) format: outbox_core::cloudevents::MessageFormat,
}

impl Place {
    /// Awaits one SDK `call`; its failure as the [`SinkError`] of `what` (see
    /// [`request_error`]).
    pub(crate) async fn request<T, E>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, SdkError<E, HttpResponse>>>,
    ) -> Result<T, SinkError>
    where
        E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
    {
        call.await
            .map_err(|e| request_error(&self.endpoint, what, e))
    }
}

/// Checks the keys every AWS sink has.
pub(crate) fn validate_shared(
    region: Option<&str>,
    endpoint_url: Option<&str>,
    timeouts: [(&str, Duration); 2],
) -> Result<(), ConfigError> {
    if let Some(region) = region
        && (region.is_empty()
            || !region
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-'))
    {
        return Err(ConfigError::new(
            "region",
            format!("`{region}` is not an AWS region name (like `eu-west-1`)"),
        ));
    }
    if let Some(url) = endpoint_url {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(ConfigError::new(
                "endpoint_url",
                format!("`{}` must start with http:// or https://", redact_url(url)),
            ));
        }
        // AWS requests are signed with the credential chain's keys; a user or password in
        // the URL would never be used, and the SDK's own debug log prints the endpoint.
        let authority = url.split("://").nth(1).unwrap_or("").split('/').next();
        if authority.is_some_and(|a| a.contains('@')) {
            return Err(ConfigError::new(
                "endpoint_url",
                format!(
                    "`{}` must not carry a user or password: AWS requests are signed with the \
                     keys of the standard credential chain (environment, profile, role)",
                    redact_url(url)
                ),
            ));
        }
    }
    for (key, value) in timeouts {
        if value.is_zero() {
            return Err(ConfigError::new(key, "must be greater than 0"));
        }
    }
    Ok(())
}

/// Where the sink sends requests, for messages: `endpoint_url` (credentials masked) or the
/// service's regional endpoint.
pub(crate) fn endpoint_label(service: &str, config: &SdkConfig) -> String {
    match config.endpoint_url() {
        Some(url) => format!("{service} at {}", redact_url(url)),
        None => format!(
            "{service} in {}",
            config.region().map_or("the default region", |r| r.as_ref())
        ),
    }
}

/// The [`SinkError`] for a failed request, by what failed:
///
/// | failure | kind |
/// | --- | --- |
/// | no connection, timeout, no credentials, credentials refused, access denied | `Unavailable` (nothing about the events; the relay pauses) |
/// | throttling, a 5xx, an unreadable answer | `Transient` |
/// | any other error the service names (invalid parameter, missing queue or topic, ...) | `Rejected` |
pub(crate) fn request_error<E>(
    endpoint: &str,
    what: &str,
    err: SdkError<E, HttpResponse>,
) -> SinkError
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
{
    let detail = DisplayErrorContext(&err).to_string();
    match &err {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) => {
            SinkError::unavailable(format!("cannot reach {endpoint} ({what}): {detail}"))
        }
        SdkError::ConstructionFailure(_) => SinkError::unavailable(format!(
            "cannot sign the request to {endpoint} ({what}; are AWS credentials configured?): \
             {detail}"
        )),
        SdkError::ResponseError(_) => SinkError::transient(format!(
            "{endpoint} gave an unreadable answer ({what}): {detail}"
        )),
        SdkError::ServiceError(service) => {
            let code = service.err().code().unwrap_or("");
            let status = service.raw().status().as_u16();
            // The code and the service's message; the full context would dump the response.
            let detail = match service.err().message() {
                Some(message) if !code.is_empty() => format!("{code}: {message}"),
                Some(message) => message.to_owned(),
                None if !code.is_empty() => format!("{code} (HTTP {status})"),
                None => format!("HTTP {status}"),
            };
            service_error(endpoint, what, code, status, &detail)
        }
        _ => SinkError::transient(format!("{what} to {endpoint} failed: {detail}")),
    }
}

fn service_error(endpoint: &str, what: &str, code: &str, status: u16, detail: &str) -> SinkError {
    let message = format!("{what} to {endpoint} failed: {detail}");
    if is_auth_code(code) || status == 401 || status == 403 {
        SinkError::unavailable(message)
    } else if is_retryable_code(code) || status == 429 || status >= 500 {
        SinkError::transient(message)
    } else {
        SinkError::rejected(message)
    }
}

/// Error codes that say the credentials or permissions are wrong: nothing about the event.
pub(crate) fn is_auth_code(code: &str) -> bool {
    matches!(
        code,
        "AccessDenied"
            | "AccessDeniedException"
            | "AuthorizationError"
            | "InvalidClientTokenId"
            | "UnrecognizedClientException"
            | "SignatureDoesNotMatch"
            | "IncompleteSignature"
            | "ExpiredToken"
            | "ExpiredTokenException"
            | "MissingAuthenticationToken"
            | "InvalidSecurity"
            | "KMSAccessDeniedException"
            | "KMS.AccessDeniedException"
    )
}

/// Error codes that may pass on their own.
pub(crate) fn is_retryable_code(code: &str) -> bool {
    matches!(
        code,
        "Throttling"
            | "ThrottlingException"
            | "ThrottledException"
            | "RequestThrottled"
            | "RequestThrottledException"
            | "TooManyRequestsException"
            | "ProvisionedThroughputExceededException"
            | "LimitExceededException"
            | "KMSThrottlingException"
            | "KMS.ThrottlingException"
            | "ServiceUnavailable"
            | "InternalError"
            | "InternalFailure"
            | "InternalErrorException"
            | "AWS.SimpleQueueService.NonExistentQueue"
            | "QueueDoesNotExist"
            | "NotFound"
            | "NotFoundException"
            | "ResourceNotFoundException"
    )
}

/// One message ready to send, and which event of the batch it is.
#[derive(Debug)]
pub(crate) struct Pending<M> {
    /// The event's position in the batch.
    pub(crate) index: usize,
    /// What the service counts against its per-call size limit.
    pub(crate) size: usize,
    /// The message.
    pub(crate) message: M,
}

/// What the service answered for one entry of a batch call.
#[derive(Debug, Clone)]
pub(crate) enum EntryOutcome {
    /// Stored.
    Sent,
    /// Not stored: `retry` when it may pass (the service's fault, throttling), else the
    /// sender's fault; `reason` for people.
    Failed { retry: bool, reason: String },
}

/// How a service batches: at most `entries` entries and `bytes` bytes per call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchLimits {
    pub(crate) entries: usize,
    pub(crate) bytes: usize,
}

/// Calls in flight at once.
const CONCURRENCY: usize = 16;
/// Tries of an entry the service failed on its side, within one publish.
const ENTRY_ATTEMPTS: u32 = 3;
/// Pause before sending failed entries again alone (times the attempt number).
const ENTRY_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Sends every message of `targets` (`(target, messages in batch order)`) in calls of at most
/// `limits`, all calls at once (up to 16 in flight), awaiting every answer. Entries the
/// service failed on its side are sent again, alone, twice; an entry it refused as the
/// sender's fault is `Rejected`; a failed call fails its entries with the call's error.
/// `deliveries` holds what was already decided (one slot per event of the batch); returns one
/// delivery per event.
pub(crate) async fn send_batched<'a, M, F, Fut>(
    mut deliveries: Vec<Option<Delivery>>,
    targets: &'a Targets<M>,
    limits: BatchLimits,
    send: F,
) -> Result<Vec<Delivery>, SinkError>
where
    M: Sync,
    F: Fn(&'a str, Vec<&'a Pending<M>>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<EntryOutcome>, SinkError>> + 'a,
{
    let mut calls: Vec<(&'a str, Vec<&'a Pending<M>>)> = Vec::new();
    for (target, messages) in targets {
        let mut chunk: Vec<&Pending<M>> = Vec::new();
        let mut bytes = 0;
        for pending in messages {
            if chunk.len() == limits.entries
                || (!chunk.is_empty() && bytes + pending.size > limits.bytes)
            {
                calls.push((target, std::mem::take(&mut chunk)));
                bytes = 0;
            }
            bytes += pending.size;
            chunk.push(pending);
        }
        if !chunk.is_empty() {
            calls.push((target, chunk));
        }
    }
    let mut sends = Vec::with_capacity(calls.len());
    for (target, chunk) in calls {
        sends.push(send_with_retries(target, chunk, &send));
    }
    let answers: Vec<Vec<(usize, Delivery)>> = futures::stream::iter(sends)
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    for (index, delivery) in answers.into_iter().flatten() {
        deliveries[index] = Some(delivery);
    }
    crate::broker::collapse_decided(deliveries, "message not sent")
}

/// One call's messages, failed entries sent again alone; `(batch index, delivery)` each.
async fn send_with_retries<'a, M, F, Fut>(
    target: &'a str,
    chunk: Vec<&'a Pending<M>>,
    send: &F,
) -> Vec<(usize, Delivery)>
where
    F: Fn(&'a str, Vec<&'a Pending<M>>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<EntryOutcome>, SinkError>> + 'a,
{
    let mut done: Vec<(usize, Delivery)> = Vec::with_capacity(chunk.len());
    let mut pending = chunk;
    for attempt in 1..=ENTRY_ATTEMPTS {
        if attempt > 1 {
            tokio::time::sleep(ENTRY_RETRY_PAUSE * attempt).await;
        }
        let outcomes = match send(target, pending.clone()).await {
            Ok(outcomes) => outcomes,
            Err(e) => {
                done.extend(pending.iter().map(|p| (p.index, Err(e.clone()))));
                return done;
            }
        };
        let mut again = Vec::new();
        for (position, p) in pending.iter().enumerate() {
            match outcomes.get(position) {
                Some(EntryOutcome::Sent) => done.push((p.index, Ok(()))),
                Some(EntryOutcome::Failed {
                    retry: false,
                    reason,
                }) => done.push((p.index, Err(SinkError::rejected(reason.clone())))),
                Some(EntryOutcome::Failed {
                    retry: true,
                    reason,
                }) => {
                    if attempt == ENTRY_ATTEMPTS {
                        done.push((p.index, Err(SinkError::transient(reason.clone()))));
                    } else {
                        again.push(*p);
                    }
                }
                None => {
                    let reason = format!("{target} gave no answer for one entry of the batch");
                    if attempt == ENTRY_ATTEMPTS {
                        done.push((p.index, Err(SinkError::transient(reason))));
                    } else {
                        again.push(*p);
                    }
                }
            }
        }
        if again.is_empty() {
            break;
        }
        tracing::debug!(
            target = target,
            failed = again.len(),
            attempt,
            "the service failed some entries of a batch; sending them again alone"
        );
        pending = again;
    }
    done
}

/// Messages per target (queue URL, topic ARN, stream), each target once, in first-use order.
pub(crate) type Targets<M> = Vec<(String, Vec<Pending<M>>)>;

/// The events of `batch` by target (queue URL, topic ARN, stream), in batch order, each made
/// into a message by `make(index, event, target)`; an event `make` refuses has its delivery
/// decided already.
pub(crate) fn plan<M>(
    batch: &[Event],
    target_of: impl Fn(&Event) -> String,
    make: impl Fn(usize, &Event, &str) -> Result<Pending<M>, SinkError>,
) -> (Vec<Option<Delivery>>, Targets<M>) {
    let mut deliveries: Vec<Option<Delivery>> = vec![None; batch.len()];
    let mut targets: Targets<M> = Vec::new();
    for (i, event) in batch.iter().enumerate() {
        let target = target_of(event);
        match make(i, event, &target) {
            Err(e) => deliveries[i] = Some(Err(e)),
            Ok(pending) => match targets.iter_mut().find(|(t, _)| *t == target) {
                Some((_, messages)) => messages.push(pending),
                None => targets.push((target, vec![pending])),
            },
        }
    }
    (deliveries, targets)
}
