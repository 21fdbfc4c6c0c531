//! `key = "aws-kms:<key id, ARN or alias>"`: data keys from KMS `GenerateDataKey`, unwrapped
//! by consumers with KMS `Decrypt`.
//!
//! Every failure of the relay's `GenerateDataKey` says nothing about the event (KMS cannot
//! be reached, refuses the caller, or the key is missing or disabled), so all are
//! `Unavailable`: the relay pauses and retries, nothing is dead-lettered.

use std::time::Duration;

use aws_sdk_kms::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_kms::primitives::Blob;
use aws_sdk_kms::types::DataKeySpec;
use base64::Engine as _;
use outbox_core::SinkError;

use super::data_key::{AesKey, DataKey};
use crate::DecodeError;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const TIMEOUT: Duration = Duration::from_secs(10);

/// A KMS client, and where it sends (for messages).
pub(super) struct Kms {
    client: aws_sdk_kms::Client,
    endpoint: String,
}

impl std::fmt::Debug for Kms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kms")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Kms {
    /// A client through the standard AWS chain, `region` and `endpoint_url` when set. One
    /// SDK retry: an outage surfaces quickly and the relay backs off itself. No request.
    pub(super) async fn new(region: Option<&str>, endpoint_url: Option<&str>) -> Self {
        let sdk = crate::aws::sdk_config(region, endpoint_url, CONNECT_TIMEOUT, TIMEOUT).await;
        let endpoint = crate::aws::describe("KMS", &sdk);
        Self {
            client: aws_sdk_kms::Client::new(&sdk),
            endpoint,
        }
    }

    /// A new data key of `key_id` (`GenerateDataKey`, AES_256): its id is the key ARN KMS
    /// answers with, its wrapped form the `CiphertextBlob`.
    pub(super) async fn new_data_key(&self, key_id: &str) -> Result<DataKey, SinkError> {
        let output = self
            .client
            .generate_data_key()
            .key_id(key_id)
            .key_spec(DataKeySpec::Aes256)
            .send()
            .await
            .map_err(|e| self.generate_error(key_id, e))?;
        let (Some(plaintext), Some(blob)) = (output.plaintext(), output.ciphertext_blob()) else {
            return Err(SinkError::unavailable(format!(
                "{} answered GenerateDataKey on {key_id} without a data key",
                self.endpoint
            )));
        };
        let len = plaintext.as_ref().len();
        let key = AesKey::take(&mut plaintext.as_ref().to_vec()).ok_or_else(|| {
            SinkError::unavailable(format!(
                "{} answered GenerateDataKey on {key_id} with a data key of {len} bytes, not 32",
                self.endpoint
            ))
        })?;
        Ok(DataKey {
            key,
            key_id: output.key_id().unwrap_or(key_id).to_owned(),
            wrapped: base64::engine::general_purpose::STANDARD.encode(blob.as_ref()),
        })
    }

    fn generate_error<E>(&self, key_id: &str, err: SdkError<E>) -> SinkError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let endpoint = &self.endpoint;
        let Some((code, detail)) = refusal(&err) else {
            if let SdkError::ConstructionFailure(_) = err {
                return SinkError::unavailable(format!(
                    "cannot sign GenerateDataKey on {key_id} to {endpoint} (are AWS credentials \
                     configured?): {}",
                    DisplayErrorContext(&err)
                ));
            }
            return SinkError::unavailable(format!(
                "cannot reach {endpoint} (GenerateDataKey on {key_id}): {}",
                DisplayErrorContext(&err)
            ));
        };
        SinkError::unavailable(match code.as_str() {
            "AccessDeniedException" | "AccessDenied" => format!(
                "KMS refused GenerateDataKey on {key_id}: give the relay kms:GenerateDataKey on \
                 that key ({detail})"
            ),
            "NotFoundException" => {
                format!("KMS has no key {key_id} ({detail}): check encryption.key and the region")
            }
            "DisabledException" => format!(
                "the KMS key {key_id} is disabled ({detail}): enable it, or change encryption.key"
            ),
            "KMSInvalidStateException" => format!(
                "the KMS key {key_id} cannot be used in its state ({detail}): it may be pending \
                 deletion or import"
            ),
            _ => format!("GenerateDataKey on {key_id} to {endpoint} failed: {detail}"),
        })
    }

    /// The data key wrapped as `blob` (KMS `Decrypt`; the blob names its key).
    pub(super) async fn unwrap(&self, blob: Vec<u8>, key_id: &str) -> Result<AesKey, DecodeError> {
        let output = self
            .client
            .decrypt()
            .ciphertext_blob(Blob::new(blob))
            .send()
            .await
            .map_err(|e| self.decrypt_error(key_id, e))?;
        let Some(plaintext) = output.plaintext() else {
            return Err(DecodeError::Unavailable(format!(
                "{} answered Decrypt of a data key of {key_id} without the key",
                self.endpoint
            )));
        };
        AesKey::take(&mut plaintext.as_ref().to_vec()).ok_or_else(|| {
            DecodeError::Invalid(format!(
                "the data key of {key_id} that KMS decrypted is not a 256-bit key"
            ))
        })
    }

    fn decrypt_error<E>(&self, key_id: &str, err: SdkError<E>) -> DecodeError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let endpoint = &self.endpoint;
        let Some((code, detail)) = refusal(&err) else {
            return DecodeError::Unavailable(format!(
                "cannot reach {endpoint} (Decrypt of a data key of {key_id}): {}",
                DisplayErrorContext(&err)
            ));
        };
        match code.as_str() {
            "InvalidCiphertextException" | "IncorrectKeyException" => {
                DecodeError::Invalid(format!(
                    "KMS cannot decrypt the data key of {key_id} ({detail}): the \
                     encryption_data_key header was altered or belongs to another key"
                ))
            }
            "AccessDeniedException" | "AccessDenied" => DecodeError::Unavailable(format!(
                "KMS refused Decrypt with {key_id}: give the consumer kms:Decrypt on that key \
                 ({detail})"
            )),
            _ => DecodeError::Unavailable(format!(
                "Decrypt of a data key of {key_id} to {endpoint} failed: {detail}"
            )),
        }
    }
}

