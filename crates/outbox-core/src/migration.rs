//! What every schema-migration runner of the workspace shares (the outbox tables of
//! PostgreSQL and SQLite, the inbox tables): bundled migrations, their checksums, the rule
//! that decides which ones to apply, and the renderer that fills a bundled `.sql` template
//! with validated identifiers. Running the statements stays with each database crate.

use crate::Identifier;

/// One bundled migration: append only; never edit one that has shipped (its checksum is
/// recorded, and an edited one is refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// Position in the sequence, from 1.
    pub version: i32,
    /// Short name, recorded next to the version.
    pub name: &'static str,
    /// The SQL template (see [`render_sql`]).
    pub sql: &'static str,
}

impl Migration {
    /// The migration of the bundled file `stem`.sql: `stem` is `NNNN_name` (the version in
    /// four digits, then the name), `sql` the file's text. Meant for a `const` (see
    /// [`migrations!`](crate::migrations!)), where a stem of another form stops the build.
    pub const fn from_file(stem: &'static str, sql: &'static str) -> Self {
        let digits = stem.as_bytes();
        assert!(
            digits.len() > 5 && digits[4] == b'_',
            "a migration file is named NNNN_name.sql"
        );
        let mut version = 0;
        let mut i = 0;
        while i < 4 {
            assert!(
                digits[i].is_ascii_digit(),
                "a migration file is named NNNN_name.sql"
            );
            version = version * 10 + (digits[i] - b'0') as i32;
            i += 1;
        }
        Migration {
            version,
            name: stem.split_at(5).1,
            sql,
        }
    }
}

/// A crate's bundled migrations, in order, from their file stems in folder `dir` of the
/// crate (relative to its `Cargo.toml`): each file `NNNN_name.sql` is read at compile time and
/// becomes [`Migration::from_file`]. Give them in version order, as [`plan`] expects.
///
/// ```ignore
/// pub(crate) const MIGRATIONS: &[Migration] =
///     outbox_core::migrations!("migrations": "0001_outbox_table", "0002_aggregate_positions");
/// ```
#[macro_export]
macro_rules! migrations {
    ($dir:literal: $($stem:literal),+ $(,)?) => {
        &[$(
            $crate::migration::Migration::from_file(
                $stem,
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/", $dir, "/", $stem, ".sql")),
            )
        ),+]
    };
}

/// FNV-1a (64 bit) of a migration's SQL, as recorded in the bookkeeping table. It detects an
/// edited migration; it is not a security boundary.
pub fn checksum(sql: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in sql.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Why the recorded migrations cannot be brought up to date by this build.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigrationConflict {
    /// The database records a version this build does not know.
    #[error("schema version {found} is newer than this build's {known}")]
    Newer {
        /// Highest version recorded.
        found: i32,
        /// Highest version bundled.
        known: i32,
    },
    /// A recorded migration was applied from different SQL than the bundled one.
    #[error(
        "migration {version} was applied from different SQL (checksum {found}, this build has {expected})"
    )]
    Modified {
        /// The migration.
        version: i32,
        /// Recorded checksum.
        found: String,
        /// Bundled checksum.
        expected: String,
    },
}

/// Why a migration failed: the one error of every database's `migrate` (outbox and inbox
/// tables alike; `what` says which).
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The database refused a statement or could not be reached.
    #[error("migrating {what} table {table} failed")]
    Database {
        /// `outbox` or `inbox`.
        what: &'static str,
        /// The table being migrated.
        table: String,
        /// The database error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A migration recorded as applied differs from the bundled one.
    #[error(
        "migration {version} of {what} table {table} was applied from different SQL (checksum {found}, this build has {expected}); refusing to continue"
    )]
    Modified {
        /// `outbox` or `inbox`.
        what: &'static str,
        /// The table.
        table: String,
        /// Migration version.
        version: i32,
        /// Recorded checksum.
        found: String,
        /// Bundled checksum.
        expected: String,
    },
    /// The table's layout (e.g. plain or partitioned) differs from the configuration.
    /// Nothing is ever converted silently; the message says how.
    #[error("{0}")]
    Layout(String),
    /// The database has a newer schema than this build knows.
    #[error(
        "{what} table {table} has schema version {found}, newer than this build's {known}; upgrade outbox"
    )]
    Newer {
        /// `outbox` or `inbox`.
        what: &'static str,
        /// The table.
        table: String,
        /// Highest version recorded in the database.
        found: i32,
        /// Highest version this build bundles.
        known: i32,
    },
}

