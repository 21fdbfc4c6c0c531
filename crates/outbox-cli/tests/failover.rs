//! Database failover under traffic (issue 36), the production shape: a primary with a
//! synchronous standby (PostgreSQL) or a semi-synchronous GTID replica (MariaDB); producers and
//! two relay processes reach the database through ONE stable address (a forwarder standing for
//! a virtual IP or a DNS name); each relay runs under a restart loop like systemd's
//! `Restart=always`. Under traffic the primary is killed (SIGKILL), the standby promoted and
//! the address moved to it; relays are also killed with SIGKILL around the switch. Producers
//! keep writing through it all.
//!
//! The oracle, against the surviving (promoted) server's outbox table:
//!
//! - **lost 0**: every row of that table was delivered (and every commit a producer saw
//!   succeed is a row there: the standby is synchronous);
//! - **phantom 0**: nothing was delivered that the table does not have (an event of a
//!   transaction lost with the old primary, or rolled back);
//! - **order kept**: per aggregate, the first delivery of each event follows commit order (a
//!   counter row per aggregate, bumped in the same transaction, numbers the events).
//!
//! Each test prints (stderr) the time from the move of the address to the first delivery after
//! it, to the first delivery of an event written after it, and the events delivered twice:
//!
//! ```sh
//! cargo test -p outbox-cli --test failover -- --nocapture --test-threads 1
//! ```
//!
//! The "vanished" runs: the old primary's machine goes silent (no FIN, no RST) while a relay
//! has a batch in flight; the relay gives up on its connection after `relay.source_timeout`
//! (the CDC stream after `wal_sender_timeout`) and goes on with the new primary.

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use outbox_testkit::forwarder::{Forwarder, OnSwitch};
use outbox_testkit::services::{HttpReceiver, MariaDbPair, PostgresPair};
use rand::Rng;
use sqlx::Row as _;
use support::Workdir;
use tokio::sync::mpsc;
use uuid::Uuid;

/// Producer tasks, writing concurrently.
const PRODUCERS: usize = 4;
/// Aggregates shared by every producer: their transactions overlap on each one.
const AGGREGATES: usize = 8;
/// Transactions committed (OK) before the primary is killed, and again after the switch.
const PHASE_TXNS: usize = 300;
/// Deliveries before the primary is killed: the relays are at work when it dies.
const DELIVERED_BEFORE_CRASH: usize = 100;
/// The longest a producer's transaction may take before its outcome counts as unknown.
const TXN_TIMEOUT: Duration = Duration::from_secs(15);
/// Waiting for the producers to reach a phase's count (a busy machine writes slower).
const PHASE_TIMEOUT: Duration = Duration::from_secs(120);
/// Draining: give up once no new event of the promoted server's table arrived for this long.
const DRAIN_STALL: Duration = Duration::from_secs(30);
/// The table of the producers' counters (one row per aggregate, bumped with each event).
const COUNTERS: &str = "failover_counters";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_polling_relays_survive_a_promotion_losing_and_inventing_nothing()
-> anyhow::Result<()> {
    failover_scenario(Db::Postgres, Mode::Poll).await
}

/// The old primary's machine vanishes without a reset while a relay is in the middle of a
/// batch: every connection to it hangs, and the relays are not killed after the address moves.
/// They must notice by themselves (`relay.source_timeout`), and stop when asked. Without the
/// deadline, the relay whose batch was in flight waited on its silent connection for good,
/// delivered nothing more and ignored SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_polling_relays_recover_from_a_primary_that_vanished_silently()
-> anyhow::Result<()> {
    failover(Shape::new(Db::Postgres, Mode::Poll).vanishing()).await
}

/// The same with MariaDB polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_polling_relays_recover_from_a_primary_that_vanished_silently() -> anyhow::Result<()>
{
    failover(Shape::new(Db::MariaDb, Mode::Poll).vanishing()).await
}

/// The same with MariaDB binlog CDC.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_binlog_cdc_relays_recover_from_a_primary_that_vanished_silently()
-> anyhow::Result<()> {
    failover(Shape::new(Db::MariaDb, Mode::Cdc).vanishing()).await
}

/// The replica was seeded later than the primary started its binlog (here: its binlog starts
/// over after the primary wrote 2 MB), so both have `binlog.000001` with the same
/// transactions at different offsets. The kept position (file, offset and GTID) must still
/// move on over the promoted replica's transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_binlog_cdc_relays_survive_a_promotion_of_a_replica_with_a_younger_binlog()
-> anyhow::Result<()> {
    failover(Shape::new(Db::MariaDb, Mode::Cdc).with_younger_replica_binlog()).await
}

