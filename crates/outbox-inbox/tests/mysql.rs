//! The MySQL / MariaDB inbox against a real server: a fresh database per test. The tests sit
//! in a module named `mysql` so that a test-name filter `mysql` selects them all.

#![cfg(feature = "mysql")]

mod mysql {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use futures::FutureExt as _;
    use outbox_core::Identifier;
    use outbox_inbox::{InboxError, InboxMessage, MySqlInbox, Outcome};
    use outbox_testkit::services::MariaDb;
    use outbox_testkit::wait::eventually;
    use sqlx::MySqlPool;
    use uuid::Uuid;

    async fn fresh_pool() -> MySqlPool {
        let url = MariaDb::shared()
            .await
            .expect("mariadb starts")
            .fresh_database()
            .await
            .expect("fresh database");
        MySqlPool::connect(&url).await.expect("connects")
    }

    async fn setup() -> (MySqlPool, MySqlInbox) {
        let pool = fresh_pool().await;
        sqlx::query(
            "CREATE TABLE points (customer VARCHAR(64) PRIMARY KEY, n BIGINT NOT NULL) ENGINE = InnoDB",
        )
        .execute(&pool)
        .await
        .expect("points table");
        sqlx::query("INSERT INTO points VALUES ('c1', 0)")
            .execute(&pool)
            .await
            .expect("row");
        let inbox = MySqlInbox::default();
        inbox.migrate(&pool).await.expect("migrates");
        (pool, inbox)
    }

    async fn points(pool: &MySqlPool) -> i64 {
        sqlx::query_scalar("SELECT n FROM points WHERE customer = 'c1'")
            .fetch_one(pool)
            .await
            .expect("points")
    }

    async fn add_points(
        inbox: &MySqlInbox,
        pool: &MySqlPool,
        id: Uuid,
    ) -> Result<Outcome<()>, InboxError<sqlx::Error>> {
        inbox
            .process(pool, "loyalty", id, |conn| {
                async move {
                    sqlx::query("UPDATE points SET n = n + 10 WHERE customer = 'c1'")
                        .execute(conn)
                        .await?;
                    Ok(())
                }
                .boxed()
            })
            .await
    }