/// The error code and the service's message when KMS answered with a refusal; `None` when
/// it was not reached (or the request could not be made).
fn refusal<E: ProvideErrorMetadata>(err: &SdkError<E>) -> Option<(String, String)> {
    let SdkError::ServiceError(service) = err else {
        return None;
    };
    let status = service.raw().status().as_u16();
    let code = service.err().code().unwrap_or("").to_owned();
    // The code and the message; the full context would dump the response.
    let detail = match (service.err().code(), service.err().message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => format!("{code} (HTTP {status})"),
        (None, Some(message)) => message.to_owned(),
        (None, None) => format!("HTTP {status}"),
    };
    Some((code, detail))
}

#[cfg(test)]
mod tests {
    use aws_sdk_kms::error::ErrorMetadata;
    use aws_sdk_kms::operation::decrypt::DecryptError;
    use aws_sdk_kms::operation::generate_data_key::GenerateDataKeyError;
    use aws_smithy_runtime_api::http::{Response, StatusCode};
    use aws_smithy_types::body::SdkBody;
    use outbox_core::SinkErrorKind;

    use super::*;

    /// KMS's answer `code` with HTTP 400, as the SDK hands it over.
    fn answer<E>(error: E) -> SdkError<E> {
        let status = StatusCode::try_from(400u16).unwrap_or_else(|_| unreachable!());
        SdkError::service_error(error, Response::new(status, SdkBody::empty()))
    }

    fn meta(code: &str) -> ErrorMetadata {
        ErrorMetadata::builder()
            .code(code)
            .message("arn:aws:kms:eu-west-1:1:key/k says no")
            .build()
    }

    async fn kms() -> Kms {
        Kms::new(Some("eu-west-1"), Some("http://127.0.0.1:9")).await
    }

    /// moto does not emulate these refusals; the mapping of KMS's documented codes.
    #[tokio::test]
    async fn refusals_of_generate_data_key_are_unavailable_and_say_what_to_do() {
        let kms = kms().await;
        for (code, expected) in [
            (
                "AccessDeniedException",
                "KMS refused GenerateDataKey on alias/k: give the relay kms:GenerateDataKey",
            ),
            ("DisabledException", "the KMS key alias/k is disabled"),
            ("NotFoundException", "KMS has no key alias/k"),
            (
                "KMSInvalidStateException",
                "the KMS key alias/k cannot be used",
            ),
            (
                "KMSInternalException",
                "GenerateDataKey on alias/k to KMS at",
            ),
        ] {
            let err =
                kms.generate_error("alias/k", answer(GenerateDataKeyError::generic(meta(code))));
            assert_eq!(err.kind(), SinkErrorKind::Unavailable, "{code}");
            assert!(err.to_string().starts_with(expected), "{code}: {err}");
            assert!(err.to_string().contains(code), "{code}: {err}");
        }
    }

    #[tokio::test]
    async fn refusals_of_decrypt_say_whether_to_wait() {
        let kms = kms().await;
        let err = kms.decrypt_error(
            "k",
            answer(DecryptError::generic(meta("AccessDeniedException"))),
        );
        assert!(
            matches!(&err, DecodeError::Unavailable(m) if m.contains("give the consumer kms:Decrypt")),
            "{err:?}"
        );
        let err = kms.decrypt_error(
            "k",
            answer(DecryptError::generic(meta("InvalidCiphertextException"))),
        );
        assert!(matches!(err, DecodeError::Invalid(_)), "{err:?}");
        let err = kms.decrypt_error(
            "k",
            answer(DecryptError::generic(meta("DisabledException"))),
        );
        assert!(matches!(err, DecodeError::Unavailable(_)), "{err:?}");
    }
}