/// The promoted server has no replication slot (PostgreSQL < 17 keeps logical slots on the
/// primary only): the relays recover it (`source.on_slot_loss = "recover"`, docs/cdc.md
/// "Failover"), publishing from the table what the lost slot had not acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_cdc_relays_survive_a_promotion_losing_and_inventing_nothing() -> anyhow::Result<()>
{
    failover_scenario(Db::Postgres, Mode::Cdc).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_polling_relays_survive_a_replica_promotion_losing_and_inventing_nothing()
-> anyhow::Result<()> {
    failover_scenario(Db::MariaDb, Mode::Poll).await
}

/// The binlog stream resumes on the promoted replica by the GTID it kept (the replica's binlog
/// holds the old primary's transactions under their GTIDs: `log_slave_updates`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_binlog_cdc_relays_survive_a_replica_promotion_losing_and_inventing_nothing()
-> anyhow::Result<()> {
    failover_scenario(Db::MariaDb, Mode::Cdc).await
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Db {
    Postgres,
    MariaDb,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Poll,
    Cdc,
}

/// The primary and its standby.
enum Pair {
    Pg(PostgresPair),
    Maria(MariaDbPair),
}

impl Pair {
    async fn start(db: Db) -> anyhow::Result<Pair> {
        Ok(match db {
            Db::Postgres => Pair::Pg(PostgresPair::start(true).await?),
            Db::MariaDb => Pair::Maria(MariaDbPair::start(true).await?),
        })
    }

    fn primary_addr(&self) -> SocketAddr {
        let port = match self {
            Pair::Pg(p) => p.primary().port(),
            Pair::Maria(p) => p.primary().port(),
        };
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn standby_addr(&self) -> SocketAddr {
        let port = match self {
            Pair::Pg(p) => p.standby().port(),
            Pair::Maria(p) => p.replica().port(),
        };
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// A new database on the primary; its name.
    async fn create_database(&self) -> anyhow::Result<String> {
        let url = match self {
            Pair::Pg(p) => p.primary().fresh_database().await?,
            Pair::Maria(p) => p.primary().fresh_database().await?,
        };
        Ok(url.rsplit('/').next().context("database name")?.to_owned())
    }

    /// The URL of `database` at `addr` (the forwarder, or a server directly).
    fn url(&self, addr: SocketAddr, database: &str) -> String {
        match self {
            Pair::Pg(_) => format!("postgres://postgres@{addr}/{database}"),
            Pair::Maria(_) => format!("mysql://root@{addr}/{database}"),
        }
    }

    /// Waits until the standby has everything the primary wrote so far (the schema).
    async fn wait_caught_up(&self) -> anyhow::Result<()> {
        match self {
            Pair::Pg(p) => p.wait_caught_up().await,
            Pair::Maria(p) => p.wait_caught_up().await,
        }
    }

    async fn crash_primary(&self) -> anyhow::Result<()> {
        match self {
            Pair::Pg(p) => p.crash_primary().await,
            Pair::Maria(p) => p.crash_primary().await,
        }
    }

    async fn promote_standby(&self) -> anyhow::Result<()> {
        match self {
            Pair::Pg(p) => p.promote_standby().await,
            Pair::Maria(p) => p.promote_replica().await,
        }
    }
}

/// The producers' connections (through the forwarder), and the promoted server's table.
#[derive(Clone)]
enum Pool {
    Pg(sqlx::PgPool),
    My(sqlx::MySqlPool),
}

/// One row of the outbox table: id, aggregate, payload (`n.k`: the aggregate's counter value
/// of its transaction, and its place in the transaction).
type Row = (Uuid, String, String);

impl Pool {
    /// One connection, made on demand; waiting for it ends after a few seconds, so that a
    /// producer notices a dead address and tries again.
    fn connect_lazy(url: &str) -> anyhow::Result<Pool> {
        Ok(if url.starts_with("postgres") {
            Pool::Pg(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect_lazy(url)?,
            )
        } else {
            Pool::My(
                sqlx::mysql::MySqlPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect_lazy(url)?,
            )
        })
    }

    /// The business table: one counter row per aggregate.
    async fn create_counters(&self) -> anyhow::Result<()> {
        let columns = match self {
            Pool::Pg(_) => "(aggregate_id text PRIMARY KEY, n bigint NOT NULL)",
            Pool::My(_) => {
                "(aggregate_id VARCHAR(64) PRIMARY KEY, n BIGINT NOT NULL) ENGINE = InnoDB"
            }
        };
        // The aggregates' names are made here: safe to splice.
        let rows: Vec<String> = (0..AGGREGATES)
            .map(|a| format!("('{}', 0)", aggregate(a)))
            .collect();
        for sql in [
            format!("CREATE TABLE {COUNTERS} {columns}"),
            format!("INSERT INTO {COUNTERS} VALUES {}", rows.join(", ")),
        ] {
            let sql = sqlx::AssertSqlSafe(sql);
            match self {
                Pool::Pg(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop)?,
                Pool::My(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop)?,
            }
        }
        Ok(())
    }

    /// One producer transaction, as an application writes it in any language: bump the
    /// aggregate's counter (its row lock orders the aggregate's commits), insert one event per
    /// id with the counter in its payload, then commit (or roll back).
    async fn write(
        &self,
        aggregate: &str,
        ids: &[Uuid],
        phase: &str,
        commit: bool,
    ) -> anyhow::Result<()> {
        let headers = serde_json::json!({ "phase": phase }).to_string();
        match self {
            Pool::Pg(pool) => {
                let mut tx = pool.begin().await?;
                let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "UPDATE {COUNTERS} SET n = n + 1 WHERE aggregate_id = $1 RETURNING n"
                )))
                .bind(aggregate)
                .fetch_one(&mut *tx)
                .await?;
                for (k, id) in ids.iter().enumerate() {
                    sqlx::query(
                        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers) \
                         VALUES ($1, 'Order', $2, 'order.changed', $3, $4::jsonb)",
                    )
                    .bind(id)
                    .bind(aggregate)
                    .bind(format!("{n}.{k}").into_bytes())
                    .bind(&headers)
                    .execute(&mut *tx)
                    .await?;
                }
                if commit {
                    tx.commit().await?;
                } else {
                    tx.rollback().await?;
                }
            }
            Pool::My(pool) => {
                let mut tx = pool.begin().await?;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE {COUNTERS} SET n = n + 1 WHERE aggregate_id = ?"
                )))
                .bind(aggregate)
                .execute(&mut *tx)
                .await?;
                let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT n FROM {COUNTERS} WHERE aggregate_id = ?"
                )))
                .bind(aggregate)
                .fetch_one(&mut *tx)
                .await?;
                for (k, id) in ids.iter().enumerate() {
                    sqlx::query(
                        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers) \
                         VALUES (?, 'Order', ?, 'order.changed', ?, ?)",
                    )
                    .bind(id.to_string())
                    .bind(aggregate)
                    .bind(format!("{n}.{k}").into_bytes())
                    .bind(&headers)
                    .execute(&mut *tx)
                    .await?;
                }
                if commit {
                    tx.commit().await?;
                } else {
                    tx.rollback().await?;
                }
            }
        }
        Ok(())
    }

    /// Every row of the outbox table.
    async fn rows(&self) -> anyhow::Result<Vec<Row>> {
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        Ok(match self {
            Pool::Pg(pool) => sqlx::query("SELECT id, aggregate_id, payload FROM outbox")
                .fetch_all(pool)
                .await?
                .iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, text(r.try_get(2)?))))
                .collect::<Result<_, sqlx::Error>>()?,
            Pool::My(pool) => sqlx::query("SELECT id, aggregate_id, payload FROM outbox")
                .fetch_all(pool)
                .await?
                .iter()
                .map(|r| {
                    let id: String = r.try_get(0)?;
                    let id = Uuid::parse_str(&id).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
                    Ok((id, r.try_get(1)?, text(r.try_get(2)?)))
                })
                .collect::<Result<_, sqlx::Error>>()?,
        })
    }
}

