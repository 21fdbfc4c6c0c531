use super::*;

/// Every `.sql` file a database supplies renders without a leftover placeholder (and, on
/// MySQL, without a double quote: `render_mysql` panics on one).
fn renders_everything<D: Dialect>(table: &QualifiedTable) {
    for sql in [
        D::INSERT,
        D::PURGE,
        D::CONTAINS,
        D::POSITIONS_ADVANCE,
        D::POSITIONS_READ,
        D::MIGRATIONS_PREPARE,
        D::MIGRATIONS_APPLIED,
        D::MIGRATIONS_RECORD,
    ]
    .into_iter()
    .chain(D::MIGRATIONS.iter().map(|m| m.sql))
    {
        let rendered = D::render(sql, table);
        assert!(!rendered.contains("{{"), "{rendered}");
    }
    assert_eq!(D::MIGRATIONS.len(), crate::SCHEMA_VERSION as usize);
}

fn seen(schema: Option<&str>) -> QualifiedTable {
    QualifiedTable::new(
        schema.map(|s| Identifier::new(s).expect("valid")),
        Identifier::new("seen").expect("valid"),
    )
}

#[test]
#[cfg(feature = "postgres")]
fn every_postgres_file_renders() {
    renders_everything::<sqlx::Postgres>(&seen(Some("public")));
    let inbox = crate::PgInbox::default();
    assert_eq!(inbox.table().to_string(), "public.processed_events");
    assert!(format!("{inbox:?}").starts_with("PgInbox {"));
}

#[test]
#[cfg(feature = "sqlite")]
fn every_sqlite_file_renders() {
    renders_everything::<sqlx::Sqlite>(&seen(None));
    assert_eq!(
        crate::SqliteInbox::default().table().to_string(),
        "processed_events"
    );
}

#[test]
#[cfg(feature = "mysql")]
fn every_mysql_file_renders() {
    renders_everything::<sqlx::MySql>(&seen(None));
    assert_eq!(
        crate::MySqlInbox::default().table().to_string(),
        "processed_events"
    );
}
