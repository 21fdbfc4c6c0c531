//! `outbox demo`, run as a user would: the built binary, its exit code, its summary, and the
//! JSON lines it wrote.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use outbox_sinks::stdout::JsonLine;

const BIN: &str = env!("CARGO_BIN_EXE_outbox");

fn demo(args: &[&str], dir: &Path) -> Output {
    Command::new(BIN)
        .arg("demo")
        .args(args)
        .current_dir(dir)
        .env_remove("OUTBOX_CONFIG")
        .env_remove("OUTBOX_DATABASE_URL")
        .env("OUTBOX_LOG", "warn")
        .output()
        .expect("run the outbox binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The order numbers in the file, and how many lines it has.
fn published_orders(file: &Path) -> (BTreeSet<u64>, BTreeSet<String>, usize) {
    let content = std::fs::read_to_string(file).expect("read the events file");
    let (mut numbers, mut ids, mut lines) = (BTreeSet::new(), BTreeSet::new(), 0);
    for line in content.lines() {
        lines += 1;
        let line = JsonLine::parse(line).expect("a valid JSON line");
        assert_eq!(line.event_type, "order.placed");
        assert_eq!(line.headers.get("id"), Some(&line.id.to_string()));
        let payload: serde_json::Value =
            serde_json::from_slice(&line.payload_bytes().expect("payload")).expect("json");
        assert_eq!(
            payload["order_id"].as_str(),
            Some(line.aggregate_id.as_str())
        );
        numbers.insert(payload["order_no"].as_u64().expect("order_no"));
        ids.insert(line.id.to_string());
    }
    (numbers, ids, lines)
}

#[test]
fn demo_publishes_exactly_the_committed_orders_and_says_so() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("events.jsonl");
    let output = demo(
        &[
            "--orders",
            "300",
            "--out",
            out.to_str().expect("utf-8 path"),
            "--json",
        ],
        dir.path(),
    );
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(
        output.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );

    let summary: serde_json::Value = serde_json::from_str(&stdout).expect("JSON summary on stdout");
    assert_eq!(summary["orders_committed"], 270, "{summary}");
    assert_eq!(summary["orders_rolled_back"], 30, "{summary}");
    assert_eq!(summary["events_published"], 270, "{summary}");
    assert_eq!(summary["missing"], 0, "{summary}");
    assert_eq!(summary["phantoms"], 0, "{summary}");
    assert_eq!(summary["dead_lettered"], 0, "{summary}");
    assert_eq!(summary["invariant_holds"], true, "{summary}");
    assert!(
        summary["latency_p99_ms"].as_f64().expect("p99")
            >= summary["latency_p50_ms"].as_f64().expect("p50")
    );

    // The file holds every committed order's event and no rolled-back one (every 10th).
    let (numbers, ids, lines) = published_orders(&out);
    let expected: BTreeSet<u64> = (1..=300).filter(|n| n % 10 != 0).collect();
    assert_eq!(numbers, expected);
    assert_eq!(ids.len(), 270);
    let duplicates = summary["duplicates"].as_u64().expect("duplicates");
    assert_eq!(lines as u64, 270 + duplicates);

    // The temporary database is gone.
    let database = summary["database"].as_str().expect("database path");
    assert_eq!(summary["database_kept"], false);
    assert!(!Path::new(database).exists(), "{database} left behind");
}

#[test]
fn demo_on_a_named_database_keeps_it_and_prints_a_readable_summary() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("events.jsonl");
    let db = dir.path().join("demo.db");
    let output = demo(
        &[
            "--orders",
            "50",
            "--rollback-every",
            "0",
            "--out",
            out.to_str().expect("utf-8 path"),
            "--database",
            db.to_str().expect("utf-8 path"),
        ],
        dir.path(),
    );
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("orders committed        50"), "{stdout}");
    assert!(stdout.contains("orders rolled back      0"), "{stdout}");
    assert!(stdout.contains("invariant               OK"), "{stdout}");
    assert!(db.exists(), "a database the user named is kept");
    assert_eq!(published_orders(&out).0, (1..=50).collect());
}