fn aggregate(a: usize) -> String {
    format!("agg-{a}")
}

/// What the producers share with the test.
#[derive(Default)]
struct Traffic {
    /// Set once the address points at the promoted standby: later transactions are phase `b`.
    switched: AtomicBool,
    stop: AtomicBool,
    /// Transactions committed OK, before and after the switch.
    ok_before: AtomicUsize,
    ok_after: AtomicUsize,
    failed: AtomicUsize,
}

/// What one producer did, by event id.
#[derive(Default)]
struct Written {
    /// Committed: the commit returned OK.
    ok: Vec<Uuid>,
    /// The commit (or a statement before it) failed: committed or not, the database knows.
    unknown: Vec<Uuid>,
    /// Rolled back on purpose (or failed before the rollback): never committed.
    rolled_back: Vec<Uuid>,
    /// Of `ok` and `unknown`, the events written after the switch.
    after: Vec<Uuid>,
    last_error: Option<String>,
}

/// One producer with a connection of its own, writing until told to stop.
async fn produce(url: String, traffic: Arc<Traffic>) -> anyhow::Result<Written> {
    let mut out = Written::default();
    let mut pool = Pool::connect_lazy(&url)?;
    while !traffic.stop.load(Ordering::SeqCst) {
        let (agg, n_events, rollback, pause) = {
            let mut rng = rand::rng();
            (
                aggregate(rng.random_range(0..AGGREGATES)),
                rng.random_range(1..=3),
                rng.random_bool(0.1),
                Duration::from_millis(rng.random_range(1..8)),
            )
        };
        let ids: Vec<Uuid> = (0..n_events).map(|_| Uuid::now_v7()).collect();
        let after = traffic.switched.load(Ordering::SeqCst);
        let phase = if after { "b" } else { "a" };
        let done = tokio::time::timeout(TXN_TIMEOUT, pool.write(&agg, &ids, phase, !rollback))
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {TXN_TIMEOUT:?}")));
        match done {
            Ok(()) if rollback => out.rolled_back.extend(ids),
            Ok(()) => {
                if after {
                    out.after.extend(&ids);
                }
                out.ok.extend(ids);
                let count = if after {
                    &traffic.ok_after
                } else {
                    &traffic.ok_before
                };
                count.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => {
                traffic.failed.fetch_add(1, Ordering::SeqCst);
                out.last_error = Some(format!("{e:#}"));
                if rollback {
                    out.rolled_back.extend(ids);
                } else {
                    if after {
                        out.after.extend(&ids);
                    }
                    out.unknown.extend(ids);
                }
                // The database is away: try again shortly on a new connection, as an
                // application would (one stuck on a vanished server holds its pool).
                pool = Pool::connect_lazy(&url)?;
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
        tokio::time::sleep(pause).await;
    }
    Ok(out)
}

/// A command to a relay's restart loop.
enum Cmd {
    /// SIGKILL the running relay (the loop starts another).
    Kill,
    /// SIGTERM the running relay and end the loop.
    Stop,
}

/// What happened to one relay slot.
#[derive(Default)]
struct RelayLife {
    starts: usize,
    kills: usize,
    /// Exit codes of relays that exited on their own (the loop restarted them).
    exits: Vec<Option<i32>>,
    /// The last relay's exit code after SIGTERM.
    last: Option<i32>,
    /// The last relay did not exit within 30 s of SIGTERM (it was then SIGKILLed): the end
    /// of its log.
    stuck: Option<String>,
}

impl std::fmt::Debug for RelayLife {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} starts, {} killed by the test, exits on its own {:?}, last {}",
            self.starts,
            self.kills,
            self.exits,
            match (self.stuck.is_some(), self.last) {
                (true, _) => "did not exit after SIGTERM".to_owned(),
                (false, code) => format!("exited {code:?} after SIGTERM"),
            }
        )
    }
}

