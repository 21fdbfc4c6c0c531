//! Validated SQL identifiers: the only way a configured schema or table name reaches SQL.
//!
//! A name is accepted only if it is a plain identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most
//! [`Identifier::MAX_LEN`] bytes so that derived index and trigger names stay within
//! PostgreSQL's 63-byte limit). It is then always written double-quoted, so it can never
//! change the meaning of the statement it is placed in.

use std::fmt;

/// Why a name was refused as an identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentifierError {
    /// The name was empty.
    #[error("an identifier must not be empty")]
    Empty,
    /// The name was longer than [`Identifier::MAX_LEN`] bytes.
    #[error("`{0}` is longer than {max} bytes", max = Identifier::MAX_LEN)]
    TooLong(String),
    /// The name contained something other than ASCII letters, digits and `_`, or started
    /// with a digit.
    #[error("`{0}` is not a plain identifier (letters, digits and `_`, not starting with a digit)")]
    Invalid(String),
}

/// A schema, table or other SQL object name that passed validation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identifier(String);

impl Identifier {
    /// Longest accepted name, leaving room for suffixes such as `_pending_seq_idx`.
    pub const MAX_LEN: usize = 40;

    /// Validates `name`.
    pub fn new(name: impl Into<String>) -> Result<Self, IdentifierError> {
        let name = name.into();
        let mut chars = name.chars();
        match chars.next() {
            None => return Err(IdentifierError::Empty),
            Some(c) if !(c.is_ascii_alphabetic() || c == '_') => {
                return Err(IdentifierError::Invalid(name));
            }
            Some(_) => {}
        }
        if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(IdentifierError::Invalid(name));
        }
        if name.len() > Self::MAX_LEN {
            return Err(IdentifierError::TooLong(name));
        }
        Ok(Self(name))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name double-quoted for SQL. Safe because validation excludes quotes.
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }
}

impl fmt::Display for Identifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Identifier {
    type Err = IdentifierError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl<'de> serde::Deserialize<'de> for Identifier {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::new(s).map_err(serde::de::Error::custom)
    }
}

impl serde::Serialize for Identifier {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// An optional schema plus a table name; renders as `"schema"."table"`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QualifiedTable {
    /// Schema, or `None` for the connection's search path.
    pub schema: Option<Identifier>,
    /// Table name.
    pub table: Identifier,
}

impl QualifiedTable {
    /// A table in the given schema (or the search path when `schema` is `None`).
    pub fn new(schema: Option<Identifier>, table: Identifier) -> Self {
        Self { schema, table }
    }

    /// The quoted, qualified name for SQL.
    pub fn quoted(&self) -> String {
        match &self.schema {
            Some(s) => format!("{}.{}", s.quoted(), self.table.quoted()),
            None => self.table.quoted(),
        }
    }

    /// A related object name in the same schema: `"schema"."<table><suffix>"`.
    /// `suffix` is a compile-time constant of this crate's callers, never user input.
    pub fn sibling(&self, suffix: &'static str) -> String {
        let name = format!("\"{}{}\"", self.table.as_str(), suffix);
        match &self.schema {
            Some(s) => format!("{}.{}", s.quoted(), name),
            None => name,
        }
    }

    /// The unqualified quoted name of a related object: `"<table><suffix>"` (for index names,
    /// which PostgreSQL places in the table's schema).
    pub fn sibling_unqualified(&self, suffix: &'static str) -> String {
        format!("\"{}{}\"", self.table.as_str(), suffix)
    }
}

impl fmt::Display for QualifiedTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(s) => write!(f, "{s}.{}", self.table),
            None => write!(f, "{}", self.table),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_are_accepted_and_quoted() {
        let id = Identifier::new("outbox_events2").expect("valid");
        assert_eq!(id.quoted(), "\"outbox_events2\"");
        let t = QualifiedTable::new(Some(Identifier::new("app").expect("valid")), id);
        assert_eq!(t.quoted(), "\"app\".\"outbox_events2\"");
        assert_eq!(t.sibling("_seq"), "\"app\".\"outbox_events2_seq\"");
    }

    #[test]
    fn names_that_could_carry_sql_are_refused() {
        for bad in [
            "outbox; DROP TABLE users",
            "out\"box",
            "1outbox",
            "outbox--",
            "out box",
            "outbox.x",
            "é",
        ] {
            assert!(
                matches!(Identifier::new(bad), Err(IdentifierError::Invalid(_))),
                "{bad}"
            );
        }
        assert_eq!(Identifier::new(""), Err(IdentifierError::Empty));
        assert!(matches!(
            Identifier::new("a".repeat(41)),
            Err(IdentifierError::TooLong(_))
        ));
    }

    proptest::proptest! {
        #[test]
        fn every_accepted_name_quotes_without_escaping(s in "\\PC{0,50}") {
            if let Ok(id) = Identifier::new(s.clone()) {
                proptest::prop_assert!(!s.contains('"'));
                proptest::prop_assert_eq!(id.quoted(), format!("\"{s}\""));
            }
        }
    }
}
