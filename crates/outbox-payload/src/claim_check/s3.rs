//! The `s3://bucket/prefix` store through the AWS SDK: the relay's writes, `outbox doctor`'s
//! check, `outbox migrate`'s lifecycle rule, and the consumer's reads.

use std::error::Error as StdError;
use std::time::Duration;

use aws_sdk_s3::Client;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    BucketLifecycleConfiguration, ExpirationStatus, LifecycleExpiration, LifecycleRule,
    LifecycleRuleFilter, TransitionDefaultMinimumObjectSize,
};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::display::DisplayErrorContext;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use bytes::Bytes;
use outbox_core::SinkError;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use uuid::Uuid;

use crate::DecodeError;

/// Longest wait for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest wait for one attempt of a request (a payload of some MiB included).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);
/// S3's longest object key, in bytes.
const MAX_KEY: usize = 1024;
/// Metadata values are HTTP header values: anything but printable ASCII is percent-encoded.
const METADATA: &AsciiSet = &CONTROLS.add(b'%');

/// An S3 client as the AWS sinks make theirs: the standard credential chain, `region` and
/// `endpoint_url` when set (path-style addressing with an endpoint: moto, MinIO), two
/// attempts per request, 3 s to connect and 30 s per attempt. Also returns where requests
/// go, for messages (`S3 at http://127.0.0.1:5000`, credentials masked).
pub(super) async fn client(region: Option<&str>, endpoint_url: Option<&str>) -> (Client, String) {
    let sdk = crate::aws::sdk_config(region, endpoint_url, CONNECT_TIMEOUT, ATTEMPT_TIMEOUT).await;
    let mut config = aws_sdk_s3::config::Builder::from(&sdk);
    if endpoint_url.is_some() {
        config = config.force_path_style(true);
    }
    let endpoint = crate::aws::describe("S3", &sdk);
    (Client::from_conf(config.build()), endpoint)
}

/// How a request failed.
enum Failure {
    /// No answer: connection refused, timeout.
    Unreachable(String),
    /// The request could not be built or signed (no credentials).
    Unsigned(String),
    /// The service answered with an error.
    Service {
        code: String,
        status: u16,
        detail: String,
    },
    /// Anything else (an unreadable answer).
    Other(String),
}

impl Failure {
    fn of<E>(err: SdkError<E, HttpResponse>) -> Self
    where
        E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
    {
        let detail = DisplayErrorContext(&err).to_string();
        match &err {
            SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) => Self::Unreachable(detail),
            SdkError::ConstructionFailure(_) => Self::Unsigned(detail),
            SdkError::ServiceError(service) => {
                let code = service.err().code().unwrap_or("").to_owned();
                let status = service.raw().status().as_u16();
                // The code and the service's message; the full context would dump the answer.
                let detail = match service.err().message() {
                    Some(message) if !code.is_empty() => format!("{code}: {message}"),
                    Some(message) => message.to_owned(),
                    None if !code.is_empty() => format!("{code} (HTTP {status})"),
                    None => format!("HTTP {status}"),
                };
                Self::Service {
                    code,
                    status,
                    detail,
                }
            }
            _ => Self::Other(detail),
        }
    }

    /// The credentials or permissions are wrong: the code (or `HTTP 403`) when so.
    fn denied(&self) -> Option<String> {
        match self {
            Self::Service { code, status, .. }
                if is_auth_code(code) || *status == 401 || *status == 403 =>
            {
                Some(if code.is_empty() {
                    format!("HTTP {status}")
                } else {
                    code.clone()
                })
            }
            _ => None,
        }
    }

    fn code(&self) -> &str {
        match self {
            Self::Service { code, .. } => code,
            _ => "",
        }
    }

    fn detail(&self) -> &str {
        match self {
            Self::Unreachable(d) | Self::Unsigned(d) | Self::Other(d) => d,
            Self::Service { detail, .. } => detail,
        }
    }
}

/// Error codes that say the credentials or permissions are wrong.
fn is_auth_code(code: &str) -> bool {
    matches!(
        code,
        "AccessDenied"
            | "AllAccessDisabled"
            | "InvalidAccessKeyId"
            | "InvalidClientTokenId"
            | "SignatureDoesNotMatch"
            | "ExpiredToken"
            | "TokenRefreshRequired"
            | "InvalidToken"
            | "AccountProblem"
    )
}

/// What a request needs, for the message when it is refused: `what` was refused; give the
/// relay `action` on `resource`.
struct Needs<'a> {
    what: &'a str,
    action: &'a str,
    resource: String,
}

