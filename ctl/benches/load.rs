//! Load: 64 concurrent streaming clients against the release-built stack under `mlxcelctl
//! serve` for LOAD_SECONDS (default 300), each sending request after request (a shared system
//! prompt, its own question, 32–96 tokens, temperature 0.7). Prints errors, tokens, aggregate
//! throughput, TTFT and latency percentiles, peak and settled resident memory of each process
//! (sampled every second with `ps`), and after the run: leaked blocks (must be 0 once idle and
//! once the cache is evicted) and ledger drift (must be 0). Exits 1 if any check fails.
//!
//! Run with `make bench-load` (LOAD_SECONDS=60 for a shorter run, LOAD_CLIENTS to change 64).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mlxcel_tests::http;
use mlxcel_tests::serve::{self as stack, Served};
use serde_json::json;

#[derive(Default)]
struct Tally {
    requests: u64,
    completed: u64,
    tokens: u64,
    errors: BTreeMap<String, u64>,
    ttft: Vec<f64>,
    latency: Vec<f64>,
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Resident memory of `pid` in bytes (`ps -o rss=`, KiB, on Linux and macOS).
fn rss(pid: i32) -> Option<u64> {
    let out = std::process::Command::new("ps")
        .args(["-o", "rss=", "-p", &pid.to_string()])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse::<u64>()
        .ok()
        .map(|kib| kib * 1024)
}

fn client(port: u16, id: u64, stop: Arc<AtomicBool>, tally: Arc<Mutex<Tally>>) {
    let system = "You are a helpful assistant for a lighthouse museum. ".repeat(8);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let max_tokens = 32 + (id * 7 + n * 13) % 65;
        let body = json!({
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": format!("Visitor {id} asks question {n}: what is a lens?")}],
            "max_tokens": max_tokens, "temperature": 0.7, "seed": id * 1000 + n, "stream": true
        });
        let started = Instant::now();
        let mut first = None;
        let end = http::stream_chat(port, &body, |_| {
            first.get_or_insert_with(|| started.elapsed().as_secs_f64());
        });
        let mut t = tally.lock().unwrap();
        t.requests += 1;
        if end.done && end.error.is_none() {
            t.completed += 1;
            t.tokens += end.chunks as u64;
            t.latency.push(started.elapsed().as_secs_f64());
            if let Some(f) = first {
                t.ttft.push(f);
            }
        } else {
            let kind = match (&end.error, end.status) {
                (Some(e), _) => e["code"].as_str().unwrap_or("error").to_string(),
                (None, s) if s != 200 && s != 0 => format!("http {s}"),
                _ => "connection broken".to_string(),
            };
            *t.errors.entry(kind).or_default() += 1;
        }
    }
}

fn main() {
    let seconds = env_num("LOAD_SECONDS", 300);
    let clients = env_num("LOAD_CLIENTS", 64);
    let threads = std::env::var("OPENBLAS_NUM_THREADS").unwrap_or_else(|_| "default (2)".into());
    println!(
        "load: {clients} streaming clients for {seconds} s against mlxcelctl serve (release), \
         OpenBLAS threads {threads}, {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let served = Served::start(&[
        ("MLXCEL_KV_POOL_BYTES", "1GiB"),
        ("MLXCEL_LOG", "warn"),
        ("MLXCEL_MAX_QUEUE", "128"),
    ]);
    let status = served.status();
    let pids: Vec<(&str, i32)> = ["cachemgr", "daemon", "frontend"]
        .into_iter()
        .filter_map(|n| stack::pid_of(&status, n).map(|p| (n, p)))
        .collect();
    let idle_rss: Vec<u64> = pids.iter().map(|(_, p)| rss(*p).unwrap_or(0)).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let started = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|id| {
            let (stop, tally) = (stop.clone(), tally.clone());
            let port = served.port;
            std::thread::spawn(move || client(port, id, stop, tally))
        })
        .collect();
    let mut peak = vec![0u64; pids.len()];
    while started.elapsed() < Duration::from_secs(seconds) {
        for (i, (_, pid)) in pids.iter().enumerate() {
            peak[i] = peak[i].max(rss(*pid).unwrap_or(0));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    let elapsed = started.elapsed().as_secs_f64();

    // Idle: every block free or held for the cache; then evict the cache: every block free.
    let mut checks = Vec::new();
    let settled = Instant::now();
    let pool = loop {
        let st = served.status();
        let p = st["daemon"]["pool"].clone();
        let accounted =
            p["free_blocks"].as_u64().unwrap_or(0) + p["cache_blocks"].as_u64().unwrap_or(0);
        if st["daemon"]["running"] == 0 && accounted == p["total_blocks"].as_u64().unwrap_or(0) {
            break p;
        }
        if settled.elapsed() > Duration::from_secs(60) {
            break p;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let total = pool["total_blocks"].as_u64().unwrap_or(0);
    let leaked_idle = total
        - pool["free_blocks"].as_u64().unwrap_or(0)
        - pool["cache_blocks"].as_u64().unwrap_or(0).min(total);
    checks.push((
        "0 blocks held by no request and no cache once idle",
        leaked_idle == 0,
        format!("{leaked_idle} leaked of {total}"),
    ));
    let _ = std::process::Command::new(stack::bin("mlxcelctl"))
        .args(["cache", "evict", "--all", "--socket-dir"])
        .arg(served.path())
        .output();
    std::thread::sleep(Duration::from_secs(2));
    let free = served.status()["daemon"]["pool"]["free_blocks"]
        .as_u64()
        .unwrap_or(0);
    checks.push((
        "every block free after evicting the cache",
        free == total,
        format!("{free} free of {total}"),
    ));
    let drift = served.ctl_json(&["cache", "reconcile", "--json"])["drift_bytes"].as_u64();
    checks.push((
        "ledger drift 0",
        drift == Some(0),
        format!("{drift:?} bytes"),
    ));
    let settle_rss: Vec<u64> = pids.iter().map(|(_, p)| rss(*p).unwrap_or(0)).collect();

    let mut t = tally.lock().unwrap();
    let errors: u64 = t.errors.values().sum();
    checks.push((
        "0 errors",
        errors == 0,
        format!("{errors} errors {:?}", t.errors),
    ));
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "requests {} completed {} errors {} {:?}",
        t.requests, t.completed, errors, t.errors
    );
    println!(
        "tokens {} in {elapsed:.0} s = {:.1} tok/s aggregate",
        t.tokens,
        t.tokens as f64 / elapsed
    );
    let (tokens_ttft, tokens_latency) = (t.ttft.len(), t.latency.len());
    let ttft = [0.5, 0.9, 0.99].map(|p| percentile(&mut t.ttft, p));
    let latency = [0.5, 0.9, 0.99].map(|p| percentile(&mut t.latency, p));
    println!(
        "TTFT s (n={tokens_ttft}): p50 {:.2} p90 {:.2} p99 {:.2}   request latency s (n={tokens_latency}): p50 {:.2} p90 {:.2} p99 {:.2}",
        ttft[0], ttft[1], ttft[2], latency[0], latency[1], latency[2]
    );
    for (i, (name, _)) in pids.iter().enumerate() {
        println!(
            "{name:<9} resident MiB: idle {:.0}, peak {:.0}, settled {:.0}",
            mib(idle_rss[i]),
            mib(peak[i]),
            mib(settle_rss[i])
        );
    }
    let mut ok = true;
    for (what, pass, detail) in &checks {
        ok &= pass;
        println!("{} {what}: {detail}", if *pass { "PASS" } else { "FAIL" });
    }
    drop(t);
    drop(served);
    if !ok {
        std::process::exit(1);
    }
}
