//! The producer's opt-in schema check (feature `schemas`): an event whose payload breaks its
//! schema is refused before it is written, with the reason the relay gives, and the caller's
//! rollback leaves neither the business row nor the event; a valid one is written as usual.

use outbox::NewEvent;
use outbox::schemas::Schemas;

const ORDER_PLACED: &str = r#"{"type":"object","properties":{"total_cents":{"type":"integer","minimum":0}},"required":["total_cents"]}"#;

#[tokio::test]
async fn an_invalid_event_is_refused_before_the_transaction_commits() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("order.placed.json"), ORDER_PLACED)?;
    let schemas = Schemas::load(dir.path()).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let db = dir.path().join("app.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", db.display())).await?;
    outbox::sqlite::migrate(&pool, &outbox::Identifier::new("outbox")?).await?;
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, total_cents INTEGER)")
        .execute(&pool)
        .await?;

    // What an application does: business row, check, event, commit; the check refuses.
    let place = |id: &'static str, total: i64| {
        let pool = pool.clone();
        let schemas = &schemas;
        async move {
            let mut tx = pool.begin().await?;
            sqlx::query("INSERT INTO orders (id, total_cents) VALUES (?, ?)")
                .bind(id)
                .bind(total)
                .execute(&mut *tx)
                .await?;
            let event = NewEvent::new(
                "Order",
                id,
                "order.placed",
                format!(r#"{{"total_cents":{total}}}"#),
            );
            if let Err(refused) = schemas.check_new(&event) {
                tx.rollback().await?;
                return Ok::<_, anyhow::Error>(Err(refused.to_string()));
            }
            outbox::sqlite::enqueue(&mut *tx, &event).await?;
            tx.commit().await?;
            Ok(Ok(()))
        }
    };
    let refused = place("o_bad", -5)
        .await?
        .expect_err("a negative total is refused");
    assert_eq!(
        refused,
        "payload does not match schema order.placed.json: /total_cents: -5 is less than the minimum of 0"
    );
    place("o_good", 1250)
        .await?
        .expect("a valid order is written");

    let orders: Vec<String> = sqlx::query_scalar("SELECT id FROM orders")
        .fetch_all(&pool)
        .await?;
    let events: Vec<String> = sqlx::query_scalar("SELECT aggregate_id FROM outbox")
        .fetch_all(&pool)
        .await?;
    assert_eq!(orders, ["o_good"], "the refused order was rolled back");
    assert_eq!(events, ["o_good"], "only the valid event was written");

    // No schema for the type: passes unchecked, as in the relay.
    let other = NewEvent::new("Invoice", "i1", "invoice.sent", "not json");
    assert!(schemas.check_new(&other).is_ok());
    Ok(())
}