/// One object to write.
pub(super) struct Put<'a> {
    pub(super) key: &'a str,
    pub(super) body: &'a Bytes,
    pub(super) event_id: &'a str,
    pub(super) aggregate_type: &'a str,
    pub(super) event_type: &'a str,
    pub(super) content_type: &'a str,
}

/// A bucket and prefix holding claim-checked payloads.
pub(super) struct S3Store {
    client: Client,
    /// Where requests go, for messages.
    endpoint: String,
    bucket: String,
    /// Without a trailing `/`; may be empty.
    prefix: String,
    /// The lifecycle rule's expiration.
    keep_days: i32,
}

impl S3Store {
    /// The store; no request is made.
    pub(super) async fn connect(
        bucket: &str,
        prefix: &str,
        keep_days: i32,
        region: Option<&str>,
        endpoint_url: Option<&str>,
    ) -> Self {
        let (client, endpoint) = client(region, endpoint_url).await;
        Self {
            client,
            endpoint,
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
            keep_days,
        }
    }

    /// `prefix/`, or empty.
    fn key_prefix(&self) -> String {
        if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        }
    }

    /// `s3://bucket/prefix/`, for messages.
    fn label(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.key_prefix())
    }

    /// The ARN of every object under the prefix.
    fn objects_arn(&self) -> String {
        format!("arn:aws:s3:::{}/{}*", self.bucket, self.key_prefix())
    }

    fn bucket_arn(&self) -> String {
        format!("arn:aws:s3:::{}", self.bucket)
    }

    /// `outbox-claim-check-<prefix>`, or `outbox-claim-check-all` without a prefix.
    fn rule_id(&self) -> String {
        let name = if self.prefix.is_empty() {
            "all"
        } else {
            &self.prefix
        };
        format!("outbox-claim-check-{name}")
    }

    /// The [`SinkError`] for a failed request. Every failure is `Unavailable` (retried,
    /// never dead-lettered: the store, not the event, is at fault) except S3's refusals of
    /// the object itself (key or metadata too long), which are `Rejected`.
    fn error(&self, needs: &Needs<'_>, failure: Failure) -> SinkError {
        let endpoint = &self.endpoint;
        if let Some(code) = failure.denied() {
            return SinkError::unavailable(format!(
                "the claim-check store refused {} ({code}): give the relay {} on {}",
                needs.what, needs.action, needs.resource
            ));
        }
        match failure {
            Failure::Unreachable(detail) => SinkError::unavailable(format!(
                "cannot reach the claim-check store ({endpoint}): {detail}"
            )),
            Failure::Unsigned(detail) => SinkError::unavailable(format!(
                "cannot sign the request to the claim-check store ({endpoint}; are AWS \
                 credentials configured?): {detail}"
            )),
            Failure::Service { code, .. } if code == "NoSuchBucket" => self.no_bucket(),
            Failure::Service { code, detail, .. }
                if matches!(
                    code.as_str(),
                    "KeyTooLongError" | "MetadataTooLarge" | "EntityTooLarge"
                ) =>
            {
                SinkError::rejected(format!(
                    "the claim-check store refused the object ({endpoint}): {detail}"
                ))
            }
            failure => SinkError::unavailable(format!(
                "the claim-check store ({endpoint}) failed {}: {}",
                needs.what,
                failure.detail()
            )),
        }
    }

    fn no_bucket(&self) -> SinkError {
        SinkError::unavailable(format!(
            "the claim-check bucket `{}` does not exist ({}): create it, or correct \
             claim_check.store",
            self.bucket, self.endpoint
        ))
    }

    fn put_needs(&self) -> Needs<'static> {
        Needs {
            what: "the write",
            action: "s3:PutObject",
            resource: self.objects_arn(),
        }
    }

    /// Writes one object (replacing what is there: a retry writes the same key).
    pub(super) async fn put(&self, object: Put<'_>) -> Result<(), SinkError> {
        if object.key.len() > MAX_KEY {
            return Err(SinkError::rejected(format!(
                "the claim-check object key would be {} bytes, over S3's limit of {MAX_KEY} \
                 (the prefix and the aggregate type are too long)",
                object.key.len()
            )));
        }
        let metadata = |value: &str| utf8_percent_encode(value, METADATA).to_string();
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(object.key)
            .content_type(object.content_type)
            .content_length(i64::try_from(object.body.len()).unwrap_or(i64::MAX))
            .metadata("event-id", object.event_id)
            .metadata("aggregate-type", metadata(object.aggregate_type))
            .metadata("event-type", metadata(object.event_type))
            .body(ByteStream::from(object.body.clone()))
            .send()
            .await
            .map_err(|e| self.error(&self.put_needs(), Failure::of(e)))?;
        Ok(())
    }

    /// `outbox doctor`: the bucket exists, an object can be written under the prefix, and a
    /// lifecycle rule expires the objects after `keep`.
    pub(super) async fn check(&self) -> Result<String, SinkError> {
        let mut notes = Vec::new();
        if let Err(e) = self.client.head_bucket().bucket(&self.bucket).send().await {
            if e.as_service_error().is_some_and(|s| s.is_not_found()) {
                return Err(self.no_bucket());
            }
            let failure = Failure::of(e);
            if failure.denied().is_none() {
                let needs = Needs {
                    what: "HeadBucket",
                    action: "s3:ListBucket",
                    resource: self.bucket_arn(),
                };
                return Err(self.error(&needs, failure));
            }
            // The relay itself never needs s3:ListBucket: go on with the write.
            notes.push(format!(
                "the bucket itself was not checked (HeadBucket needs s3:ListBucket on {})",
                self.bucket_arn()
            ));
        }
        let probe = format!("{}.outbox-doctor-{}", self.key_prefix(), Uuid::new_v4());
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(&probe)
            .body(ByteStream::from_static(b"outbox doctor probe"))
            .send()
            .await
            .map_err(|e| self.error(&self.put_needs(), Failure::of(e)))?;
        if let Err(e) = self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(&probe)
            .send()
            .await
        {
            let failure = Failure::of(e);
            notes.push(format!(
                "the probe object s3://{}/{probe} could not be deleted ({}); the lifecycle \
                 rule expires it",
                self.bucket,
                failure.detail()
            ));
        }
        let (rules, _) = self.rules().await?;
        let key_prefix = self.key_prefix();
        let shortest = rules
            .iter()
            .filter_map(|rule| Some((rule, expiry_days(rule, &key_prefix)?)))
            .min_by_key(|(_, days)| *days);
        let Some((rule, days)) = shortest else {
            return Err(SinkError::rejected(format!(
                "no enabled lifecycle rule of bucket `{}` expires the objects under {}: run \
                 `outbox migrate` (it sets rule `{}`), or add one expiring them after {} days",
                self.bucket,
                self.label(),
                self.rule_id(),
                self.keep_days
            )));
        };
        let rule_id = rule.id().unwrap_or("(no id)");
        if days != self.keep_days {
            return Err(SinkError::rejected(format!(
                "lifecycle rule `{rule_id}` of bucket `{}` expires the objects under {} after \
                 {days} days, but claim_check.keep is {} days: run `outbox migrate`, or change \
                 the rule or keep",
                self.bucket,
                self.label(),
                self.keep_days
            )));
        }
        let mut out = format!(
            "{} ({}): writable; objects expire after {days} days (lifecycle rule `{rule_id}`)",
            self.label(),
            self.endpoint
        );
        for note in notes {
            out.push_str("; ");
            out.push_str(&note);
        }
        Ok(out)
    }

    /// The bucket's lifecycle rules (none when it has no configuration).
    async fn rules(
        &self,
    ) -> Result<
        (
            Vec<LifecycleRule>,
            Option<TransitionDefaultMinimumObjectSize>,
        ),
        SinkError,
    > {
        match self
            .client
            .get_bucket_lifecycle_configuration()
            .bucket(&self.bucket)
            .send()
            .await
        {
            Ok(out) => Ok((
                out.rules().to_vec(),
                out.transition_default_minimum_object_size().cloned(),
            )),
            Err(e)
                if e.as_service_error().and_then(|s| s.code())
                    == Some("NoSuchLifecycleConfiguration") =>
            {
                Ok((Vec::new(), None))
            }
            Err(e) => {
                let needs = Needs {
                    what: "reading the lifecycle rules",
                    action: "s3:GetLifecycleConfiguration",
                    resource: self.bucket_arn(),
                };
                Err(self.error(&needs, Failure::of(e)))
            }
        }
    }

    /// `outbox migrate`: adds (or replaces) rule `outbox-claim-check-<prefix>` expiring the
    /// objects under the prefix after `keep` days; the bucket's other rules stay.
    pub(super) async fn ensure_expiry(&self) -> Result<String, SinkError> {
        let (rules, minimum_size) = self.rules().await?;
        let id = self.rule_id();
        let key_prefix = self.key_prefix();
        let described = format!(
            "lifecycle rule `{id}` of bucket `{}` expires the objects under {} after {} days",
            self.bucket,
            self.label(),
            self.keep_days
        );
        let ours = |rule: &LifecycleRule| rule.id() == Some(id.as_str());
        if rules.iter().any(|rule| {
            ours(rule)
                && rule_prefix(rule) == Some(key_prefix.as_str())
                && expiry_days(rule, &key_prefix) == Some(self.keep_days)
        }) {
            return Ok(format!("{described} (already set)"));
        }
        let rule = LifecycleRule::builder()
            .id(&id)
            .filter(LifecycleRuleFilter::builder().prefix(&key_prefix).build())
            .status(ExpirationStatus::Enabled)
            .expiration(LifecycleExpiration::builder().days(self.keep_days).build())
            .build()
            .map_err(|e| SinkError::rejected(format!("building the lifecycle rule: {e}")))?;
        let mut kept: Vec<LifecycleRule> = rules.into_iter().filter(|r| !ours(r)).collect();
        kept.push(rule);
        let configuration = BucketLifecycleConfiguration::builder()
            .set_rules(Some(kept))
            .build()
            .map_err(|e| SinkError::rejected(format!("building the lifecycle rules: {e}")))?;
        self.client
            .put_bucket_lifecycle_configuration()
            .bucket(&self.bucket)
            .lifecycle_configuration(configuration)
            .set_transition_default_minimum_object_size(minimum_size)
            .send()
            .await
            .map_err(|e| {
                let needs = Needs {
                    what: "setting the lifecycle rules",
                    action: "s3:PutLifecycleConfiguration",
                    resource: self.bucket_arn(),
                };
                self.error(&needs, Failure::of(e))
            })?;
        Ok(format!("{described} (set)"))
    }
}

