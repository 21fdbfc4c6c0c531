use super::*;

#[derive(Debug, Clone, PartialEq)]
struct Item(u64, u64);

impl Spillable for Item {
    fn memory_size(&self) -> usize {
        16
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_u64(out, self.0);
        put_u64(out, self.1);
    }
    fn decode(input: &mut &[u8]) -> io::Result<Self> {
        Ok(Item(take_u64(input)?, take_u64(input)?))
    }
}

fn settings(after_events: usize, after_bytes: u64) -> Arc<SpillSettings> {
    Arc::new(SpillSettings {
        after_events,
        after_bytes,
        dir: None,
    })
}

fn read_all<T: Spillable>(mut s: SpilledTxn<T>, batch: usize) -> Vec<T> {
    let mut all = Vec::new();
    while s.remaining() > 0 {
        let b = s.next_batch(batch).expect("read back");
        assert!(!b.is_empty() && b.len() <= batch);
        all.extend(b);
    }
    assert!(s.next_batch(batch).expect("end").is_empty());
    all
}

#[test]
fn a_small_transaction_stays_in_memory() {
    let mut b = TxnBuffer::new(settings(10, 1 << 20), None);
    for i in 0..9 {
        b.push(Item(i, 0)).expect("push");
    }
    assert_eq!(b.len(), 9);
    let Buffered::Memory(items) = b.take().expect("take") else {
        panic!("spilled below the threshold");
    };
    assert_eq!(items.len(), 9);
    assert!(b.is_empty(), "empty again for the next transaction");
}

#[test]
fn past_the_event_threshold_the_events_come_back_from_disk_in_push_order() {
    let mut b = TxnBuffer::new(settings(100, 1 << 30), None);
    for i in 0..1_050 {
        b.push(Item(i, i * 7)).expect("push");
    }
    assert_eq!(b.len(), 1_050);
    let Buffered::Spilled(s) = b.take().expect("take") else {
        panic!("not spilled");
    };
    assert_eq!(s.len(), 1_050);
    let expected: Vec<Item> = (0..1_050).map(|i| Item(i, i * 7)).collect();
    assert_eq!(read_all(s, 33), expected);
    // The buffer is reusable: the next transaction starts in memory.
    b.push(Item(1, 1)).expect("push");
    assert!(matches!(b.take().expect("take"), Buffered::Memory(v) if v.len() == 1));
}

#[test]
fn the_byte_threshold_spills_too() {
    let mut b = TxnBuffer::new(settings(1_000_000, 160), None);
    for i in 0..25 {
        b.push(Item(i, 0)).expect("push");
    }
    let Buffered::Spilled(s) = b.take().expect("take") else {
        panic!("not spilled");
    };
    assert_eq!(s.cursors.len(), 1, "read sequentially");
    assert_eq!(read_all(s, 1_000).len(), 25);
}

#[test]
fn with_an_order_the_runs_merge_into_exactly_a_stable_sort() {
    fn by_key(a: &Item, b: &Item) -> cmp::Ordering {
        a.0.cmp(&b.0)
    }
    // Keys repeat across runs; the second field is the arrival index, so stability shows.
    let input: Vec<Item> = (0..5_000u64).map(|i| Item((i * 7919) % 37, i)).collect();
    let mut b = TxnBuffer::new(settings(128, 1 << 30), Some(by_key as Order<Item>));
    for item in input.clone() {
        b.push(item).expect("push");
    }
    let Buffered::Spilled(s) = b.take().expect("take") else {
        panic!("not spilled");
    };
    assert!(s.cursors.len() > 30, "one cursor per run");
    let mut expected = input;
    expected.sort_by(by_key);
    assert_eq!(read_all(s, 100), expected);
}

#[test]
fn events_round_trip_through_the_file_exactly() {
    let event = Event {
        id: Uuid::now_v7(),
        position: Position(0),
        aggregate_type: "Order".into(),
        aggregate_id: "o_1".into(),
        event_type: "order.placed".into(),
        payload: Bytes::from_static(b"{\"a\":1}\n\x00\xff"),
        headers: vec![
            ("tenant".into(), "acme".into()),
            ("k".into(), String::new()),
        ],
        created_at: OffsetDateTime::from_unix_timestamp_nanos(1_790_000_000_123_456_000)
            .expect("time"),
        attempts: 3,
    };
    let mut out = Vec::new();
    (event.clone(), Item(5, 6)).encode(&mut out);
    let mut input = &out[..];
    let back = <(Event, Item)>::decode(&mut input).expect("decode");
    assert_eq!(back, (event, Item(5, 6)));
    assert!(input.is_empty());
    let mut short = &out[..out.len() - 3];
    assert!(<(Event, Item)>::decode(&mut short).is_err());
}

#[test]
fn settings_name_the_key_they_refuse() {
    let bad = |s: SpillSettings| s.validate().expect_err("refused");
    assert!(
        bad(SpillSettings {
            after_events: 0,
            ..SpillSettings::default()
        })
        .starts_with("source.spill_after_events:")
    );
    assert!(
        bad(SpillSettings {
            after_bytes: 0,
            ..SpillSettings::default()
        })
        .starts_with("source.spill_after_bytes:")
    );
    assert!(
        bad(SpillSettings {
            dir: Some("/nonexistent/outbox-spill".into()),
            ..SpillSettings::default()
        })
        .starts_with("source.spill_dir:")
    );
    assert!(SpillSettings::default().validate().is_ok());
}
