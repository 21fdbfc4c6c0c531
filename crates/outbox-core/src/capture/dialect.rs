//! How texts and names become SQL in each capture dialect: quoted identifiers and string
//! literals that mean exactly the value.

use crate::identifier::Identifier;

/// Why a text cannot become an SQL string literal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LiteralError {
    /// PostgreSQL text cannot hold the NUL character.
    #[error("must not contain the NUL character")]
    Nul,
}

/// `value` as a PostgreSQL string literal ([`Dialect::Postgres`]).
pub fn quote_literal(value: &str) -> Result<String, LiteralError> {
    Dialect::Postgres.literal(value)
}

/// The SQL dialect a capture's statements are written in: decides how a text becomes a
/// literal ([`Dialect::literal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// SQLite.
    Sqlite,
    /// MySQL and MariaDB.
    MySql,
}

impl Dialect {
    /// `id` quoted as an identifier: double quotes, or backquotes on MySQL.
    pub fn quote(self, id: &Identifier) -> String {
        match self {
            Self::MySql => format!("`{id}`"),
            Self::Postgres | Self::Sqlite => id.quoted(),
        }
    }

    /// `value` as an SQL string literal that means exactly `value`; NUL is refused.
    ///
    /// - PostgreSQL: whatever `standard_conforming_strings` says: single quotes are doubled,
    ///   and a value with a backslash is written as an escape string (`E'...'`, backslashes
    ///   doubled), as PostgreSQL's own `quote_literal` does.
    /// - SQLite: single quotes doubled; a backslash is an ordinary character there.
    /// - MySQL/MariaDB: single quotes doubled (the same in every `sql_mode`); a value with a
    ///   backslash, whose meaning depends on `NO_BACKSLASH_ESCAPES`, is written as its UTF-8
    ///   bytes in hex instead, `CONVERT(X'...' USING utf8mb4)`, which reads the same in every
    ///   mode.
    pub fn literal(self, value: &str) -> Result<String, LiteralError> {
        if value.contains('\0') {
            return Err(LiteralError::Nul);
        }
        match self {
            Self::Postgres => Ok(quote_pg(value)),
            Self::Sqlite => Ok(format!("'{}'", value.replace('\'', "''"))),
            Self::MySql if value.contains('\\') => {
                let hex: String = value.bytes().map(|b| format!("{b:02X}")).collect();
                Ok(format!("CONVERT(X'{hex}' USING utf8mb4)"))
            }
            Self::MySql => Ok(format!("'{}'", value.replace('\'', "''"))),
        }
    }
}

fn quote_pg(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 3);
    if value.contains('\\') {
        out.push('E');
    }
    out.push('\'');
    for c in value.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}