/// The prefix a rule applies to, when it applies to every object under it (no tag or size
/// condition).
fn rule_prefix(rule: &LifecycleRule) -> Option<&str> {
    match rule.filter() {
        Some(filter) => {
            let narrower = filter.tag().is_some()
                || filter.and().is_some()
                || filter.object_size_greater_than().is_some()
                || filter.object_size_less_than().is_some();
            (!narrower).then(|| filter.prefix().unwrap_or(""))
        }
        // A rule written before filters existed has its prefix on the rule itself.
        #[allow(deprecated)]
        None => Some(rule.prefix().unwrap_or("")),
    }
}

/// After how many days `rule` expires every object whose key starts with `key_prefix`, if
/// it is enabled and does.
fn expiry_days(rule: &LifecycleRule, key_prefix: &str) -> Option<i32> {
    if rule.status() != &ExpirationStatus::Enabled {
        return None;
    }
    if !key_prefix.starts_with(rule_prefix(rule)?) {
        return None;
    }
    rule.expiration()?.days().filter(|d| *d > 0)
}

/// The consumer's side: the object of `url` (`s3://bucket/key`).
pub(super) async fn read(client: &Client, endpoint: &str, url: &str) -> Result<Bytes, DecodeError> {
    let invalid = || DecodeError::Invalid(format!("claim_check `{url}` is not s3://bucket/key"));
    let rest = url.strip_prefix("s3://").ok_or_else(invalid)?;
    let (bucket, key) = rest.split_once('/').ok_or_else(invalid)?;
    if key.is_empty() || super::location::check_bucket(bucket).is_err() {
        return Err(invalid());
    }
    let answer = match client.get_object().bucket(bucket).key(key).send().await {
        Ok(answer) => answer,
        Err(e) => {
            let no_key = e.as_service_error().is_some_and(|s| s.is_no_such_key());
            let failure = Failure::of(e);
            return Err(if no_key {
                DecodeError::Invalid(format!(
                    "no claim-checked payload at {url}: it expired (claim_check.keep) or was \
                     deleted"
                ))
            } else if let Some(code) = failure.denied() {
                DecodeError::Unavailable(format!(
                    "the claim-check store refused the read of {url} ({code}): give the \
                     consumer s3:GetObject on arn:aws:s3:::{bucket}/{key}"
                ))
            } else {
                match &failure {
                    Failure::Service { status, .. }
                        if *status < 500 && failure.code() != "NoSuchBucket" =>
                    {
                        DecodeError::Invalid(format!(
                            "the claim-check store ({endpoint}) refused to read {url}: {}",
                            failure.detail()
                        ))
                    }
                    _ => DecodeError::Unavailable(format!(
                        "cannot read {url} from the claim-check store ({endpoint}): {}",
                        failure.detail()
                    )),
                }
            });
        }
    };
    let body = answer.body.collect().await.map_err(|e| {
        DecodeError::Unavailable(format!(
            "reading {url} from the claim-check store ({endpoint}) failed midway: {e}"
        ))
    })?;
    Ok(body.into_bytes())
}

#[cfg(test)]
mod tests;
