//! `key = "file:/path"`: a local 32-byte master key that wraps random data keys.
//!
//! The file holds the key as 32 raw bytes, 64 hex characters or base64 of 32 bytes (44
//! characters), with an optional trailing newline. Its id is `file:` and the first 16 hex
//! characters of the SHA-256 of the key. A data key is wrapped as
//! `wrap nonce (12) ‖ AES-256-GCM(master key, wrap nonce, aad "outbox data key", data key) ‖
//! tag (16)`.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use sha2::{Digest as _, Sha256};

use super::data_key::{AesKey, DataKey, KEY_LEN, RandomFailed, random, wipe};

/// The prefix of `key` for a key file, and of the ids of file keys.
pub(super) const PREFIX: &str = "file:";

/// The additional authenticated data of a wrapped data key.
pub(super) const WRAP_AAD: &[u8] = b"outbox data key";

/// A master key read from a file. Only its id and path are ever shown.
pub(super) struct FileKey {
    key: AesKey,
    id: String,
    path: PathBuf,
}

impl std::fmt::Debug for FileKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileKey")
            .field("id", &self.id)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl FileKey {
    /// Reads and parses the key file. The error names the path and says what was found (its
    /// length), never the content.
    pub(super) fn read(path: &Path) -> Result<Self, String> {
        let mut content = std::fs::read(path)
            .map_err(|e| format!("cannot read the key file {}: {e}", path.display()))?;
        let parsed = parse(&content);
        let found = content.len();
        wipe(&mut content);
        let mut bytes = parsed.ok_or_else(|| {
            format!(
                "the key file {} holds {found} bytes, which are not a 256-bit key: it must hold \
                 32 raw bytes, 64 hex characters or the base64 of 32 bytes (44 characters), \
                 with an optional trailing newline",
                path.display()
            )
        })?;
        let id = fingerprint(&bytes);
        let key = AesKey::take(&mut bytes);
        let key = key.ok_or_else(|| format!("the key file {} cannot be used", path.display()))?;
        Ok(Self {
            key,
            id,
            path: path.to_owned(),
        })
    }

    /// `file:<16 hex>`: what `encryption_key_id` says.
    pub(super) fn id(&self) -> &str {
        &self.id
    }

    /// The file it was read from.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// A new random data key, wrapped by this key.
    pub(super) fn new_data_key(&self) -> Result<DataKey, RandomFailed> {
        let mut bytes = random::<KEY_LEN>()?;
        let wrapped = self.key.seal_with_nonce(WRAP_AAD, &bytes);
        let key = AesKey::take(&mut bytes);
        Ok(DataKey {
            key: key.ok_or(RandomFailed)?,
            key_id: self.id.clone(),
            wrapped: base64::engine::general_purpose::STANDARD.encode(wrapped?),
        })
    }

    /// The data key wrapped as `wrapped` (decoded from base64), or `None` when it fails
    /// authentication (another key wrapped it, or it was altered).
    pub(super) fn unwrap(&self, wrapped: &[u8]) -> Option<AesKey> {
        AesKey::take(&mut self.key.open_with_nonce(WRAP_AAD, wrapped)?)
    }
}

/// The 32 key bytes of a key file's content, or `None`.
fn parse(content: &[u8]) -> Option<Vec<u8>> {
    if content.len() == KEY_LEN {
        return Some(content.to_vec());
    }
    let text = content
        .strip_suffix(b"\r\n")
        .or_else(|| content.strip_suffix(b"\n"))
        .unwrap_or(content);
    match text.len() {
        KEY_LEN => Some(text.to_vec()),
        64 => hex::decode(text).ok(),
        44 => base64::engine::general_purpose::STANDARD
            .decode(text)
            .ok()
            .filter(|key| key.len() == KEY_LEN),
        _ => None,
    }
}

/// `file:` and the first 16 hex characters of the key's SHA-256.
fn fingerprint(key: &[u8]) -> String {
    let digest = Sha256::digest(key);
    format!("{PREFIX}{}", &hex::encode(digest)[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &tempfile::TempDir, name: &str, content: &[u8]) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, content).expect("write the key file");
        path
    }

    #[test]
    fn key_file_formats_give_the_same_key() {
        let dir = tempfile::tempdir().expect("temp dir");
        let key: Vec<u8> = (0u8..32)
            .map(|b| b.wrapping_mul(7).wrapping_add(10))
            .collect();
        let hex_text = hex::encode(&key);
        let b64_text = base64::engine::general_purpose::STANDARD.encode(&key);
        let files = [
            write(&dir, "raw", &key),
            write(&dir, "raw-newline", &[key.as_slice(), b"\n"].concat()),
            write(&dir, "hex", hex_text.as_bytes()),
            write(&dir, "hex-newline", format!("{hex_text}\n").as_bytes()),
            write(&dir, "hex-crlf", format!("{hex_text}\r\n").as_bytes()),
            write(&dir, "base64", b64_text.as_bytes()),
            write(&dir, "base64-newline", format!("{b64_text}\n").as_bytes()),
        ];
        let expected = fingerprint(&key);
        let first = FileKey::read(&files[0]).expect("raw key");
        let wrapped = first.new_data_key().expect("data key");
        let wrapped = base64::engine::general_purpose::STANDARD
            .decode(&wrapped.wrapped)
            .expect("base64");
        for path in &files {
            let file_key =
                FileKey::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(file_key.id(), expected, "{}", path.display());
            // The same key: it unwraps what the first one wrapped.
            assert!(file_key.unwrap(&wrapped).is_some(), "{}", path.display());
        }
    }

    #[test]
    fn a_bad_key_file_is_named_by_its_length_never_its_content() {
        let dir = tempfile::tempdir().expect("temp dir");
        let secret = "s3cr3t-".repeat(5);
        let path = write(&dir, "short", secret.as_bytes());
        let err = FileKey::read(&path).expect_err("35 bytes are not a key");
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("35 bytes"), "{err}");
        assert!(!err.contains("s3cr3t"), "{err}");

        // 64 characters that are not hex; 44 that are base64 of another length.
        let not_hex = "zz".repeat(32);
        let path = write(&dir, "not-hex", not_hex.as_bytes());
        let err = FileKey::read(&path).expect_err("not hex");
        assert!(err.contains("64 bytes") && !err.contains("zzzz"), "{err}");

        let err = FileKey::read(&dir.path().join("missing")).expect_err("no file");
        assert!(err.contains("cannot read the key file"), "{err}");
    }

    #[test]
    fn a_data_key_wrapped_by_another_key_or_altered_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let one = FileKey::read(&write(&dir, "one", &[1u8; 32])).expect("key one");
        let two = FileKey::read(&write(&dir, "two", &[2u8; 32])).expect("key two");
        assert_ne!(one.id(), two.id());
        let data_key = one.new_data_key().expect("data key");
        let mut wrapped = base64::engine::general_purpose::STANDARD
            .decode(&data_key.wrapped)
            .expect("base64");
        assert_eq!(wrapped.len(), 12 + 32 + 16);
        assert!(one.unwrap(&wrapped).is_some());
        assert!(two.unwrap(&wrapped).is_none());
        wrapped[20] ^= 1;
        assert!(one.unwrap(&wrapped).is_none());
        assert!(one.unwrap(&wrapped[..10]).is_none());
    }
}
