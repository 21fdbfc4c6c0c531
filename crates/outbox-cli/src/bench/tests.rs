use super::events::event;
use super::*;

#[test]
fn payloads_are_json_of_the_requested_size() {
    let e = event(1234, 1000, 200);
    assert_eq!(e.aggregate_id, "o_234");
    assert_eq!(e.payload.len(), 200);
    let v: serde_json::Value = serde_json::from_slice(&e.payload).unwrap();
    assert_eq!(v["n"], 1234);
    // Smaller than the fixed part: no padding, still valid JSON.
    let small = event(1, 10, 5);
    assert!(serde_json::from_slice::<serde_json::Value>(&small.payload).is_ok());
}

#[test]
fn bad_rates_and_durations_are_refused_with_the_reason() {
    assert!(parse_rate("0").unwrap_err().contains("greater than 0"));
    assert!(parse_rate("-5").is_err());
    assert!(parse_rate("fast").unwrap_err().contains("`fast`"));
    assert_eq!(parse_rate("1000").unwrap(), 1000.0);
    assert!(
        parse_positive_duration("0s")
            .unwrap_err()
            .contains("greater than 0")
    );
    assert!(parse_positive_duration("soon").is_err());
    assert_eq!(
        parse_positive_duration("2m").unwrap(),
        Duration::from_secs(120)
    );
}
