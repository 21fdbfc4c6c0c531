use super::*;

#[test]
fn percentiles_use_the_nearest_rank() {
    let v: Vec<f64> = (1..=100).map(f64::from).collect();
    assert_eq!(percentile(&v, 50.0), 50.0);
    assert_eq!(percentile(&v, 99.0), 99.0);
    assert_eq!(percentile(&[3.0], 99.0), 3.0);
    assert_eq!(percentile(&[], 50.0), 0.0);
}

#[test]
fn the_check_counts_missing_phantom_and_duplicate_events() {
    let started = Instant::now();
    let (a, b, c) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    let orders = vec![
        Order {
            event_id: a,
            committed_at: Some(started),
        },
        Order {
            event_id: b,
            committed_at: Some(started),
        },
        Order {
            event_id: c,
            committed_at: None,
        },
    ];
    let seen_as = |order: &str, count| Seen {
        aggregate_id: format!("o_run1_{order}"),
        first_at: started + Duration::from_millis(4),
        count,
    };
    let mut seen = HashMap::new();
    seen.insert(a, seen_as("000001", 2));
    seen.insert(c, seen_as("000003", 1));
    // Another run's event in the same output is not this run's business.
    seen.insert(
        Uuid::now_v7(),
        Seen {
            aggregate_id: "o_run0_000001".into(),
            first_at: started,
            count: 1,
        },
    );
    let args = DemoArgs {
        orders: 3,
        rollback_every: 3,
        out: None,
        database: None,
        keep: false,
        json: true,
        all: false,
    };
    let s = check(&orders, &seen, "run1", 0, &args, Path::new("x.db"), started);
    assert_eq!((s.orders_committed, s.orders_rolled_back), (2, 1));
    assert_eq!((s.missing, s.phantoms), (1, 1));
    assert_eq!((s.events_published, s.deliveries, s.duplicates), (2, 3, 1));
    assert!(!s.invariant_holds);
    assert_eq!(s.latency_p50_ms, 4.0);
}

#[test]
fn every_kth_order_is_rolled_back() {
    let args = DemoArgs {
        orders: 300,
        rollback_every: 10,
        out: None,
        database: None,
        keep: false,
        json: false,
        all: false,
    };
    assert_eq!(rolled_back_count(&args), 30);
    let never = DemoArgs {
        rollback_every: 0,
        ..args
    };
    assert_eq!(rolled_back_count(&never), 0);
}