impl MigrateError {
    /// A database failure while migrating `what` table `table`.
    pub fn database(
        what: &'static str,
        table: &str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Database {
            what,
            table: table.to_owned(),
            source: Box::new(source),
        }
    }

    /// The error for `table` when its recorded migrations cannot be brought up to date.
    pub fn conflict(what: &'static str, table: &str, c: MigrationConflict) -> Self {
        let table = table.to_owned();
        match c {
            MigrationConflict::Newer { found, known } => Self::Newer {
                what,
                table,
                found,
                known,
            },
            MigrationConflict::Modified {
                version,
                found,
                expected,
            } => Self::Modified {
                what,
                table,
                version,
                found,
                expected,
            },
        }
    }
}

/// What to do to bring a table up to date.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationPlan<'m> {
    /// The highest version already applied (0 for none).
    pub current: i32,
    /// Bundled migrations not applied yet, in order, each with the checksum to record.
    pub to_apply: Vec<(&'m Migration, String)>,
}

/// Compares the `(version, checksum)` pairs recorded in a bookkeeping table with the
/// `bundled` migrations (in version order).
pub fn plan<'m>(
    bundled: &'m [Migration],
    recorded: &[(i32, String)],
) -> Result<MigrationPlan<'m>, MigrationConflict> {
    let known = bundled.last().map_or(0, |m| m.version);
    if let Some((found, _)) = recorded.iter().find(|(v, _)| *v > known) {
        return Err(MigrationConflict::Newer {
            found: *found,
            known,
        });
    }
    let mut plan = MigrationPlan {
        current: 0,
        to_apply: Vec::new(),
    };
    for m in bundled {
        let expected = checksum(m.sql);
        match recorded.iter().find(|(v, _)| *v == m.version) {
            Some((_, found)) if *found != expected => {
                return Err(MigrationConflict::Modified {
                    version: m.version,
                    found: found.clone(),
                    expected,
                });
            }
            Some(_) => plan.current = m.version,
            None => plan.to_apply.push((m, expected)),
        }
    }
    Ok(plan)
}