/// A relay under a restart loop like systemd's `Restart=always`: a relay that exits is
/// started again after 200 ms (doubling up to 1.6 s while it keeps failing within 5 s of its
/// start, as `RestartSteps` would); a relay killed by the test is started again at once.
struct Supervised {
    commands: mpsc::UnboundedSender<Cmd>,
    task: tokio::task::JoinHandle<anyhow::Result<RelayLife>>,
}

impl Supervised {
    fn start(work: Arc<Workdir>, config: PathBuf, log: String) -> Supervised {
        let (commands, mut rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut life = RelayLife::default();
            let mut quick_failures = 0u32;
            loop {
                if life.starts > 0 {
                    work.append_log(&log, support::RESTART_MARKER)?;
                }
                let mut child = work.spawn_relay(&config, &log)?;
                life.starts += 1;
                let started = Instant::now();
                tokio::select! {
                    status = child.wait() => {
                        life.exits.push(status?.code());
                        quick_failures = if started.elapsed() < Duration::from_secs(5) {
                            (quick_failures + 1).min(4)
                        } else {
                            1
                        };
                        let delay = Duration::from_millis(100) * 2u32.pow(quick_failures);
                        tokio::select! {
                            () = tokio::time::sleep(delay) => {}
                            cmd = rx.recv() => if matches!(cmd, Some(Cmd::Stop) | None) {
                                return Ok(life);
                            }
                        }
                    }
                    cmd = rx.recv() => match cmd {
                        Some(Cmd::Kill) => {
                            child.start_kill()?;
                            child.wait().await?;
                            life.kills += 1;
                        }
                        Some(Cmd::Stop) | None => {
                            match support::terminate(&mut child, Duration::from_secs(30)).await {
                                Ok(code) => life.last = code,
                                Err(_) => {
                                    child.start_kill()?;
                                    child.wait().await?;
                                    life.stuck = Some(log_tail(&work, &log, 30));
                                }
                            }
                            return Ok(life);
                        }
                    }
                }
            }
        });
        Supervised { commands, task }
    }

    fn kill(&self) {
        let _ = self.commands.send(Cmd::Kill);
    }

    async fn stop(self) -> anyhow::Result<RelayLife> {
        let _ = self.commands.send(Cmd::Stop);
        self.task.await?
    }
}

fn relay_config(db: Db, mode: Mode, url: &str, hook: &str) -> String {
    let source = match (db, mode) {
        (Db::Postgres, Mode::Poll) => "kind = \"postgres\"\nclaim_timeout = \"10s\"\n",
        (Db::Postgres, Mode::Cdc) => "kind = \"postgres\"\nmode = \"cdc\"\n",
        (Db::MariaDb, Mode::Poll) => "kind = \"mysql\"\nclaim_timeout = \"10s\"\n",
        (Db::MariaDb, Mode::Cdc) => "kind = \"mysql\"\nmode = \"cdc\"\nclaim_timeout = \"5s\"\n",
    };
    format!(
        r#"[source]
url = "{url}"
connect_timeout = "3s"
{source}
[relay]
batch_size = 20
poll_interval = "5ms"
publish_timeout = "3s"
source_timeout = "5s"

[sink]
kind = "http"
url = "{hook}"
"#
    )
}

/// One accepted delivery: event id, aggregate, payload.
struct Delivery {
    id: Uuid,
    aggregate: String,
    payload: String,
}

fn deliveries(hooks: &HttpReceiver) -> anyhow::Result<Vec<Delivery>> {
    hooks
        .received()
        .iter()
        .filter(|r| r.accepted() && r.method == "POST")
        .map(|r| {
            let header = |name: &str| r.header(name).unwrap_or_default().to_owned();
            Ok(Delivery {
                id: Uuid::parse_str(&header("outbox-id")).context("outbox-id header")?,
                aggregate: header("outbox-aggregate_id"),
                payload: String::from_utf8_lossy(&r.body).into_owned(),
            })
        })
        .collect()
}

