//! No secret is ever printed. Every place a user puts a password, token or secret header goes
//! into one config (the database URL in each of its forms: a password with raw `@` and `:`, a
//! percent-encoded one, `?password=`, `?sslpassword=`; the webhook's URL password, HMAC secret
//! and header values; the NATS, RabbitMQ and Redis URL passwords and the NATS token; a
//! librdkafka SASL password), each a distinct marker. Every command runs against it — with
//! the database up, and with the database and the brokers down so the errors speak — and the
//! relay runs with a debug log; no marker may appear in any stdout, stderr or log.

#![cfg(all(
    feature = "http",
    feature = "nats",
    feature = "rabbitmq",
    feature = "redis",
    feature = "kafka"
))]

mod support;

use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::{HttpReceiver, Postgres};
use support::{Output, Workdir, terminate};

/// The database passwords, one per URL form.
const PG_RAW: &str = "pgPwRaw7";
const PG_ENCODED: &str = "pgPwEnc8";
const PG_QUERY: &str = "pgQPass9";
const PG_SSL: &str = "sslKeyPw10";
/// Sink secrets.
const HOOK_PASSWORD: &str = "hookUserPw11";
const HOOK_HMAC: &str = "hmacSec12";
const HOOK_BEARER: &str = "bearerTok13";
const HOOK_API_KEY: &str = "apiKey14";
const NATS_PASSWORD: &str = "natsPw15";
const NATS_TOKEN: &str = "natsTok16";
const AMQP_PASSWORD: &str = "amqpPw17";
const REDIS_PASSWORD: &str = "redisPw18";
const SASL_PASSWORD: &str = "saslPw19";
/// Read from files (`url_file`, `token_file`).
const PG_FILE: &str = "pgFilePw20";
const NATS_TOKEN_FILE: &str = "natsFileTok21";
/// A token in a webhook URL's query, the endpoint down.
const HOOK_QUERY_TOKEN: &str = "hookQueryTok22";

const ALL: &[&str] = &[
    PG_RAW,
    PG_ENCODED,
    PG_QUERY,
    PG_SSL,
    HOOK_PASSWORD,
    HOOK_HMAC,
    HOOK_BEARER,
    HOOK_API_KEY,
    NATS_PASSWORD,
    NATS_TOKEN,
    AMQP_PASSWORD,
    REDIS_PASSWORD,
    SASL_PASSWORD,
    PG_FILE,
    NATS_TOKEN_FILE,
    HOOK_QUERY_TOKEN,
];

/// `url` (`scheme://user@host...` or `scheme://user:pw@host...`) with `password` as the
/// userinfo's password. A password already there is kept as a marker too (`extra`).
fn with_password(url: &str, password: &str, extra: &mut Vec<String>) -> anyhow::Result<String> {
    let start = url.find("://").context("no scheme")? + 3;
    let at = start
        + url[start..]
            .find('@')
            .context("no user in the test database URL")?;
    let user = match url[start..at].split_once(':') {
        Some((user, existing)) => {
            extra.push(existing.to_owned());
            user
        }
        None => &url[start..at],
    };
    Ok(format!(
        "{}{user}:{password}@{}",
        &url[..start],
        &url[at + 1..]
    ))
}

fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// A port nothing listens on.
fn closed_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

fn ensure_clean(what: &str, text: &str, markers: &[String]) -> anyhow::Result<()> {
    for m in markers {
        ensure!(
            !text.contains(m.as_str()),
            "{what} printed the secret `{m}`:\n{text}"
        );
    }
    Ok(())
}