/// Fills the placeholders of a bundled SQL template; the only way a configured schema or
/// table name enters SQL in this workspace. Every name is a validated [`Identifier`], written
/// double-quoted.
///
/// | placeholder | becomes |
/// | --- | --- |
/// | `{{table}}` | `"schema"."table"` (`"table"` without a schema) |
/// | `{{schema}}` | `"schema"` |
/// | `{{name:_suffix}}` | `"table_suffix"` |
/// | `{{qname:_suffix}}` | `"schema"."table_suffix"` (unqualified without a schema) |
/// | `{{regclass:_suffix}}` | `'"schema"."table_suffix"'::regclass` |
/// | `{{other}}` | the identifier named `other` in `named`, e.g. `{{publication}}` |
///
/// # Panics
/// On an unknown placeholder, a malformed suffix, or `{{schema}}` without a schema: bugs in a
/// bundled `.sql` file (each crate's tests render all of its files), never caused by input.
pub fn render_sql(
    template: &str,
    schema: Option<&Identifier>,
    table: &Identifier,
    named: &[(&str, &Identifier)],
) -> String {
    let qualify = |name: String| match schema {
        Some(s) => format!("{}.{name}", s.quoted()),
        None => name,
    };
    let mut out = String::with_capacity(template.len() + 64);
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .expect("unterminated placeholder in bundled SQL");
        let placeholder = &after[..end];
        match placeholder.split_once(':') {
            None => match placeholder {
                "table" => out.push_str(&qualify(table.quoted())),
                "schema" => match schema {
                    Some(s) => out.push_str(&s.quoted()),
                    None => panic!("`{{{{schema}}}}` in bundled SQL rendered without a schema"),
                },
                other => match named.iter().find(|(name, _)| *name == other) {
                    Some((_, id)) => out.push_str(&id.quoted()),
                    None => panic!("unknown placeholder `{other}` in bundled SQL"),
                },
            },
            Some((kind, suffix)) => {
                assert!(
                    !suffix.is_empty()
                        && suffix.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                    "bad suffix `{suffix}` in bundled SQL"
                );
                let name = format!("\"{}{suffix}\"", table.as_str());
                match kind {
                    "name" => out.push_str(&name),
                    "qname" => out.push_str(&qualify(name)),
                    "regclass" => out.push_str(&format!("'{}'::regclass", qualify(name))),
                    other => panic!("unknown placeholder kind `{other}` in bundled SQL"),
                }
            }
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_migration_file_stem_gives_its_version_and_name() {
        const M: Migration = Migration::from_file("0012_cdc_offsets", "SELECT 1");
        assert_eq!((M.version, M.name, M.sql), (12, "cdc_offsets", "SELECT 1"));
    }

    #[test]
    #[should_panic(expected = "NNNN_name")]
    fn a_stem_without_its_version_is_refused() {
        let _ = Migration::from_file("outbox_table", "");
    }

    const BUNDLED: &[Migration] = &[
        Migration {
            version: 1,
            name: "one",
            sql: "CREATE TABLE {{table}} ()",
        },
        Migration {
            version: 2,
            name: "two",
            sql: "CREATE INDEX {{name:_idx}} ON {{table}} ()",
        },
    ];

    #[test]
    fn a_fresh_table_gets_every_migration_and_an_up_to_date_one_none() {
        let fresh = plan(BUNDLED, &[]).unwrap();
        assert_eq!(fresh.current, 0);
        assert_eq!(fresh.to_apply.len(), 2);
        let recorded: Vec<(i32, String)> = BUNDLED
            .iter()
            .map(|m| (m.version, checksum(m.sql)))
            .collect();
        let done = plan(BUNDLED, &recorded).unwrap();
        assert_eq!((done.current, done.to_apply.len()), (2, 0));
        let half = plan(BUNDLED, &recorded[..1]).unwrap();
        assert_eq!(half.current, 1);
        assert_eq!(half.to_apply[0].0.version, 2);
    }

    #[test]
    fn an_edited_or_newer_migration_is_refused() {
        let edited = plan(BUNDLED, &[(1, "0000".into())]).unwrap_err();
        assert!(matches!(
            edited,
            MigrationConflict::Modified { version: 1, .. }
        ));
        let newer = plan(BUNDLED, &[(3, "x".into())]).unwrap_err();
        assert_eq!(newer, MigrationConflict::Newer { found: 3, known: 2 });
    }

    #[test]
    fn placeholders_become_quoted_identifiers() {
        let schema = Identifier::new("app").unwrap();
        let table = Identifier::new("outbox").unwrap();
        let slot = Identifier::new("outbox_pub").unwrap();
        let sql = render_sql(
            "{{table}} {{schema}} {{name:_x}} {{qname:_x}} {{regclass:_x}} {{pub}}",
            Some(&schema),
            &table,
            &[("pub", &slot)],
        );
        assert_eq!(
            sql,
            r#""app"."outbox" "app" "outbox_x" "app"."outbox_x" '"app"."outbox_x"'::regclass "outbox_pub""#
        );
        assert_eq!(
            render_sql("{{table}} {{qname:_m}}", None, &table, &[]),
            r#""outbox" "outbox_m""#
        );
    }

    #[test]
    #[should_panic(expected = "unknown placeholder")]
    fn an_unknown_placeholder_is_a_bug() {
        let table = Identifier::new("outbox").unwrap();
        render_sql("{{tabel}}", None, &table, &[]);
    }
}