/// Waits until `condition` holds; fails with `what` and the producers' state.
async fn wait_for_traffic(
    what: &str,
    traffic: &Traffic,
    condition: impl Fn() -> bool,
) -> anyhow::Result<()> {
    outbox_testkit::wait::eventually(PHASE_TIMEOUT, || async { condition() })
        .await
        .with_context(|| {
            format!(
                "{what}: {} transactions committed before the switch, {} after, {} failed",
                traffic.ok_before.load(Ordering::SeqCst),
                traffic.ok_after.load(Ordering::SeqCst),
                traffic.failed.load(Ordering::SeqCst)
            )
        })
}

async fn failover_scenario(db: Db, mode: Mode) -> anyhow::Result<()> {
    failover(Shape::new(db, mode)).await
}

/// What a run does.
#[derive(Debug, Clone, Copy)]
struct Shape {
    db: Db,
    mode: Mode,
    /// The primary's machine vanishes: its connections hang (no FIN, no RST), new ones to the
    /// address go nowhere until it moves, and no relay is killed after the move (they must
    /// find out by themselves).
    vanish: bool,
    /// MariaDB: the replica's binlog starts over (`RESET MASTER`, as on a replica seeded
    /// from a backup) after the primary wrote 2 MB into its own, so both have a file
    /// `binlog.000001` but the same transaction sits further on in the primary's.
    younger_replica_binlog: bool,
}

impl Shape {
    fn new(db: Db, mode: Mode) -> Shape {
        Shape {
            db,
            mode,
            vanish: false,
            younger_replica_binlog: false,
        }
    }

    fn vanishing(self) -> Shape {
        Shape {
            vanish: true,
            ..self
        }
    }

    fn with_younger_replica_binlog(self) -> Shape {
        Shape {
            younger_replica_binlog: true,
            ..self
        }
    }
}