fn both(out: &Output) -> String {
    format!("{}\n{}", out.stdout, out.stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_command_prints_a_secret_whatever_the_url_form_and_whether_servers_are_up()
-> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let hooks = HttpReceiver::start().await?;
    let work = Workdir::new()?;
    let mut markers: Vec<String> = ALL.iter().map(|m| (*m).to_owned()).collect();
    // The test server trusts local connections, so any password in the URL still connects.
    let database_urls = [
        // A raw `@` and `:` in the password: the userinfo ends at the last `@`.
        with_password(&url, &format!("a:b@{PG_RAW}"), &mut markers)?,
        with_password(&url, &format!("x%40{PG_ENCODED}%3A"), &mut markers)?,
        with_param(&url, &format!("password={PG_QUERY}")),
        with_param(&url, &format!("sslpassword={PG_SSL}&sslmode=disable")),
    ];
    let hook_url = hooks
        .url_for("/in/{aggregate_id}")
        .replace("http://", &format!("http://relay:{HOOK_PASSWORD}@"));
    let http_sink = format!(
        "[sink]\nkind = \"http\"\nurl = \"{hook_url}\"\nsecret = \"{HOOK_HMAC}\"\nheaders = {{ Authorization = \"Bearer {HOOK_BEARER}\", x-api-key = \"{HOOK_API_KEY}\" }}\n"
    );
    let down = closed_port()?;
    let down_sinks = [
        // First, so a relay with its database up reaches it (`sink-down-0`).
        format!(
            "[sink]\nkind = \"http\"\nurl = \"http://127.0.0.1:{down}/in?token={HOOK_QUERY_TOKEN}\"\ntimeout = \"1s\"\n"
        ),
        format!(
            "[sink]\nkind = \"nats\"\nurl = \"nats://relay:{NATS_PASSWORD}@127.0.0.1:{down}\"\nconnect_timeout = \"1s\"\n"
        ),
        format!(
            "[sink]\nkind = \"nats\"\nurl = \"nats://127.0.0.1:{down}\"\ntoken = \"{NATS_TOKEN}\"\nconnect_timeout = \"1s\"\n"
        ),
        format!(
            "[sink]\nkind = \"rabbitmq\"\nurl = \"amqp://relay:{AMQP_PASSWORD}@127.0.0.1:{down}/%2f\"\nconnect_timeout = \"1s\"\n"
        ),
        format!(
            "[sink]\nkind = \"redis\"\nurl = \"redis://relay:{REDIS_PASSWORD}@127.0.0.1:{down}\"\nconnect_timeout = \"1s\"\n"
        ),
        format!(
            "[sink]\nkind = \"kafka\"\nbrokers = \"127.0.0.1:{down}\"\nmetadata_timeout = \"1s\"\nsettings = {{ \"security.protocol\" = \"sasl_plaintext\", \"sasl.mechanisms\" = \"PLAIN\", \"sasl.username\" = \"relay\", \"sasl.password\" = \"{SASL_PASSWORD}\" }}\n"
        ),
    ];
    let commands: &[&[&str]] = &[
        &["check-config"],
        &["migrate"],
        &["status"],
        &["status", "--json"],
        &["doctor", "--sink-timeout", "3s"],
        &["doctor", "--json", "--sink-timeout", "3s"],
        &["dead", "list"],
        &["why", "0190f3c1-0000-7000-8000-000000000000"],
    ];
    let pool = sqlx::PgPool::connect(&url).await?;
    let mut configs = Vec::new();
    for (i, database_url) in database_urls.iter().enumerate() {
        let source = format!(
            "[source]\nkind = \"postgres\"\nurl = \"{database_url}\"\nconnect_timeout = \"2s\"\n"
        );
        configs.push((format!("up-{i}"), format!("{source}{http_sink}"), true));
        let sink = &down_sinks[i % down_sinks.len()];
        configs.push((format!("sink-down-{i}"), format!("{source}{sink}"), true));
        let database_down = database_url.replace(
            &format!(":{}/", pg_port(&url)?),
            &format!(":{}/", closed_port()?),
        );
        configs.push((
            format!("db-down-{i}"),
            format!(
                "[source]\nkind = \"postgres\"\nurl = \"{database_down}\"\nconnect_timeout = \"1s\"\n{}",
                down_sinks[(i + 1) % down_sinks.len()]
            ),
            false,
        ));
    }
    // Secrets read from files.
    let url_file = work.path().join("database.url");
    std::fs::write(
        &url_file,
        format!("{}\n", with_password(&url, PG_FILE, &mut markers)?),
    )?;
    let token_file = work.path().join("nats.token");
    std::fs::write(&token_file, format!("{NATS_TOKEN_FILE}\n"))?;
    configs.push((
        "files".to_owned(),
        format!(
            "[source]\nkind = \"postgres\"\nurl_file = \"{}\"\n[sink]\nkind = \"nats\"\nurl = \"nats://127.0.0.1:{down}\"\ntoken_file = \"{}\"\nconnect_timeout = \"1s\"\n",
            url_file.display(),
            token_file.display()
        ),
        true,
    ));
    // The fifth broker too.
    configs.push((
        "kafka-down".to_owned(),
        format!(
            "[source]\nkind = \"postgres\"\nurl = \"{}\"\n{}",
            database_urls[0], down_sinks[4]
        ),
        true,
    ));

    let mut runs = 0;
    for (name, toml, database_up) in &configs {
        let path = work.write_config(&format!("{name}.toml"), toml)?;
        let cfg = path.to_str().context("utf-8 path")?;
        for command in commands {
            let mut args = command.to_vec();
            args.extend(["--config", cfg]);
            let out = work.run(&args).await?;
            ensure_clean(
                &format!("`outbox {}` ({name})", args.join(" ")),
                &both(&out),
                &markers,
            )?;
            ensure!(
                !out.stderr.contains("panicked"),
                "`outbox {}` panicked: {out:?}",
                args.join(" ")
            );
            runs += 1;
        }
        // The relay, with a debug log: it publishes one event when everything is up, and
        // reports what is down otherwise.
        let log = format!("relay-{name}.log");
        let before = hooks.received().len();
        if *database_up {
            sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Order', 'o1', 'order.placed', 'x')")
                .execute(&pool)
                .await?;
        }
        let mut relay = work
            .command(&["relay", "--config", cfg])
            .env("OUTBOX_LOG", "debug")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(work.path().join(&log))?)
            .spawn()?;
        let published = name.starts_with("up-");
        outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
            let text = work.read_log(&log);
            if published {
                hooks.received().len() > before
            } else {
                // Tried and reported the outage (or gave up with an error).
                text.contains(" WARN ") || text.contains("ERROR") || text.contains("error:")
            }
        })
        .await
        .with_context(|| {
            format!(
                "relay ({name}) never got that far:\n{}",
                work.read_log(&log)
            )
        })?;
        // (A relay that gave up has exited already.)
        let _ = terminate(&mut relay, Duration::from_secs(30)).await;
        ensure_clean(
            &format!("the relay's debug log ({name})"),
            &work.read_log(&log),
            &markers,
        )?;
        runs += 1;
    }
    // What the webhook received carries the secrets where they belong (the receiver is the
    // one party meant to see them): proof that the markers were really in use.
    let got = hooks.received();
    let request = got
        .iter()
        .find(|r| r.method == "POST")
        .context("no webhook request")?;
    ensure!(
        request.header("authorization") == Some(&format!("Bearer {HOOK_BEARER}")[..]),
        "{request:?}"
    );
    tracing::info!(runs, configs = configs.len(), "no secret printed");
    Ok(())
}