    /// Connections of this test's database (other than this one) running an insert into the
    /// inbox table. The first delivery's insert has finished when this is called, so such a
    /// statement has reached the server while the first transaction holds the key: it waits
    /// for that transaction to end.
    async fn waiting_inserts(pool: &MySqlPool) -> i64 {
        sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST
             WHERE DB = DATABASE() AND ID <> CONNECTION_ID()
               AND INFO LIKE '%INSERT INTO `processed_events`%'",
        )
        .fetch_one(pool)
        .await
        .expect("processlist")
    }

    /// A delivered `Account` message of `aggregate_id` at delivery position `seq`.
    fn message(aggregate_id: &str, seq: Option<u64>) -> InboxMessage {
        InboxMessage {
            id: Uuid::now_v7(),
            event_type: "account.changed".to_owned(),
            aggregate_type: "Account".to_owned(),
            aggregate_id: aggregate_id.to_owned(),
            aggregate_seq: seq,
            headers: Vec::new(),
            payload: bytes::Bytes::new(),
        }
    }

    /// `process_message` adding 10 points; fails after the side effect when `fail`.
    async fn apply(
        inbox: &MySqlInbox,
        pool: &MySqlPool,
        m: &InboxMessage,
        fail: bool,
    ) -> Result<Outcome<()>, InboxError<sqlx::Error>> {
        inbox
            .process_message(pool, "loyalty", m, |conn| {
                async move {
                    sqlx::query("UPDATE points SET n = n + 10 WHERE customer = 'c1'")
                        .execute(&mut *conn)
                        .await?;
                    if fail {
                        sqlx::query("INSERT INTO no_such_table VALUES (1)")
                            .execute(conn)
                            .await?;
                    }
                    Ok(())
                }
                .boxed()
            })
            .await
    }

    #[tokio::test]
    async fn a_duplicate_delivery_is_detected_and_its_side_effect_skipped() {
        let (pool, inbox) = setup().await;
        let id = Uuid::now_v7();
        assert_eq!(
            add_points(&inbox, &pool, id).await.expect("first"),
            Outcome::Processed(())
        );
        assert_eq!(
            add_points(&inbox, &pool, id).await.expect("second"),
            Outcome::Duplicate
        );
        assert_eq!(points(&pool).await, 10);
        assert!(inbox.contains(&pool, "loyalty", id).await.expect("query"));
        assert!(
            !inbox
                .contains(&pool, "loyalty", Uuid::now_v7())
                .await
                .expect("query")
        );
        // Another consumer processes the same event once too.
        assert!(
            inbox
                .begin(&pool, "audit", id)
                .await
                .expect("begin")
                .is_some()
        );
        // Consumer names compare byte for byte (utf8mb4_bin): `Loyalty` is another consumer.
        assert!(
            inbox
                .begin(&pool, "Loyalty", id)
                .await
                .expect("begin")
                .is_some()
        );
    }

    #[tokio::test]
    async fn a_handler_failure_rolls_back_the_side_effect_and_the_dedup_record() {
        let (pool, inbox) = setup().await;
        let id = Uuid::now_v7();
        let err = inbox
            .process(&pool, "loyalty", id, |conn| {
                async move {
                    sqlx::query("UPDATE points SET n = n + 10 WHERE customer = 'c1'")
                        .execute(&mut *conn)
                        .await?;
                    // The handler fails. MySQL undoes only the failed statement; the inbox
                    // must roll back the rest.
                    sqlx::query("INSERT INTO no_such_table VALUES (1)")
                        .execute(conn)
                        .await?;
                    Ok::<(), sqlx::Error>(())
                }
                .boxed()
            })
            .await
            .expect_err("handler fails");
        assert!(matches!(err, InboxError::Handler(_)));
        assert_eq!(points(&pool).await, 0);
        assert!(!inbox.contains(&pool, "loyalty", id).await.expect("query"));
        // The redelivery is processed.
        assert_eq!(
            add_points(&inbox, &pool, id).await.expect("retry"),
            Outcome::Processed(())
        );
        assert_eq!(points(&pool).await, 10);
    }

    #[tokio::test]
    async fn a_transaction_dropped_without_commit_leaves_no_mark() {
        let (pool, inbox) = setup().await;
        let id = Uuid::now_v7();
        {
            let mut tx = inbox
                .begin(&pool, "loyalty", id)
                .await
                .expect("begin")
                .expect("first delivery");
            sqlx::query("UPDATE points SET n = n + 10 WHERE customer = 'c1'")
                .execute(&mut *tx)
                .await
                .expect("side effect");
            // Dropped: the consumer crashed before its commit.
        }
        assert!(!inbox.contains(&pool, "loyalty", id).await.expect("query"));
        let mut tx = inbox
            .begin(&pool, "loyalty", id)
            .await
            .expect("begin")
            .expect("the redelivery is a first delivery");
        sqlx::query("UPDATE points SET n = n + 10 WHERE customer = 'c1'")
            .execute(&mut *tx)
            .await
            .expect("side effect");
        tx.commit().await.expect("commit");
        assert_eq!(points(&pool).await, 10);
        assert!(
            inbox
                .begin(&pool, "loyalty", id)
                .await
                .expect("begin")
                .is_none()
        );
    }

    #[tokio::test]
    async fn concurrent_duplicate_deliveries_produce_exactly_one_side_effect() {
        let (pool, inbox) = setup().await;
        for _ in 0..20 {
            let id = Uuid::now_v7();
            let processed = Arc::new(AtomicUsize::new(0));
            let tasks: Vec<_> = (0..2)
                .map(|_| {
                    let (pool, inbox, processed) = (pool.clone(), inbox.clone(), processed.clone());
                    tokio::spawn(async move {
                        if let Outcome::Processed(()) =
                            add_points(&inbox, &pool, id).await.expect("process")
                        {
                            processed.fetch_add(1, Ordering::SeqCst);
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.expect("task");
            }
            assert_eq!(processed.load(Ordering::SeqCst), 1);
        }
        assert_eq!(points(&pool).await, 200);
    }

    #[tokio::test]
    async fn a_duplicate_waits_for_the_first_delivery_and_proceeds_if_it_rolled_back() {
        let (pool, inbox) = setup().await;
        let id = Uuid::now_v7();
        let first = inbox
            .begin(&pool, "loyalty", id)
            .await
            .expect("begin")
            .expect("first delivery");
        let second = tokio::spawn({
            let (pool, inbox) = (pool.clone(), inbox.clone());
            async move { add_points(&inbox, &pool, id).await.expect("second") }
        });
        // The server says when the second delivery waits on the key.
        eventually(Duration::from_secs(30), || async {
            waiting_inserts(&pool).await == 1
        })
        .await
        .expect("the second delivery waits on the key");
        assert!(!second.is_finished());
        first.rollback().await.expect("rollback");
        assert_eq!(second.await.expect("task"), Outcome::Processed(()));
        assert_eq!(points(&pool).await, 10);
    }

    #[tokio::test]
    async fn a_duplicate_waits_for_the_first_delivery_and_is_skipped_if_it_committed() {
        let (pool, inbox) = setup().await;
        let id = Uuid::now_v7();
        let mut first = inbox
            .begin(&pool, "loyalty", id)
            .await
            .expect("begin")
            .expect("first delivery");
        sqlx::query("UPDATE points SET n = n + 10 WHERE customer = 'c1'")
            .execute(&mut *first)
            .await
            .expect("side effect");
        let second = tokio::spawn({
            let (pool, inbox) = (pool.clone(), inbox.clone());
            async move { add_points(&inbox, &pool, id).await.expect("second") }
        });
        eventually(Duration::from_secs(30), || async {
            waiting_inserts(&pool).await == 1
        })
        .await
        .expect("the second delivery waits on the key");
        first.commit().await.expect("commit");
        assert_eq!(second.await.expect("task"), Outcome::Duplicate);
        assert_eq!(points(&pool).await, 10);
    }

    #[tokio::test]
    async fn a_consumer_name_longer_than_its_column_is_refused_not_truncated() {
        let (pool, inbox) = setup().await;
        let id = Uuid::now_v7();
        let (short, long) = ("c".repeat(255), "c".repeat(256));
        let err = inbox
            .begin(&pool, &long, id)
            .await
            .expect_err("too long for VARCHAR(255)");
        assert!(err.is_database());
        // Truncated, it would have recorded the 255-character name and made this a duplicate.
        assert!(!inbox.contains(&pool, &short, id).await.expect("query"));
        assert!(
            inbox
                .begin(&pool, &short, id)
                .await
                .expect("begin")
                .is_some()
        );
    }

    #[tokio::test]
    async fn purge_deletes_only_ids_older_than_the_cutoff() {
        let (pool, inbox) = setup().await;
        let (old, new) = (Uuid::now_v7(), Uuid::now_v7());
        add_points(&inbox, &pool, old).await.expect("old");
        let cutoff = time::OffsetDateTime::now_utc();
        add_points(&inbox, &pool, new).await.expect("new");
        assert_eq!(inbox.purge_before(&pool, cutoff).await.expect("purge"), 1);
        assert!(!inbox.contains(&pool, "loyalty", old).await.expect("query"));
        assert!(inbox.contains(&pool, "loyalty", new).await.expect("query"));
        assert_eq!(
            inbox
                .purge_older_than(&pool, Duration::from_secs(3600))
                .await
                .expect("purge"),
            0
        );
        // A purged id is processed again: the retention rule of docs/inbox.md.
        assert_eq!(
            add_points(&inbox, &pool, old).await.expect("again"),
            Outcome::Processed(())
        );
    }

    #[tokio::test]
    async fn migrate_is_idempotent_and_honours_a_custom_table() {
        let (pool, _) = setup().await;
        let inbox = MySqlInbox::new(Identifier::new("seen").expect("valid"));
        let first = inbox.migrate(&pool).await.expect("migrates");
        assert_eq!(
            first.applied,
            vec![(1, "processed_events"), (2, "positions")]
        );
        let second = inbox.migrate(&pool).await.expect("again");
        assert!(second.applied.is_empty());
        assert_eq!(second.version, outbox_inbox::SCHEMA_VERSION);
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM seen_migrations")
            .fetch_one(&pool)
            .await
            .expect("bookkeeping");
        assert_eq!(n, i64::from(outbox_inbox::SCHEMA_VERSION));
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT CAST(table_name AS CHAR) FROM information_schema.TABLES
             WHERE table_schema = DATABASE() AND engine = 'InnoDB' ORDER BY table_name",
        )
        .fetch_all(&pool)
        .await
        .expect("tables");
        for table in ["seen", "seen_migrations", "seen_positions"] {
            assert!(tables.iter().any(|t| t == table), "{table} in {tables:?}");
        }
        // The custom table is an inbox of its own.
        let id = Uuid::now_v7();
        assert!(
            inbox
                .begin(&pool, "loyalty", id)
                .await
                .expect("begin")
                .is_some()
        );
        assert!(
            !MySqlInbox::default()
                .contains(&pool, "loyalty", id)
                .await
                .expect("query")
        );
    }

    #[tokio::test]
    async fn concurrent_migrates_apply_each_migration_once() {
        let pool = fresh_pool().await;
        let runs: Vec<_> = (0..4)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move { MySqlInbox::default().migrate(&pool).await })
            })
            .collect();
        let mut applied = Vec::new();
        for run in runs {
            let report = run.await.expect("task").expect("migrates");
            assert_eq!(report.version, outbox_inbox::SCHEMA_VERSION);
            applied.extend(report.applied);
        }
        applied.sort_unstable();
        assert_eq!(applied, vec![(1, "processed_events"), (2, "positions")]);
    }

    #[tokio::test]
    async fn a_migration_cut_off_before_its_bookkeeping_row_is_finished_by_the_next() {
        let (pool, inbox) = setup().await;
        // The DDL of migration 2 committed (MySQL commits DDL at once), then the process died
        // before recording it.
        sqlx::query("DELETE FROM processed_events_migrations WHERE version = 2")
            .execute(&pool)
            .await
            .expect("delete");
        let report = inbox.migrate(&pool).await.expect("finishes");
        assert_eq!(report.applied, vec![(2, "positions")]);
        assert_eq!(report.version, outbox_inbox::SCHEMA_VERSION);
    }

    #[tokio::test]
    async fn process_message_records_the_position_with_the_side_effect_and_never_moves_it_back() {
        let (pool, inbox) = setup().await;
        let position = async || {
            inbox
                .applied_position(&pool, "loyalty", "Account", "a1")
                .await
                .expect("position")
        };
        assert_eq!(position().await, 0);
        let first = message("a1", Some(1));
        assert_eq!(
            apply(&inbox, &pool, &first, false).await.expect("1"),
            Outcome::Processed(())
        );
        assert_eq!(position().await, 1);
        apply(&inbox, &pool, &message("a1", Some(3)), false)
            .await
            .expect("3");
        assert_eq!(position().await, 3);
        // A late lower position is applied, but the position never moves back.
        apply(&inbox, &pool, &message("a1", Some(2)), false)
            .await
            .expect("2");
        assert_eq!(position().await, 3);
        // A failed handler rolls back its position with its side effect.
        let failed = message("a1", Some(4));
        assert!(matches!(
            apply(&inbox, &pool, &failed, true).await,
            Err(InboxError::Handler(_))
        ));
        assert_eq!(position().await, 3);
        assert!(
            !inbox
                .contains(&pool, "loyalty", failed.id)
                .await
                .expect("query")
        );
        // A message without a position records none; a redelivery is a duplicate.
        apply(&inbox, &pool, &message("a1", None), false)
            .await
            .expect("no position");
        assert_eq!(
            apply(&inbox, &pool, &first, false).await.expect("again"),
            Outcome::Duplicate
        );
        assert_eq!(position().await, 3);
        assert_eq!(points(&pool).await, 40); // 1, 3, 2 and the position-less one
        // Positions are per consumer and per aggregate.
        assert_eq!(
            inbox
                .applied_position(&pool, "audit", "Account", "a1")
                .await
                .expect("position"),
            0
        );
        assert_eq!(
            inbox
                .applied_position(&pool, "loyalty", "Account", "a2")
                .await
                .expect("position"),
            0
        );
    }

    #[tokio::test]
    async fn a_duplicate_still_records_its_position() {
        let (pool, inbox) = setup().await;
        let m = message("a1", Some(5));
        // Applied once by a handler that recorded no position.
        add_points(&inbox, &pool, m.id).await.expect("first");
        assert!(
            inbox
                .begin_message(&pool, "loyalty", &m)
                .await
                .expect("begin")
                .is_none()
        );
        assert_eq!(
            inbox
                .applied_position(&pool, "loyalty", "Account", "a1")
                .await
                .expect("position"),
            5
        );
        assert_eq!(points(&pool).await, 10);
    }

    /// A JetStream loop with the MySQL order gate: messages published out of order are
    /// applied in order, and a dead-lettered position is passed so that its successor does
    /// not wait for `gap_timeout`.
    #[cfg(feature = "nats")]
    #[tokio::test]
    async fn a_jetstream_loop_with_the_mysql_order_gate_applies_each_aggregate_in_order() {
        use std::num::{NonZeroU32, NonZeroUsize};

        use outbox_core::{Destination, Event, Position, Sink as _};
        use outbox_inbox::LanePolicy;
        use outbox_inbox::nats::JetStreamConsumer;
        use tokio_util::sync::CancellationToken;

        let (pool, inbox) = setup().await;
        sqlx::query(
            "CREATE TABLE applied (n BIGINT AUTO_INCREMENT PRIMARY KEY,
             aggregate_id VARCHAR(64) NOT NULL, seq BIGINT NOT NULL) ENGINE = InnoDB",
        )
        .execute(&pool)
        .await
        .expect("applied table");
        let nats = outbox_testkit::services::Nats::shared()
            .await
            .expect("nats starts");
        let prefix = format!("t{}", &Uuid::now_v7().simple().to_string()[20..]);
        let stream = prefix.to_uppercase();
        let sink = outbox_sinks::NatsConfig {
            url: nats.url().to_owned(),
            destination: Destination::parse(&format!("{prefix}.event.{{aggregate_type}}"))
                .expect("valid"),
            stream: stream.clone(),
            ..outbox_sinks::NatsConfig::default()
        }
        .build()
        .await
        .expect("sink");
        let event = |aggregate_id: &str, seq: u64| Event {
            id: Uuid::now_v7(),
            position: Position(0),
            aggregate_type: "Account".to_owned(),
            aggregate_id: aggregate_id.to_owned(),
            event_type: "account.changed".to_owned(),
            payload: seq.to_string().into_bytes().into(),
            headers: vec![("aggregate_seq".to_owned(), seq.to_string())],
            created_at: time::OffsetDateTime::now_utc(),
            attempts: 0,
        };
        // a: 2 and 3 reach the stream before 1. p: 1 is poison (dead-lettered), 2 is fine.
        let events = [
            event("a", 2),
            event("a", 3),
            event("p", 1),
            event("p", 2),
            event("a", 1),
        ];
        for d in sink.publish(&events).await.expect("published") {
            d.expect("delivered");
        }

        let mut consumer = JetStreamConsumer::new(nats.url(), &stream, "balances");
        consumer.ack_wait = Duration::from_secs(2);
        consumer.policy = LanePolicy {
            lanes: NonZeroUsize::new(4).expect("not zero"),
            max_in_flight: NonZeroUsize::new(32).expect("not zero"),
            max_attempts: NonZeroU32::new(3).expect("not zero"),
            backoff_base: Duration::from_millis(10),
            backoff_max: Duration::from_millis(50),
        };
        // Long enough that only the gate's own bookkeeping can let a held message through.
        consumer.ordered = Some(
            inbox
                .order_gate(pool.clone(), "balances")
                .gap_timeout(Duration::from_secs(600)),
        );
        let handler = {
            let (pool, inbox) = (pool.clone(), inbox.clone());
            move |m: InboxMessage| {
                let (pool, inbox) = (pool.clone(), inbox.clone());
                async move {
                    let seq: i64 = std::str::from_utf8(&m.payload)
                        .expect("utf8")
                        .parse()
                        .expect("number");
                    if m.aggregate_id == "p" && seq == 1 {
                        return Err("poison".to_owned());
                    }
                    let aggregate_id = m.aggregate_id.clone();
                    inbox
                        .process_message(&pool, "balances", &m, |conn| {
                            async move {
                                sqlx::query(
                                    "INSERT INTO applied (aggregate_id, seq) VALUES (?, ?)",
                                )
                                .bind(aggregate_id)
                                .bind(seq)
                                .execute(conn)
                                .await?;
                                Ok::<_, sqlx::Error>(())
                            }
                            .boxed()
                        })
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string())
                }
            }
        };
        let shutdown = CancellationToken::new();
        let run = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { consumer.run(handler, shutdown).await.expect("runs") }
        });
        let applied = async || -> Vec<(String, i64)> {
            sqlx::query_as("SELECT aggregate_id, seq FROM applied ORDER BY n")
                .fetch_all(&pool)
                .await
                .expect("applied")
        };
        eventually(Duration::from_secs(60), || async {
            applied().await.len() >= 4
        })
        .await
        .expect("four messages applied");
        shutdown.cancel();
        let report = run.await.expect("task");

        let rows = applied().await;
        let of = |key: &str| -> Vec<i64> {
            rows.iter()
                .filter(|(a, _)| a == key)
                .map(|(_, s)| *s)
                .collect()
        };
        assert_eq!(of("a"), vec![1, 2, 3], "a applied in order: {rows:?}");
        assert_eq!(of("p"), vec![2], "p/2 applied after p/1 was dead-lettered");
        assert_eq!(report.dead_lettered, 1);
        assert_eq!(report.gaps, 0, "nothing released by the gap timeout");
        for (key, seq) in [("a", 3), ("p", 2)] {
            assert_eq!(
                inbox
                    .applied_position(&pool, "balances", "Account", key)
                    .await
                    .expect("position"),
                seq
            );
        }
    }
}