async fn failover(shape: Shape) -> anyhow::Result<()> {
    let Shape {
        db,
        mode,
        vanish,
        younger_replica_binlog,
    } = shape;
    outbox_testkit::init_tracing();
    let name = format!(
        "{db:?} {mode:?}{}{}",
        if vanish { " (primary vanished)" } else { "" },
        if younger_replica_binlog {
            " (younger replica binlog)"
        } else {
            ""
        }
    )
    .to_lowercase();
    let pair = Pair::start(db).await?;
    let vip = Forwarder::start(pair.primary_addr()).await?;
    let database = pair.create_database().await?;
    let url = pair.url(vip.addr(), &database);
    if younger_replica_binlog {
        restart_replica_binlog(&pair, &database).await?;
    }
    let hooks = Arc::new(HttpReceiver::start().await?);
    let work = Arc::new(Workdir::new()?);
    let config = work.write_config(
        "outbox.toml",
        &relay_config(db, mode, &url, &hooks.url_for("/events")),
    )?;
    let config_arg = config.to_str().context("utf-8 path")?;
    work.run_ok(&["migrate", "--config", config_arg]).await?;
    Pool::connect_lazy(&url)?.create_counters().await?;
    pair.wait_caught_up().await?;

    let relays = [0, 1].map(|i| Supervised::start(work.clone(), config.clone(), relay_log(i)));
    let traffic = Arc::new(Traffic::default());
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|_| tokio::spawn(produce(url.clone(), traffic.clone())))
        .collect();

    // Before: traffic, relays delivering, one relay killed half-way.
    wait_for_traffic("half of the first phase", &traffic, || {
        traffic.ok_before.load(Ordering::SeqCst) >= PHASE_TXNS / 2
    })
    .await?;
    relays[0].kill();
    wait_for_traffic("the first phase", &traffic, || {
        traffic.ok_before.load(Ordering::SeqCst) >= PHASE_TXNS
    })
    .await?;
    hooks
        .wait_for_accepted(DELIVERED_BEFORE_CRASH, PHASE_TIMEOUT)
        .await
        .with_context(|| relay_logs(&work))?;

    // The failover: a relay killed, the primary killed, the standby promoted, the address
    // moved (connections to the old primary closed, or hanging if it vanished), another
    // relay killed.
    relays[1].kill();
    if vanish {
        // A relay is in the middle of a batch (its claim open, waiting for the broker's
        // answers) when the machine goes: its next statement meets a silent connection.
        hooks.hold_answers();
        hooks
            .wait_until("a batch in flight", PHASE_TIMEOUT, |_| {
                !hooks.unanswered().is_empty()
            })
            .await?;
        vip.blackhole(OnSwitch::Hang);
    }
    let crashed_at = Instant::now();
    pair.crash_primary().await?;
    pair.promote_standby().await?;
    vip.switch_to(pair.standby_addr(), OnSwitch::Close);
    hooks.release_answers();
    let switched_at = Instant::now();
    traffic.switched.store(true, Ordering::SeqCst);
    let base = hooks.received().len();
    let first_after = {
        let hooks = hooks.clone();
        tokio::spawn(async move {
            hooks
                .wait_until("a delivery after the switch", PHASE_TIMEOUT, |r| {
                    r[base.min(r.len())..].iter().any(|r| r.accepted())
                })
                .await
                .map(|_| switched_at.elapsed())
        })
    };
    let first_new = {
        let hooks = hooks.clone();
        tokio::spawn(async move {
            hooks
                .wait_until("an event written after the switch", PHASE_TIMEOUT, |r| {
                    r[base.min(r.len())..]
                        .iter()
                        .any(|r| r.accepted() && r.header("outbox-phase") == Some("b"))
                })
                .await
                .map(|_| switched_at.elapsed())
        })
    };
    if !vanish {
        relays[0].kill();
    }

    // After: traffic on the promoted server, one more relay killed half-way.
    wait_for_traffic("half of the second phase", &traffic, || {
        traffic.ok_after.load(Ordering::SeqCst) >= PHASE_TXNS / 2
    })
    .await?;
    if !vanish {
        relays[1].kill();
    }
    wait_for_traffic("the second phase", &traffic, || {
        traffic.ok_after.load(Ordering::SeqCst) >= PHASE_TXNS
    })
    .await?;
    traffic.stop.store(true, Ordering::SeqCst);
    let mut written = Written::default();
    for p in producers {
        let w = p.await??;
        written.ok.extend(w.ok);
        written.unknown.extend(w.unknown);
        written.rolled_back.extend(w.rolled_back);
        written.after.extend(w.after);
        written.last_error = w.last_error.or(written.last_error);
    }

    // What survived: the promoted server's table, read directly.
    let survivor = Pool::connect_lazy(&pair.url(pair.standby_addr(), &database))?;
    let table = survivor.rows().await?;
    let expected: HashSet<Uuid> = table.iter().map(|(id, ..)| *id).collect();
    let drained = wait_drained(&hooks, &expected).await;
    let figures = Figures {
        failover: switched_at - crashed_at,
        first_delivery: finished(first_after).await,
        first_new_event: finished(first_new).await,
    };
    let mut lives = Vec::new();
    for relay in relays {
        lives.push(relay.stop().await?);
    }

    // Binlog CDC: the kept position must have moved on over the promoted server's own
    // transactions (GTIDs of server 2), or a relay started later would publish everything
    // since the promotion again.
    let kept = match (&survivor, mode) {
        (Pool::My(pool), Mode::Cdc) => Some(kept_binlog_position(pool).await?),
        _ => None,
    };
    let report = Report::new(&table, &written, &deliveries(&hooks)?);
    eprintln!(
        "failover {name}: {}\n  {}\n  relays: {lives:?}\n  producers: {} transactions failed (last error: {})",
        report.summary(),
        figures.summary(&report),
        traffic.failed.load(Ordering::SeqCst),
        written.last_error.as_deref().unwrap_or("none"),
    );
    let verdict = report.verdict();
    match &verdict {
        Ok(()) => eprintln!("failover {name}: {}", relay_errors(&work)),
        Err(e) => eprintln!("failover {name}: FAILED: {e}\n{}", relay_errors(&work)),
    }
    verdict.with_context(|| format!("failover {name} (drain: {drained:?})"))?;
    for (i, life) in lives.iter().enumerate() {
        ensure!(
            life.stuck.is_none(),
            "failover {name}: relay {i} did not exit within 30 s of SIGTERM (hung on a connection?)\n{}",
            life.stuck.as_deref().unwrap_or_default()
        );
    }
    if let Some(kept) = kept {
        eprintln!("failover {name}: {kept}");
        ensure!(
            kept.moved_on,
            "the kept binlog position did not move over the promoted server's transactions: {kept}"
        );
    }
    ensure!(
        report.written_after > 0,
        "no event written after the switch reached the promoted server's table"
    );
    Ok(())
}

/// Writes 2 MB into the primary's binlog (a table of its own), waits until the replica has
/// it, then starts the replica's binlog over (`RESET MASTER`): the replica keeps replicating,
/// and logs what it replicates from then on at offsets 2 MB lower than the primary does.
async fn restart_replica_binlog(pair: &Pair, database: &str) -> anyhow::Result<()> {
    let Pair::Maria(maria) = pair else {
        anyhow::bail!("a younger replica binlog is a MariaDB set-up");
    };
    let primary = sqlx::MySqlPool::connect(&pair.url(pair.primary_addr(), database)).await?;
    sqlx::raw_sql("CREATE TABLE failover_filler (b LONGBLOB) ENGINE = InnoDB")
        .execute(&primary)
        .await?;
    for _ in 0..32 {
        sqlx::raw_sql("INSERT INTO failover_filler VALUES (REPEAT('x', 65536))")
            .execute(&primary)
            .await?;
    }
    primary.close().await;
    maria.wait_caught_up().await?;
    let replica = sqlx::MySqlPool::connect(maria.replica().url()).await?;
    sqlx::raw_sql("RESET MASTER").execute(&replica).await?;
    replica.close().await;
    Ok(())
}

