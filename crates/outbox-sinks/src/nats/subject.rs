//! NATS subject rules: which rendered destinations may be published to, which stream subjects
//! cover them, and the stream subjects derived from a destination template.

/// Why `subject` cannot be published to, or `None` when it can.
///
/// A publish subject is one or more non-empty tokens separated by `.`, without whitespace or
/// control characters, and without the wildcard tokens `*` and `>` (those only make sense in
/// subscriptions and stream subjects). A `.` inside a placeholder value (say an `event_type`
/// of `order.placed`) simply adds tokens and is fine.
pub(crate) fn publish_subject_problem(subject: &str) -> Option<&'static str> {
    if subject.is_empty() {
        return Some("is empty");
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("contains whitespace or a control character");
    }
    for token in subject.split('.') {
        match token {
            "" => return Some("has an empty token (a leading, trailing or doubled `.`)"),
            "*" | ">" => return Some("contains a wildcard token (`*` or `>`)"),
            _ => {}
        }
    }
    None
}

/// Why `pattern` is not a valid stream subject (wildcards allowed), or `None`.
pub(crate) fn stream_subject_problem(pattern: &str) -> Option<&'static str> {
    if pattern.is_empty() {
        return Some("is empty");
    }
    if pattern.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("contains whitespace or a control character");
    }
    let tokens: Vec<&str> = pattern.split('.').collect();
    for (i, token) in tokens.iter().enumerate() {
        if token.is_empty() {
            return Some("has an empty token (a leading, trailing or doubled `.`)");
        }
        if *token == ">" && i + 1 != tokens.len() {
            return Some("uses `>` before the last token");
        }
    }
    None
}

/// True when the stream subject `pattern` (with `*` and `>` wildcards) matches `subject`.
pub(crate) fn covers(pattern: &str, subject: &str) -> bool {
    let mut subject_tokens = subject.split('.');
    for p in pattern.split('.') {
        match (p, subject_tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (p, Some(s)) if p == s => {}
            _ => return false,
        }
    }
    subject_tokens.next().is_none()
}

/// The stream subject derived from a destination template: the template itself when it has
/// no placeholder, else its literal prefix up to the last `.` before the first placeholder,
/// followed by `>` (`outbox.event.{aggregate_type}` → `outbox.event.>`). `None` when the
/// template starts with a placeholder, since the only cover would be `>`, every subject.
pub(crate) fn derived_stream_subject(template: &str) -> Option<String> {
    match template.find('{') {
        None => Some(template.to_owned()),
        Some(brace) => {
            let prefix = &template[..brace];
            let dot = prefix.rfind('.')?;
            Some(format!("{}>", &prefix[..=dot]))
        }
    }
}

/// Why `name` is not a valid JetStream stream name, or `None`.
pub(crate) fn stream_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("must not be empty");
    }
    if name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
    {
        return Some("must not contain whitespace, `.`, `*`, `>`, `/` or `\\`");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_subjects_refuse_spaces_empty_tokens_and_wildcards() {
        assert_eq!(publish_subject_problem("outbox.event.Order"), None);
        assert_eq!(publish_subject_problem("outbox.order.placed"), None);
        assert!(publish_subject_problem("outbox.o 1").is_some());
        assert!(publish_subject_problem("outbox..x").is_some());
        assert!(publish_subject_problem("outbox.x.").is_some());
        assert!(publish_subject_problem(".outbox").is_some());
        assert!(publish_subject_problem("outbox.*").is_some());
        assert!(publish_subject_problem("outbox.>").is_some());
        assert!(publish_subject_problem("").is_some());
        assert!(publish_subject_problem("a\r\nPUB x").is_some());
    }

    #[test]
    fn wildcards_cover_subjects_like_the_server_does() {
        assert!(covers("outbox.event.>", "outbox.event.Order"));
        assert!(covers("outbox.event.>", "outbox.event.order.placed"));
        assert!(!covers("outbox.event.>", "outbox.event"));
        assert!(covers("outbox.*.x", "outbox.a.x"));
        assert!(!covers("outbox.*.x", "outbox.a.b.x"));
        assert!(covers("orders", "orders"));
        assert!(!covers("orders", "orders.x"));
        assert!(covers(">", "anything.at.all"));
    }

    #[test]
    fn stream_subjects_derive_from_the_literal_prefix() {
        assert_eq!(
            derived_stream_subject("outbox.event.{aggregate_type}").as_deref(),
            Some("outbox.event.>")
        );
        assert_eq!(
            derived_stream_subject("outbox.ev_{aggregate_type}").as_deref(),
            Some("outbox.>")
        );
        assert_eq!(derived_stream_subject("orders").as_deref(), Some("orders"));
        assert_eq!(derived_stream_subject("{aggregate_type}.events"), None);
        assert_eq!(derived_stream_subject("x{event_type}"), None);
    }

    #[test]
    fn stream_names_refuse_subject_characters() {
        assert_eq!(stream_name_problem("OUTBOX"), None);
        assert!(stream_name_problem("OUT.BOX").is_some());
        assert!(stream_name_problem("OUT BOX").is_some());
        assert!(stream_name_problem("").is_some());
        assert!(stream_subject_problem("a.>.b").is_some());
        assert_eq!(stream_subject_problem("a.*.>"), None);
    }
}
