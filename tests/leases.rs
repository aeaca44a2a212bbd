//! A lease lives only until the daemon has mapped the leased blocks into the sequence: a
//! generation that runs longer than the lease timeout, on a cached prefix, leaves no expired
//! lease behind (before, a request held its lease for its whole life).

use mlxcel_tests::{http, serve as stack};

use std::time::{Duration, Instant};

use serde_json::json;
use stack::{Served, wait_until};

#[test]
fn a_generation_longer_than_the_lease_timeout_expires_no_lease() {
    let served = Served::start(&[("MLXCEL_CACHE_LEASE_TIMEOUT", "1s")]);
    let system = "You are a patient assistant who answers in plain words. ".repeat(12);
    let body = |max_tokens: u32| {
        json!({"messages": [{"role": "system", "content": system},
                            {"role": "user", "content": "Tell a long story about a lighthouse."}],
               "max_tokens": max_tokens, "temperature": 0})
    };
    let (s, r) =
        http::request(served.port, "POST", "/v1/chat/completions", Some(&body(2))).unwrap();
    assert_eq!(s, 200, "{r}");
    let start = Instant::now();
    let (s, r) =
        http::request(served.port, "POST", "/v1/chat/completions", Some(&body(96))).unwrap();
    let took = start.elapsed();
    assert_eq!(s, 200, "{r}");
    assert!(
        r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0),
        "the prefix was leased from the cache: {r}"
    );
    let generated = r["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    assert!(
        took > Duration::from_secs(1) && generated > 1,
        "the generation ({generated} tokens in {took:?}) must outlast the 1 s lease timeout"
    );
    wait_until(Duration::from_secs(30), "no active lease", || {
        served.cache_stats()["active_leases"] == 0
    });
    assert_eq!(
        served.cache_stats()["expired_leases"],
        0,
        "{}",
        served.cache_stats()
    );
}