/// Where the binlog CDC relays keep their position, on the promoted server.
struct KeptPosition {
    file: String,
    offset: i64,
    token: i64,
    gtid: String,
    /// The server's binlog head: `SHOW MASTER STATUS` and `@@gtid_binlog_pos`.
    head: String,
    /// The kept GTID of domain 0 is one of the promoted server's (server id 2).
    moved_on: bool,
}

impl std::fmt::Display for KeptPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kept binlog position {}:{} (token {}), GTID {}; server head {}",
            self.file, self.offset, self.token, self.gtid, self.head
        )
    }
}

async fn kept_binlog_position(pool: &sqlx::MySqlPool) -> anyhow::Result<KeptPosition> {
    let (file, offset, token, gtid): (String, i64, i64, Option<String>) =
        sqlx::query_as("SELECT binlog_file, binlog_pos, token, gtid FROM outbox_cdc_position")
            .fetch_one(pool)
            .await?;
    let gtid = gtid.unwrap_or_default();
    let status = sqlx::raw_sql("SHOW MASTER STATUS").fetch_one(pool).await?;
    let head_file: String = status.try_get(0)?;
    let head_offset: u64 = status.try_get(1)?;
    let head_gtid: String = sqlx::query_scalar("SELECT CAST(@@gtid_binlog_pos AS CHAR)")
        .fetch_one(pool)
        .await?;
    let moved_on = gtid.split(',').any(|g| g.trim().starts_with("0-2-"));
    Ok(KeptPosition {
        file,
        offset,
        token,
        gtid,
        head: format!("{head_file}:{head_offset}, GTID {head_gtid}"),
        moved_on,
    })
}

/// What a measuring task found, if it is done (nothing happened yet otherwise: it is ended).
async fn finished(task: tokio::task::JoinHandle<anyhow::Result<Duration>>) -> Option<Duration> {
    if task.is_finished() {
        task.await.ok()?.ok()
    } else {
        task.abort();
        None
    }
}

fn relay_log(i: usize) -> String {
    format!("relay-{i}.log")
}

/// The last `n` lines of `log` since the relay's last start.
fn log_tail(work: &Workdir, log: &str, n: usize) -> String {
    let text = work.read_log(log);
    let run = text
        .rsplit(support::RESTART_MARKER)
        .next()
        .unwrap_or_default();
    let lines: Vec<&str> = run.lines().collect();
    format!(
        "--- {log}, last lines ---\n{}",
        lines[lines.len().saturating_sub(n)..].join("\n")
    )
}

