//! The fan-out's copy into a subscription table (`Backend::forward`, `[[subscription]]`)
//! against a real MariaDB: ids, payloads, headers and creation times kept, each aggregate
//! numbered 1, 2, 3, ... in copy order, and a batch copied again after a crash adds nothing
//! and burns no number.

use std::collections::BTreeMap;

use outbox_core::backend::{BackendConfig, OpenOptions};
use outbox_core::{Event, RelayConfig};
use outbox_mysql::{Mode, MySqlConfig};
use outbox_testkit::services::MariaDb;
use time::OffsetDateTime;
use uuid::Uuid;

/// A copied row: id, aggregate_id, seq, payload, headers, created_at, state.
type Row = (
    String,
    String,
    i64,
    Vec<u8>,
    String,
    time::PrimitiveDateTime,
    String,
);

fn event(aggregate: &str, n: u32) -> Event {
    let mut headers = BTreeMap::new();
    headers.insert("trace".to_owned(), format!("t{n}"));
    Event {
        id: Uuid::now_v7(),
        aggregate_type: "Order".into(),
        aggregate_id: aggregate.into(),
        event_type: "order.placed".into(),
        payload: format!("{{\"n\":{n}}}").into_bytes().into(),
        headers: headers.into_iter().collect(),
        created_at: OffsetDateTime::from_unix_timestamp(1_700_000_000).expect("time")
            + time::Duration::microseconds(i64::from(n)),
        position: outbox_core::Position(0),
        attempts: 0,
    }
}

#[tokio::test]
async fn copies_keep_the_event_and_number_each_aggregate_once() -> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    let url = MariaDb::shared().await?.fresh_database().await?;
    let config = MySqlConfig::new(url);
    let sub = config
        .for_subscription("billing")
        .map_err(anyhow::Error::msg)?;
    assert_eq!(sub.table.to_string(), "outbox_sub_billing");
    BackendConfig::validate(&sub, &RelayConfig::default()).map_err(anyhow::Error::msg)?;
    let backend = sub.open(OpenOptions { connections: 2 }).await?;
    backend.migrate().await?;
    let forward = backend.forward()?;

    let first: Vec<Event> = (0..6)
        .map(|n| event(["a", "b"][n as usize % 2], n))
        .collect();
    assert_eq!(forward.copy_in(&first).await?, 6);
    // After a crash the fan-out copies a batch again, with new events behind the old ones.
    let mut again = first[3..].to_vec();
    again.extend((6..9).map(|n| event(["a", "b"][n as usize % 2], n)));
    assert_eq!(forward.copy_in(&again).await?, 3, "only the new events");
    assert_eq!(forward.copy_in(&again).await?, 0, "nothing new");
    assert_eq!(forward.copy_in(&[]).await?, 0);

    let pool = outbox_mysql::connect(&sub, 1).await?;
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, aggregate_id, seq, payload, headers, created_at, state \
             FROM outbox_sub_billing ORDER BY position",
    )
    .fetch_all(&pool)
    .await?;
    let all: Vec<&Event> = first.iter().chain(&again[3..]).collect();
    assert_eq!(rows.len(), all.len());
    let mut next: BTreeMap<String, i64> = BTreeMap::new();
    for (row, e) in rows.iter().zip(&all) {
        assert_eq!(row.0, e.id.hyphenated().to_string(), "copy order kept");
        assert_eq!(row.1, e.aggregate_id);
        let want = next.entry(row.1.clone()).or_insert(0);
        *want += 1;
        assert_eq!(row.2, *want, "{}: seq", row.0);
        assert_eq!(row.3, e.payload.to_vec());
        let headers: serde_json::Value = serde_json::from_str(&row.4)?;
        assert_eq!(headers["trace"], e.headers[0].1.as_str());
        assert_eq!(row.5.assume_utc(), e.created_at);
        assert_eq!(row.6, "pending");
    }

    // The binlog source does not fan out: refused, naming the key.
    let mut cdc = config.clone();
    cdc.mode = Mode::Cdc;
    let err = cdc.for_subscription("billing").expect_err("cdc");
    assert!(err.starts_with("source.mode:"), "{err}");
    Ok(())
}
