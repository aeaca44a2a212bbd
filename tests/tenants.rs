//! Against the real stack: one tenant's prompts cannot be confirmed by another. Two API keys of
//! different tenants sending the same prompt: the second saw `cached_tokens: 64` before, now 0;
//! two keys of one tenant still share; a request's own `cache_salt` separates too. Listing and
//! evicting entries needs the admin key. Entry ids are hashes keyed with the installation's
//! secret (a 0600 file the manager created), not computable from the prompt alone.

use mlxcel_tests::{http, serve as stack};

use std::os::unix::fs::PermissionsExt;

use mlxcel_ipc::block_hash::block_hashes;
use mlxcel_ipc::{HashKey, HashSeed};
use serde_json::{Value, json};
use stack::Served;

const BLOCK_TOKENS: usize = 32;

/// A 100-token prompt (three full blocks), as token ids so the test can hash it.
fn prompt() -> Vec<u32> {
    (0..100).map(|i| 1000 + i * 7).collect()
}

/// `POST /v1/completions` as `key`; (status, body).
fn complete(port: u16, key: &str, extra: Value) -> (u16, Value) {
    let mut body = json!({"prompt": prompt(), "max_tokens": 1, "temperature": 0});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let auth = format!("Bearer {key}");
    http::request_with(
        port,
        "POST",
        "/v1/completions",
        Some(&body),
        &[("Authorization", &auth)],
    )
    .unwrap()
}

fn cached(r: &Value) -> u64 {
    r["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {r}"))
}

fn as_key(port: u16, method: &str, path: &str, key: Option<&str>) -> (u16, Value) {
    let auth = key.map(|k| format!("Bearer {k}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    let body = (method == "POST").then(|| json!({"all": true}));
    http::request_with(port, method, path, body.as_ref(), &headers).unwrap()
}

#[test]
fn tenants_never_see_each_others_prefixes_and_only_the_admin_lists_them() {
    let keys_dir = tempfile::tempdir().unwrap();
    let keys = keys_dir.path().join("keys");
    std::fs::write(
        &keys,
        "alpha-key alpha\nalpha-laptop alpha\nbeta-key beta\n",
    )
    .unwrap();
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o600)).unwrap();
    let state = keys_dir.path().join("state");
    let served = Served::start(&[
        ("MLXCEL_API_KEYS_FILE", keys.to_str().unwrap()),
        ("MLXCEL_ADMIN_KEY", "root-key"),
        ("XDG_STATE_HOME", state.to_str().unwrap()),
    ]);
    let port = served.port;

    let (s, first) = complete(port, "alpha-key", json!({}));
    assert_eq!(s, 200, "{first}");
    assert_eq!(cached(&first), 0);
    // The donation is queued before the first answer ends, so the next request finds it.
    let (_, beta) = complete(port, "beta-key", json!({}));
    assert_eq!(
        cached(&beta),
        0,
        "another tenant must not hit alpha's blocks"
    );
    let (_, laptop) = complete(port, "alpha-laptop", json!({}));
    assert!(cached(&laptop) >= 64, "one tenant's keys share: {laptop}");
    let (_, salted) = complete(port, "alpha-key", json!({"cache_salt": "session-2"}));
    assert_eq!(cached(&salted), 0, "a cache_salt separates too");
    let (s, bad) = complete(port, "alpha-key", json!({"cache_salt": ""}));
    assert_eq!(
        (s, bad["error"]["param"].as_str()),
        (400, Some("cache_salt"))
    );
    assert_eq!(complete(port, "nobody", json!({})).0, 401);

    // Admin routes: the admin key only.
    for key in [Some("alpha-key"), Some("beta-key")] {
        let (s, body) = as_key(port, "GET", "/v1/cache/entries", key);
        assert_eq!(
            (s, body["error"]["code"].as_str()),
            (403, Some("admin_required"))
        );
        assert_eq!(as_key(port, "POST", "/v1/cache/evict", key).0, 403);
    }
    assert_eq!(as_key(port, "GET", "/v1/cache/entries", None).0, 401);
    assert_eq!(
        as_key(port, "GET", "/v1/cache/stats", Some("beta-key")).0,
        200
    );
    let (s, entries) = as_key(port, "GET", "/v1/cache/entries", Some("root-key"));
    assert_eq!(s, 200, "{entries}");

    // Entry ids come from hashes keyed with the manager's secret file.
    let key_file = state.join("mlxcel/hash-key");
    let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", key_file.display());
    let hex = std::fs::read_to_string(&key_file).unwrap();
    let bytes: Vec<u8> = (0..32)
        .map(|i| u8::from_str_radix(&hex.trim()[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let secret = HashKey(bytes.try_into().unwrap());
    let model = first["model"].as_str().unwrap().to_string();
    let salt = serde_json::to_string(&(Some("alpha"), None::<&str>)).unwrap();
    let leaf = |key: &HashKey| {
        let seed = HashSeed::new(key, &model, Some(&salt));
        block_hashes(&seed, &prompt(), BLOCK_TOKENS)[2].short()
    };
    let ids: Vec<&str> = entries["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["id"].as_str())
        .collect();
    assert!(ids.contains(&leaf(&secret).as_str()), "{ids:?}");
    assert!(!ids.contains(&leaf(&HashKey([0; 32])).as_str()));

    let (s, evicted) = as_key(port, "POST", "/v1/cache/evict", Some("root-key"));
    assert_eq!(s, 200, "{evicted}");
}
