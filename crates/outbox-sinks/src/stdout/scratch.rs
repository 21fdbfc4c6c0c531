//! `outbox crash-test` with the file sink: a scratch file `<tag>.jsonl` beside the configured
//! one, deleted at the end.

use outbox_core::{Identifier, SinkError, SinkErrorKind};

use super::FileConfig;

/// `config` appending to `<tag>.jsonl` in the directory of `sink.path`.
pub(super) fn scratch(config: &FileConfig, tag: &Identifier) -> Result<FileConfig, String> {
    let name = format!("{tag}.jsonl");
    let path = match config.path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join(name),
        _ => name.into(),
    };
    let scratch = FileConfig {
        path,
        ..config.clone()
    };
    scratch.validate().map_err(|e| e.to_string())?;
    Ok(scratch)
}

/// Deletes the scratch file.
pub(super) async fn remove_scratch(config: &FileConfig) -> Result<String, SinkError> {
    let path = &config.path;
    match tokio::fs::remove_file(path).await {
        Ok(()) => Ok(format!("file `{}`", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok(format!("file `{}` (never written)", path.display()))
        }
        Err(e) => Err(SinkError::new(
            SinkErrorKind::Rejected,
            format!("deleting `{}`", path.display()),
        )
        .with_source(e)),
    }
}
