//! The data key: AES-256-GCM sealing and opening with it, random nonces, and the relay's cache
//! that replaces it every `rotate`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom as _, SystemRandom};
use tokio::sync::Mutex;

/// Bytes of an AES-256 key.
pub(super) const KEY_LEN: usize = 32;

/// A 256-bit AES-GCM key ready to use. Its bytes are not kept (ring holds the expanded key),
/// and nothing of it is printed.
pub(super) struct AesKey(LessSafeKey);

impl AesKey {
    /// The key of these 32 bytes (`None` for another length).
    pub(super) fn new(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != KEY_LEN {
            return None;
        }
        UnboundKey::new(&AES_256_GCM, bytes)
            .ok()
            .map(|key| Self(LessSafeKey::new(key)))
    }

    /// The key of these 32 bytes (`None` for another length); `bytes` is wiped either way.
    pub(super) fn take(bytes: &mut [u8]) -> Option<Self> {
        let key = Self::new(bytes);
        wipe(bytes);
        key
    }

    /// `ciphertext ‖ tag` of `plaintext` under `nonce` and `aad`.
    pub(super) fn seal(&self, nonce: [u8; NONCE_LEN], aad: &[u8], plaintext: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(plaintext.len() + AES_256_GCM.tag_len());
        out.extend_from_slice(plaintext);
        // Sealing fails only when the plaintext exceeds GCM's limit (64 GiB), which no
        // message reaches; the result is then empty and the consumer's open fails.
        if self
            .0
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut out,
            )
            .is_err()
        {
            out.clear();
        }
        out
    }

    /// The plaintext of `ciphertext ‖ tag`, or `None` when it fails authentication.
    pub(super) fn open(
        &self,
        nonce: [u8; NONCE_LEN],
        aad: &[u8],
        ciphertext_and_tag: &[u8],
    ) -> Option<Vec<u8>> {
        let mut buf = ciphertext_and_tag.to_vec();
        let len = self
            .0
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut buf,
            )
            .ok()?
            .len();
        buf.truncate(len);
        Some(buf)
    }

    /// `nonce ‖ ciphertext ‖ tag` with a fresh random nonce.
    pub(super) fn seal_with_nonce(
        &self,
        aad: &[u8],
        plaintext: &[u8],
    ) -> Result<Vec<u8>, RandomFailed> {
        let nonce = random::<NONCE_LEN>()?;
        let mut out = Vec::with_capacity(NONCE_LEN + plaintext.len() + AES_256_GCM.tag_len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&self.seal(nonce, aad, plaintext));
        Ok(out)
    }

    /// The plaintext of `nonce ‖ ciphertext ‖ tag`, or `None` when it is too short or fails
    /// authentication.
    pub(super) fn open_with_nonce(&self, aad: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
        if sealed.len() < NONCE_LEN + AES_256_GCM.tag_len() {
            return None;
        }
        let (nonce, rest) = sealed.split_at(NONCE_LEN);
        self.open(nonce.try_into().ok()?, aad, rest)
    }
}

/// The system's random source failed (it does not, in practice).
#[derive(Debug, Clone, Copy)]
pub(super) struct RandomFailed;

/// `N` bytes from the system's secure random source.
pub(super) fn random<const N: usize>() -> Result<[u8; N], RandomFailed> {
    let mut out = [0u8; N];
    SystemRandom::new()
        .fill(&mut out)
        .map_err(|_| RandomFailed)?;
    Ok(out)
}

/// Overwrites `bytes` with zeros (best effort: `black_box` keeps the compiler from dropping
/// the writes as dead stores).
pub(super) fn wipe(bytes: &mut [u8]) {
    bytes.fill(0);
    std::hint::black_box(bytes);
}

/// One data key of the relay: the key, the id of the key that wrapped it and the wrapped
/// form, as the headers carry them.
pub(super) struct DataKey {
    pub(super) key: AesKey,
    /// `encryption_key_id`.
    pub(super) key_id: String,
    /// `encryption_data_key`: base64 of the wrapped key.
    pub(super) wrapped: String,
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataKey")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// What [`DataKeyCache`] reads the time from; tests pass their own.
pub(super) type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// The relay's current data key, replaced once it is `rotate` old. Callers that find it
/// stale at the same time wait for one new key (one `GenerateDataKey`).
pub(super) struct DataKeyCache {
    rotate: Duration,
    clock: Clock,
    current: Mutex<Option<(Arc<DataKey>, Instant)>>,
}

impl DataKeyCache {
    pub(super) fn new(rotate: Duration, clock: Clock) -> Self {
        Self {
            rotate,
            clock,
            current: Mutex::new(None),
        }
    }

    /// The current data key, or a new one from `make` when there is none or it is `rotate`
    /// old. An error of `make` is returned, and the old key is not used again.
    pub(super) async fn get<F, Fut, E>(&self, make: F) -> Result<Arc<DataKey>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<DataKey, E>>,
    {
        let mut current = self.current.lock().await;
        let now = (self.clock)();
        if let Some((key, made)) = current.as_ref()
            && now.saturating_duration_since(*made) < self.rotate
        {
            return Ok(Arc::clone(key));
        }
        *current = None;
        let key = Arc::new(make().await?);
        *current = Some((Arc::clone(&key), (self.clock)()));
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn data_key(n: u8) -> DataKey {
        DataKey {
            key: AesKey::new(&[n; KEY_LEN]).unwrap_or_else(|| unreachable!()),
            key_id: "test".into(),
            wrapped: n.to_string(),
        }
    }

    /// Callers that find no key at the same time wait for one `make`: each `make` yields to
    /// the others several times before it answers, as a KMS call would.
    #[tokio::test]
    async fn concurrent_callers_share_one_new_data_key() {
        let cache = Arc::new(DataKeyCache::new(
            Duration::from_secs(60),
            Arc::new(Instant::now),
        ));
        let made = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let cache = Arc::clone(&cache);
                let made = Arc::clone(&made);
                tokio::spawn(async move {
                    let key = cache
                        .get(|| async {
                            let n = made.fetch_add(1, Ordering::SeqCst);
                            for _ in 0..5 {
                                tokio::task::yield_now().await;
                            }
                            Ok::<_, ()>(data_key(n as u8))
                        })
                        .await;
                    key.map(|k| k.wrapped.clone())
                })
            })
            .collect();
        for task in tasks {
            assert_eq!(task.await.expect("task"), Ok("0".to_owned()));
        }
        assert_eq!(made.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_failed_make_is_returned_and_the_next_caller_tries_again() {
        let cache = DataKeyCache::new(Duration::from_secs(60), Arc::new(Instant::now));
        let failed = cache.get(|| async { Err::<DataKey, _>("kms down") }).await;
        assert_eq!(failed.err(), Some("kms down"));
        let key = cache.get(|| async { Ok::<_, ()>(data_key(1)) }).await;
        assert_eq!(key.map(|k| k.wrapped.clone()), Ok("1".to_owned()));
    }
}
