//! The schema: migrations are idempotent and concurrent-safe, and plain-SQL producers get the
//! documented defaults.

mod common;

use common::TestDb;
use outbox_core::{DeadLetterPolicy, Identifier, Ordering, Source};
use outbox_sqlite::{
    SCHEMA_VERSION, SqliteConfig, SqlitePollSource, connect, migrate, schema_version,
};
use time::OffsetDateTime;

#[tokio::test]
async fn migrating_twice_is_a_no_op() {
    let db = TestDb::new().await;
    assert_eq!(
        schema_version(&db.pool, &db.config.table)
            .await
            .expect("version"),
        Some(SCHEMA_VERSION)
    );
    db.commit_events(&[("o_1", 1)]).await;

    let again = migrate(&db.pool, &db.config.table)
        .await
        .expect("second migrate");
    assert!(again.applied.is_empty(), "{again:?}");
    assert_eq!(again.version, SCHEMA_VERSION);
    assert_eq!(db.count("pending").await, 1, "data survives a re-run");
}

#[tokio::test]
async fn concurrent_migrations_of_a_fresh_file_apply_it_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = SqliteConfig::new(dir.path().join("fresh.db"));
    let a = connect(&config).await.expect("pool a");
    let b = connect(&config).await.expect("pool b");
    let (ra, rb) = tokio::join!(migrate(&a, &config.table), migrate(&b, &config.table));
    let (ra, rb) = (ra.expect("migrate a"), rb.expect("migrate b"));
    assert_eq!(
        ra.applied.len() + rb.applied.len(),
        SCHEMA_VERSION as usize,
        "{ra:?} {rb:?}"
    );
    assert_eq!(
        schema_version(&a, &config.table).await.expect("version"),
        Some(SCHEMA_VERSION)
    );
}

#[tokio::test]
async fn an_unmigrated_table_has_no_version_and_tables_are_independent() {
    let db = TestDb::new().await;
    let other = Identifier::new("billing_outbox").expect("valid");
    assert_eq!(
        schema_version(&db.pool, &other).await.expect("version"),
        None
    );
    let report = migrate(&db.pool, &other)
        .await
        .expect("migrate second table");
    assert_eq!(
        report.applied,
        vec![(1, "outbox_table"), (2, "aggregate_positions")]
    );
}

#[tokio::test]
async fn a_plain_sql_producer_writes_four_columns_and_gets_a_uuid_v7() {
    let db = TestDb::new().await;
    let before = OffsetDateTime::now_utc();
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('Order', 'o_91f2', 'order.placed', '{\"order_id\":\"o_91f2\",\"total_cents\":1250}')",
    )
    .execute(&db.pool)
    .await
    .expect("plain insert");

    let mut source = SqlitePollSource::new(
        db.pool.clone(),
        &db.config,
        Ordering::PerAggregate,
        DeadLetterPolicy::HoldAggregate,
    );
    let fetched = source
        .fetch(10, OffsetDateTime::now_utc())
        .await
        .expect("fetch");
    let [event] = &fetched.events[..] else {
        panic!("one event expected: {:?}", fetched.events)
    };
    assert_eq!(
        &event.payload[..],
        br#"{"order_id":"o_91f2","total_cents":1250}"#
    );
    assert_eq!(
        event.headers,
        vec![("aggregate_seq".to_owned(), "1".to_owned())],
        "no headers of its own; the delivery position the relay adds"
    );
    assert_eq!(event.id.get_version_num(), 7, "{}", event.id);
    assert_eq!(event.id.get_variant(), uuid::Variant::RFC4122);
    let (secs, _) = event.id.get_timestamp().expect("v7 timestamp").to_unix();
    let id_time = i64::try_from(secs).expect("seconds");
    assert!((id_time - before.unix_timestamp()).abs() <= 2, "{id_time}");
    let age = (event.created_at - before).whole_seconds().abs();
    assert!(age <= 2, "created_at {}", event.created_at);
}

#[tokio::test]
async fn the_schema_refuses_rows_the_relay_could_not_deliver() {
    let db = TestDb::new().await;
    for (what, sql) in [
        (
            "malformed id",
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ('nope', 'A', 'a', 'e', x'00')",
        ),
        (
            "headers not an object",
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ('A', 'a', 'e', x'00', '[1]')",
        ),
        (
            "empty aggregate id",
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('A', '', 'e', x'00')",
        ),
        (
            "unknown state",
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, state) VALUES ('A', 'a', 'e', x'00', 'done')",
        ),
    ] {
        let result = sqlx::query(sql).execute(&db.pool).await;
        assert!(result.is_err(), "{what} was accepted");
    }
}
