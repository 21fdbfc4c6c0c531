//! The keys every sink shares for its message format (`format`, `cloudevents_source`,
//! `cloudevents_content_type`) and how they are checked. The format itself (the mapping of an
//! event onto a CloudEvent, the envelope) is [`outbox_core::cloudevents`]; each sink names its
//! protocol's [`Binding`](outbox_core::cloudevents::Binding) beside its own code.

use outbox_core::cloudevents::{self, Format, MessageFormat};
use outbox_core::{Event, SinkError};

use crate::ConfigError;

/// The default of `cloudevents_source`.
pub(crate) fn default_source() -> String {
    cloudevents::DEFAULT_SOURCE.to_owned()
}

/// The default of `cloudevents_content_type`.
pub(crate) fn default_content_type() -> String {
    cloudevents::DEFAULT_DATA_CONTENT_TYPE.to_owned()
}

/// Checks a sink's three format keys; the error names the key.
pub(crate) fn message_format(
    format: Format,
    source: &str,
    content_type: &str,
) -> Result<MessageFormat, ConfigError> {
    MessageFormat::new(format, source, content_type).map_err(|e| ConfigError::new(e.key, e.message))
}

/// Refuses `format` for a sink whose messages cannot carry it (binary mode without headers),
/// saying what to use instead.
#[cfg(any(feature = "stdout", feature = "kinesis"))]
pub(crate) fn refuse_binary(format: Format, why: &str) -> Result<(), ConfigError> {
    if format == Format::CloudeventsBinary {
        return Err(ConfigError::new(
            "format",
            format!(
                "`cloudevents-binary` puts the attributes in message headers, and {why}: use \
                 `cloudevents-structured` (the attributes inside the body) or `plain`"
            ),
        ));
    }
    Ok(())
}

/// The failure of an event that cannot be a CloudEvent (an empty `type` or `source`): it
/// never will be, so it is dead-lettered with the reason.
pub(crate) fn not_a_cloudevent(event: &Event, reason: String) -> SinkError {
    SinkError::rejected(format!(
        "cannot send event {} as a CloudEvent (sink.format): {reason}",
        event.id
    ))
}