fn relay_logs(work: &Workdir) -> String {
    (0..2)
        .map(|i| format!("--- {} ---\n{}", relay_log(i), work.read_log(&relay_log(i))))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The distinct warning and error lines of the relays' logs (timestamps cut), for a report.
fn relay_errors(work: &Workdir) -> String {
    let mut seen = BTreeMap::new();
    for i in 0..2 {
        for line in work.read_log(&relay_log(i)).lines() {
            if !(line.contains("ERROR") || line.contains("WARN") || line.starts_with("error:")) {
                continue;
            }
            let key: String = line
                .split_once("Z ")
                .map_or(line, |(_, rest)| rest)
                .chars()
                .take(300)
                .collect();
            *seen.entry(key).or_insert(0) += 1;
        }
    }
    let lines: Vec<String> = seen
        .into_iter()
        .map(|(line, n)| format!("  {n:>4} x {line}"))
        .collect();
    format!(
        "relay warnings and errors ({} distinct):\n{}",
        lines.len(),
        lines.join("\n")
    )
}

/// Waits until every event of `expected` was delivered, or none more arrived for
/// [`DRAIN_STALL`]; says which.
async fn wait_drained(hooks: &HttpReceiver, expected: &HashSet<Uuid>) -> Result<(), String> {
    let mut best = 0;
    let mut progress_at = Instant::now();
    loop {
        let have = deliveries(hooks)
            .map(|d| {
                d.iter()
                    .filter(|d| expected.contains(&d.id))
                    .map(|d| d.id)
                    .collect::<HashSet<_>>()
                    .len()
            })
            .unwrap_or(0);
        if have == expected.len() {
            return Ok(());
        }
        if have > best {
            best = have;
            progress_at = Instant::now();
        }
        if progress_at.elapsed() >= DRAIN_STALL {
            return Err(format!(
                "{have} of {} events delivered, none more for {DRAIN_STALL:?}",
                expected.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The oracle's findings.
struct Report {
    /// Rows of the promoted server's table.
    events: usize,
    /// Rows written after the switch.
    written_after: usize,
    /// Commits that returned OK but are not in the table (the database lost them).
    acknowledged_missing: Vec<Uuid>,
    /// Rows never delivered.
    lost: Vec<Uuid>,
    /// Delivered, but not in the table.
    phantom: Vec<Uuid>,
    /// Of the phantoms, events of transactions rolled back on purpose.
    rolled_back_delivered: usize,
    /// Transactions whose outcome the producer did not learn (commit failed), and how many of
    /// their events the promoted server has.
    unknown: usize,
    unknown_committed: usize,
    /// Per aggregate, first deliveries out of commit order: (aggregate, before, after).
    inversions: Vec<(String, String, String)>,
    /// Events delivered more than once, and the extra deliveries.
    delivered_twice: usize,
    extra_deliveries: usize,
}

impl Report {
    fn new(table: &[Row], written: &Written, delivered: &[Delivery]) -> Report {
        let in_table: HashMap<Uuid, &Row> = table.iter().map(|r| (r.0, r)).collect();
        let mut times: HashMap<Uuid, usize> = HashMap::new();
        for d in delivered {
            *times.entry(d.id).or_default() += 1;
        }
        let rolled_back: HashSet<&Uuid> = written.rolled_back.iter().collect();
        let mut phantom: Vec<Uuid> = times
            .keys()
            .filter(|id| !in_table.contains_key(id))
            .copied()
            .collect();
        phantom.sort();
        // Per aggregate, the first delivery of each event of the table, in arrival order.
        let mut first: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
        let mut seen = HashSet::new();
        for d in delivered {
            if in_table.contains_key(&d.id) && seen.insert(d.id) {
                first
                    .entry(&d.aggregate)
                    .or_default()
                    .push(counter(&d.payload));
            }
        }
        let mut inversions = Vec::new();
        for (agg, order) in &first {
            for pair in order.windows(2) {
                if pair[1] <= pair[0] {
                    inversions.push((
                        (*agg).to_owned(),
                        format!("{}.{}", pair[0].0, pair[0].1),
                        format!("{}.{}", pair[1].0, pair[1].1),
                    ));
                }
            }
        }
        let written_after = written
            .after
            .iter()
            .filter(|id| in_table.contains_key(id))
            .count();
        Report {
            events: table.len(),
            written_after,
            acknowledged_missing: written
                .ok
                .iter()
                .filter(|id| !in_table.contains_key(id))
                .copied()
                .collect(),
            lost: table
                .iter()
                .map(|r| r.0)
                .filter(|id| !times.contains_key(id))
                .collect(),
            rolled_back_delivered: phantom.iter().filter(|id| rolled_back.contains(id)).count(),
            phantom,
            unknown: written.unknown.len(),
            unknown_committed: written
                .unknown
                .iter()
                .filter(|id| in_table.contains_key(id))
                .count(),
            inversions,
            delivered_twice: times.values().filter(|n| **n > 1).count(),
            extra_deliveries: times.values().map(|n| n.saturating_sub(1)).sum(),
        }
    }

    fn summary(&self) -> String {
        format!(
            "{} events on the promoted server; lost {}, phantom {} ({} rolled back), order inversions {}, \
             acknowledged commits missing from the promoted server {}; events of commits with an unknown outcome {} \
             ({} committed); delivered twice {} ({} extra deliveries)",
            self.events,
            self.lost.len(),
            self.phantom.len(),
            self.rolled_back_delivered,
            self.inversions.len(),
            self.acknowledged_missing.len(),
            self.unknown,
            self.unknown_committed,
            self.delivered_twice,
            self.extra_deliveries,
        )
    }

    fn verdict(&self) -> anyhow::Result<()> {
        let few = |ids: &[Uuid]| {
            ids.iter()
                .take(5)
                .map(Uuid::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        ensure!(
            self.acknowledged_missing.is_empty(),
            "{} commits that returned OK are not on the promoted server (the standby was not synchronous?), e.g. {}",
            self.acknowledged_missing.len(),
            few(&self.acknowledged_missing)
        );
        ensure!(
            self.lost.is_empty(),
            "lost {}: events on the promoted server never delivered, e.g. {}",
            self.lost.len(),
            few(&self.lost)
        );
        ensure!(
            self.phantom.is_empty(),
            "phantom {}: events delivered that the promoted server does not have, e.g. {}",
            self.phantom.len(),
            few(&self.phantom)
        );
        ensure!(
            self.inversions.is_empty(),
            "{} per-aggregate order inversions (aggregate, delivered first, delivered after), e.g. {:?}",
            self.inversions.len(),
            &self.inversions[..self.inversions.len().min(5)]
        );
        Ok(())
    }
}

/// `n.k` → (n, k).
fn counter(payload: &str) -> (u64, u64) {
    let (n, k) = payload.split_once('.').unwrap_or((payload, "0"));
    (n.parse().unwrap_or(0), k.parse().unwrap_or(0))
}

/// The measured figures.
struct Figures {
    /// From the primary's death to the address moved to the promoted standby.
    failover: Duration,
    /// From the move to the first delivery after it.
    first_delivery: Option<Duration>,
    /// From the move to the first delivery of an event written after it.
    first_new_event: Option<Duration>,
}

impl Figures {
    fn summary(&self, report: &Report) -> String {
        let ms = |d: Option<Duration>| {
            d.map_or_else(|| "never".to_owned(), |d| format!("{} ms", d.as_millis()))
        };
        format!(
            "figures: primary killed -> standby promoted and address moved {} ms; \
             address moved -> first delivery {}; -> first event written after the move delivered {}; \
             delivered twice {} of {} events",
            self.failover.as_millis(),
            ms(self.first_delivery),
            ms(self.first_new_event),
            report.delivered_twice,
            report.events,
        )
    }
}
