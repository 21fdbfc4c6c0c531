//! The destination template: where a message goes (topic, subject, routing key, stream, URL
//! path). Parsed and validated once from config; rendered per event without re-parsing.

use std::fmt;

use crate::Event;

/// Why a destination template was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DestinationError {
    /// The template named a placeholder other than the three supported ones.
    #[error(
        "unknown placeholder `{{{0}}}` in destination template (use {{aggregate_type}}, {{event_type}} or {{aggregate_id}})"
    )]
    UnknownPlaceholder(String),
    /// A `{` without its `}`, or a stray `}`.
    #[error("unbalanced braces in destination template `{0}`")]
    Unbalanced(String),
    /// The template was empty.
    #[error("destination template must not be empty")]
    Empty,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    AggregateType,
    EventType,
    AggregateId,
}

/// A parsed destination template such as `outbox.event.{aggregate_type}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    template: String,
    parts: Vec<Part>,
}

impl Destination {
    /// The template used when none is configured.
    pub const DEFAULT_TEMPLATE: &'static str = "outbox.event.{aggregate_type}";

    /// Parses and validates a template.
    pub fn parse(template: &str) -> Result<Self, DestinationError> {
        if template.is_empty() {
            return Err(DestinationError::Empty);
        }
        let mut parts = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    parts.push(Part::Literal(rest.to_owned()));
                    break;
                }
                Some(i) => {
                    if i > 0 {
                        parts.push(Part::Literal(rest[..i].to_owned()));
                    }
                    if rest.as_bytes()[i] == b'}' {
                        return Err(DestinationError::Unbalanced(template.to_owned()));
                    }
                    let after = &rest[i + 1..];
                    let end = after
                        .find('}')
                        .ok_or_else(|| DestinationError::Unbalanced(template.to_owned()))?;
                    let name = &after[..end];
                    parts.push(match name {
                        "aggregate_type" => Part::AggregateType,
                        "event_type" => Part::EventType,
                        "aggregate_id" => Part::AggregateId,
                        other if other.contains('{') => {
                            return Err(DestinationError::Unbalanced(template.to_owned()));
                        }
                        other => {
                            return Err(DestinationError::UnknownPlaceholder(other.to_owned()));
                        }
                    });
                    rest = &after[end + 1..];
                }
            }
        }
        Ok(Self {
            template: template.to_owned(),
            parts,
        })
    }

    /// The template as configured.
    pub fn template(&self) -> &str {
        &self.template
    }

    /// True when the template has no placeholder (every event goes to one place).
    pub fn is_fixed(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Literal(_)))
    }

    /// The destination of one event.
    pub fn render(&self, event: &Event) -> String {
        self.render_parts(
            &event.aggregate_type,
            &event.aggregate_id,
            &event.event_type,
        )
    }

    /// The destination of an event with these fields (for records other than [`Event`],
    /// such as the rows `outbox verify` reads).
    pub fn render_parts(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        event_type: &str,
    ) -> String {
        let mut out = String::with_capacity(self.template.len() + 16);
        for part in &self.parts {
            out.push_str(match part {
                Part::Literal(s) => s,
                Part::AggregateType => aggregate_type,
                Part::EventType => event_type,
                Part::AggregateId => aggregate_id,
            });
        }
        out
    }

    /// Whether `name` could be this template rendered for some event: the literal parts in
    /// order, each placeholder standing for any non-empty text (`outbox.event.Order` matches
    /// `outbox.event.{aggregate_type}`). Used to find the destinations to read back.
    pub fn could_render(&self, name: &str) -> bool {
        fn rest_matches(parts: &[Part], text: &str) -> bool {
            match parts.split_first() {
                None => text.is_empty(),
                Some((Part::Literal(lit), tail)) => text
                    .strip_prefix(lit.as_str())
                    .is_some_and(|after| rest_matches(tail, after)),
                Some((_, tail)) => (1..=text.len())
                    .filter(|&i| text.is_char_boundary(i))
                    .any(|i| rest_matches(tail, &text[i..])),
            }
        }
        rest_matches(&self.parts, name)
    }

    /// The template as a glob (Redis `SCAN MATCH`): each placeholder as `*`, and the glob
    /// characters of the literal parts (`*`, `?`, `[`, `]`, backslash) escaped with a
    /// backslash.
    pub fn glob(&self) -> String {
        let mut out = String::with_capacity(self.template.len());
        for part in &self.parts {
            match part {
                Part::Literal(s) => {
                    for c in s.chars() {
                        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                            out.push('\\');
                        }
                        out.push(c);
                    }
                }
                _ => out.push('*'),
            }
        }
        out
    }
}

impl Default for Destination {
    fn default() -> Self {
        Self::parse(Self::DEFAULT_TEMPLATE).expect("the default template is valid")
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.template)
    }
}

impl<'de> serde::Deserialize<'de> for Destination {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl serde::Serialize for Destination {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.template)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Position;

    fn event() -> Event {
        Event {
            id: uuid::Uuid::nil(),
            position: Position(1),
            aggregate_type: "Order".into(),
            aggregate_id: "o_1".into(),
            event_type: "order.placed".into(),
            payload: bytes::Bytes::new(),
            headers: vec![],
            created_at: time::OffsetDateTime::UNIX_EPOCH,
            attempts: 0,
        }
    }

    #[test]
    fn renders_every_placeholder() {
        let d = Destination::parse("x.{aggregate_type}.{event_type}.{aggregate_id}!").unwrap();
        assert_eq!(d.render(&event()), "x.Order.order.placed.o_1!");
        assert!(!d.is_fixed());
        assert_eq!(
            Destination::default().render(&event()),
            "outbox.event.Order"
        );
        assert!(Destination::parse("fixed").unwrap().is_fixed());
    }

    #[test]
    fn recognises_its_own_renderings() {
        let d = Destination::default();
        assert!(d.could_render("outbox.event.Order"));
        assert!(d.could_render("outbox.event.a.b"));
        assert!(!d.could_render("outbox.event."));
        assert!(!d.could_render("other.event.Order"));
        let d = Destination::parse("{aggregate_type}-x-{event_type}").unwrap();
        assert!(d.could_render("Order-x-placed"));
        assert!(!d.could_render("Order-y-placed"));
        assert!(Destination::parse("fixed").unwrap().could_render("fixed"));
        assert_eq!(
            Destination::parse("a*.{aggregate_id}").unwrap().glob(),
            "a\\*.*"
        );
    }

    #[test]
    fn refuses_unknown_placeholders_and_bad_braces() {
        assert_eq!(
            Destination::parse("a.{tenant}"),
            Err(DestinationError::UnknownPlaceholder("tenant".into()))
        );
        assert!(matches!(
            Destination::parse("a.{aggregate_type"),
            Err(DestinationError::Unbalanced(_))
        ));
        assert!(matches!(
            Destination::parse("a}"),
            Err(DestinationError::Unbalanced(_))
        ));
        assert_eq!(Destination::parse(""), Err(DestinationError::Empty));
    }
}
