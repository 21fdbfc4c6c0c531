//! The `file:///dir` store (development): each object a file at `<dir>/<key>`, written to a
//! temporary file in the same directory and renamed into place, so a reader never sees half
//! of one. No metadata, and nothing expires.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use outbox_core::SinkError;
use tokio::io::AsyncWriteExt as _;
use uuid::Uuid;

use crate::DecodeError;

/// A directory holding claim-checked payloads.
#[derive(Debug)]
pub(super) struct FileStore {
    dir: PathBuf,
}

impl FileStore {
    /// The store rooted at `dir` (absolute; created on the first write).
    pub(super) fn new(dir: &str) -> Self {
        let dir = if dir.is_empty() { "/" } else { dir };
        Self {
            dir: PathBuf::from(dir),
        }
    }

    /// Writes `body` at `key` (replacing what is there: a retry writes the same bytes).
    pub(super) async fn put(&self, key: &str, body: &Bytes) -> Result<(), SinkError> {
        let path = self.dir.join(key);
        write_atomic(&path, body)
            .await
            .map_err(|e| write_error(&path, &e))
    }

    /// `outbox doctor`: the directory exists (or can be made) and takes a file.
    pub(super) async fn check(&self) -> Result<String, SinkError> {
        let probe = self.dir.join(format!(".outbox-doctor-{}", Uuid::new_v4()));
        write_atomic(&probe, &Bytes::from_static(b"outbox doctor probe"))
            .await
            .map_err(|e| write_error(&probe, &e))?;
        if let Err(e) = tokio::fs::remove_file(&probe).await {
            return Err(SinkError::unavailable(format!(
                "the claim-check directory {} took a file but it cannot be removed: {e}",
                self.dir.display()
            )));
        }
        Ok(format!(
            "the directory {} is writable; a file store is for development: its files are \
             never expired",
            self.dir.display()
        ))
    }

    /// `outbox migrate`: nothing to set.
    pub(super) fn ensure_expiry(&self) -> String {
        format!(
            "file store {}: nothing to set; a file store is for development and its files are \
             not expired (delete old ones yourself, or use an s3:// store)",
            self.dir.display()
        )
    }
}

/// Writes `body` to a temporary file next to `path`, flushes it to disk, then renames it to
/// `path`; makes the directories first.
async fn write_atomic(path: &Path, body: &[u8]) -> std::io::Result<()> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    tokio::fs::create_dir_all(parent).await?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = parent.join(format!(".{name}.tmp-{}", Uuid::new_v4().simple()));
    let written = async {
        let mut file = tokio::fs::File::create(&temp).await?;
        file.write_all(body).await?;
        file.sync_all().await?;
        drop(file);
        tokio::fs::rename(&temp, path).await
    }
    .await;
    if written.is_err() {
        let _ = tokio::fs::remove_file(&temp).await;
    }
    written
}

/// A failed write: the store is unusable, nothing is wrong with the event.
fn write_error(path: &Path, err: &std::io::Error) -> SinkError {
    let hint = if err.kind() == ErrorKind::PermissionDenied {
        ": give the relay write permission on the claim-check directory"
    } else {
        ""
    };
    SinkError::unavailable(format!(
        "cannot write the claim-check file {}: {err}{hint}",
        path.display()
    ))
}

/// The consumer's side: the bytes of `url`'s file (`path` is the URL without `file://`).
pub(super) async fn read(url: &str, path: &str) -> Result<Bytes, DecodeError> {
    if !path.starts_with('/') {
        return Err(DecodeError::Invalid(format!(
            "claim_check `{url}` is not a file URL with an absolute path"
        )));
    }
    match tokio::fs::read(path).await {
        Ok(bytes) => Ok(Bytes::from(bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => Err(DecodeError::Invalid(format!(
            "no claim-checked payload at {url}: it was deleted, or this consumer does not see \
             the relay's directory"
        ))),
        Err(e) => Err(DecodeError::Unavailable(format!(
            "cannot read the claim-checked payload at {url}: {e}"
        ))),
    }
}