fn pg_port(url: &str) -> anyhow::Result<String> {
    let start = url.rfind('@').context("no host")? + 1;
    let rest = &url[start..];
    let host_port = &rest[..rest.find('/').unwrap_or(rest.len())];
    Ok(host_port
        .rsplit_once(':')
        .map_or("5432", |(_, p)| p)
        .to_owned())
}

/// The MySQL source's URL, in both forms (raw `@` and `:` in the password; percent-encoded),
/// with the server up (a real user with that password) and down: no command and no relay
/// debug log prints the password.
#[tokio::test]
async fn no_command_prints_a_mysql_password() -> anyhow::Result<()> {
    const MY_PASSWORD: &str = "myPwRaw22";
    let server = outbox_testkit::services::MariaDb::shared().await?;
    let admin_url = server.fresh_database().await?;
    let (base, database) = admin_url.rsplit_once('/').context("database in url")?;
    let admin = sqlx::MySqlPool::connect(&admin_url).await?;
    let user = format!("sec_{}", &database[database.len() - 8..]);
    let password = format!("a:b@{MY_PASSWORD}");
    // The user name is built here from hex digits and the password is this test's constant
    // (CREATE USER takes no placeholders).
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'"
    )))
    .execute(&admin)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "GRANT ALL ON {database}.* TO '{user}'@'%'"
    )))
    .execute(&admin)
    .await?;
    // Binlog CDC reads the binlog as this user too.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{user}'@'%'"
    )))
    .execute(&admin)
    .await?;
    // An administrator creates the table and its trigger (with binary logging on, creating a
    // trigger needs SUPER); the user's own `migrate` then finds nothing to do.
    outbox_mysql::migrate(&admin, &outbox_core::Identifier::new("outbox")?).await?;
    let host = base.trim_start_matches("mysql://root@");
    let urls = [
        format!("mysql://{user}:{password}@{host}/{database}"),
        format!("mysql://{user}:a%3Ab%40{MY_PASSWORD}@{host}/{database}"),
    ];
    let markers = vec![MY_PASSWORD.to_owned()];
    let work = Workdir::new()?;
    let commands: &[&[&str]] = &[
        &["check-config"],
        &["migrate"],
        &["status"],
        &["status", "--json"],
        &["doctor", "--sink-timeout", "3s"],
        &["dead", "list"],
        &["why", "0190f3c1-0000-7000-8000-000000000000"],
    ];
    for (i, url) in urls.iter().enumerate() {
        let down = url.replace(host, &format!("127.0.0.1:{}", closed_port()?));
        for (name, url, up, mode) in [
            (format!("up-{i}"), url, true, "poll"),
            (format!("down-{i}"), &down, false, "poll"),
            (format!("cdc-up-{i}"), url, true, "cdc"),
            (format!("cdc-down-{i}"), &down, false, "cdc"),
        ] {
            let path = work.write_config(
                &format!("{name}.toml"),
                &format!(
                    "[source]\nkind = \"mysql\"\nurl = \"{url}\"\nmode = \"{mode}\"\nconnect_timeout = \"2s\"\n[sink]\nkind = \"file\"\npath = \"{name}.jsonl\"\n"
                ),
            )?;
            let cfg = path.to_str().context("utf-8 path")?;
            for command in commands {
                let mut args = command.to_vec();
                args.extend(["--config", cfg]);
                let out = work.run(&args).await?;
                ensure_clean(
                    &format!("`outbox {}`", args.join(" ")),
                    &both(&out),
                    &markers,
                )?;
                if up && command[0] != "why" {
                    ensure!(
                        out.code == Some(0),
                        "`outbox {}` failed: {out:?}",
                        args.join(" ")
                    );
                }
            }
            let log = format!("relay-{name}.log");
            let mut relay = work
                .command(&["relay", "--config", cfg])
                .env("OUTBOX_LOG", "debug")
                .stdout(std::process::Stdio::null())
                .stderr(std::fs::File::create(work.path().join(&log))?)
                .spawn()?;
            outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
                let text = work.read_log(&log);
                if up {
                    text.contains("starting relay") && text.contains("claim")
                        || text.contains("retention run finished")
                        || text.contains("streaming the outbox from the binlog")
                } else {
                    text.contains("error:") || text.contains("ERROR") || text.contains(" WARN ")
                }
            })
            .await
            .with_context(|| format!("relay ({name}):\n{}", work.read_log(&log)))?;
            let _ = terminate(&mut relay, Duration::from_secs(30)).await;
            ensure_clean(
                &format!("the relay's debug log ({name})"),
                &work.read_log(&log),
                &markers,
            )?;
        }
    }
    Ok(())
}

/// The AWS sinks: the secret key and session token in the environment (the standard chain).
/// With the endpoint down, no command and no relay debug log (with the SDK's request tracing
/// on) prints them. A password in `endpoint_url` is refused with a clear error that does not
/// print it either.
#[cfg(all(feature = "sqs", feature = "sns", feature = "kinesis"))]
#[tokio::test]
async fn no_command_prints_aws_credentials_or_an_endpoint_password() -> anyhow::Result<()> {
    const AWS_SECRET: &str = "awsSecretKey23";
    const AWS_TOKEN: &str = "awsSessionTok24";
    const ENDPOINT_PASSWORD: &str = "endpointPw25";
    let markers: Vec<String> = [AWS_SECRET, AWS_TOKEN, ENDPOINT_PASSWORD]
        .map(str::to_owned)
        .to_vec();
    let url = Postgres::shared().await?.fresh_database().await?;
    let work = Workdir::new()?;
    let down = closed_port()?;
    let endpoint = format!("http://127.0.0.1:{down}");
    let sinks = [
        format!("kind = \"sqs\"\nqueue_url = \"http://127.0.0.1:{down}/123456789012/orders.fifo\""),
        "kind = \"sns\"\ntopic_arn = \"arn:aws:sns:us-east-1:123456789012:orders\"".to_owned(),
        "kind = \"kinesis\"\nstream = \"orders\"".to_owned(),
    ];
    let with_aws_env = |mut cmd: tokio::process::Command| {
        cmd.env("AWS_ACCESS_KEY_ID", "AKIAOUTBOXTEST")
            .env("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
            .env("AWS_SESSION_TOKEN", AWS_TOKEN)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true");
        cmd
    };
    for (i, sink) in sinks.iter().enumerate() {
        let toml = format!(
            "[source]\nkind = \"postgres\"\nurl = \"{url}\"\n[sink]\n{sink}\nendpoint_url = \"{endpoint}\"\nconnect_timeout = \"1s\"\ntimeout = \"2s\"\n"
        );
        let path = work.write_config(&format!("aws-{i}.toml"), &toml)?;
        let cfg = path.to_str().context("utf-8 path")?;
        for command in [
            &["check-config"][..],
            &["migrate"],
            &["status"],
            &["doctor", "--sink-timeout", "3s"],
            &["doctor", "--json", "--sink-timeout", "3s"],
        ] {
            let mut args = command.to_vec();
            args.extend(["--config", cfg]);
            let out = support::output(with_aws_env(work.command(&args))).await?;
            ensure_clean(
                &format!("`outbox {}` ({sink})", args.join(" ")),
                &both(&out),
                &markers,
            )?;
        }
        // An endpoint with a password is refused, and the refusal masks it.
        let with_password = toml.replace(
            &format!("endpoint_url = \"{endpoint}\""),
            &format!("endpoint_url = \"http://relay:{ENDPOINT_PASSWORD}@127.0.0.1:{down}\""),
        );
        let bad = work.write_config(&format!("aws-{i}-password.toml"), &with_password)?;
        let out = support::output(with_aws_env(work.command(&[
            "check-config",
            "--config",
            bad.to_str().context("utf-8 path")?,
        ])))
        .await?;
        out.assert_clear_error("sink.endpoint_url")?;
        ensure_clean(
            "check-config of an endpoint with a password",
            &both(&out),
            &markers,
        )?;

        sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Order', 'o1', 'order.placed', 'x')")
            .execute(&sqlx::PgPool::connect(&url).await?)
            .await?;
        let log = format!("relay-aws-{i}.log");
        let mut relay = with_aws_env(work.command(&["relay", "--config", cfg]))
            .env(
                "OUTBOX_LOG",
                "debug,aws_smithy_runtime=trace,aws_sigv4=trace",
            )
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(work.path().join(&log))?)
            .spawn()?;
        outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
            let text = work.read_log(&log);
            text.contains(" WARN ") || text.contains("ERROR")
        })
        .await
        .with_context(|| {
            format!(
                "the relay never reported the outage:\n{}",
                work.read_log(&log)
            )
        })?;
        let _ = terminate(&mut relay, Duration::from_secs(30)).await;
        ensure_clean(
            &format!("the relay's debug log ({sink})"),
            &work.read_log(&log),
            &markers,
        )?;
    }
    Ok(())
}
