//! `make bench`: the cache manager's acquire/donate round trips over its real socket, with
//! 100k cached blocks, against the release-built `mlxcel-cachemgr` process.
//!
//! Prints what it measured and how: round-trip latency percentiles with one request in flight,
//! sustained throughput with a window of requests in flight on one daemon connection, and the
//! same-size echo round trip over the same framing (the transport's floor on this machine).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mlxcel_ipc::block_hash::{HashSeed, block_hashes};
use mlxcel_ipc::client::{AdminClient, connect};
use mlxcel_ipc::proto::admin::{AdminReply, AdminRequest};
use mlxcel_ipc::proto::cache::{CacheToDaemon, DaemonToCache, DonatedBlock};
use mlxcel_ipc::{BlockHash, Connection, Dtype, Geometry, Limits, Role, socket};

const PROMPTS: u32 = 2_000;
const BLOCKS_PER_PROMPT: u32 = 50;
const SAMPLES: usize = 20_000;
const WINDOW: usize = 64;

struct Guard(Child);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn report(name: &str, mut samples: Vec<Duration>, target: bool) {
    samples.sort_unstable();
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    let p99 = percentile(&samples, 0.99);
    println!(
        "{name:<26} n={:<6} p50={:>6.1}us p99={:>6.1}us p99.9={:>6.1}us max={:>7.1}us mean={:>6.1}us{}",
        samples.len(),
        percentile(&samples, 0.50).as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6,
        percentile(&samples, 0.999).as_secs_f64() * 1e6,
        samples[samples.len() - 1].as_secs_f64() * 1e6,
        mean.as_secs_f64() * 1e6,
        match (target, p99 <= Duration::from_micros(100)) {
            (false, _) => "",
            (true, true) => "  target p99<=100us: PASS",
            (true, false) => "  target p99<=100us: FAIL",
        }
    );
}

/// The transport alone: an echo server on its own thread (same framing, same socket type)
/// answering a 50-hash frame with its length. What the manager adds is the difference.
async fn transport_floor(dir: &std::path::Path) -> anyhow::Result<Vec<Duration>> {
    let path = dir.join("echo.sock");
    let server_path = path.clone();
    std::thread::spawn(move || -> anyhow::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let listener = socket::bind(&server_path).await?;
            let mut c = Connection::new(listener.accept().await?, Limits::default());
            while let Some(v) = c.read_frame::<Vec<BlockHash>>().await? {
                c.write_frame(&(v.len() as u32)).await?;
            }
            Ok(())
        })
    });
    let start = Instant::now();
    let stream = loop {
        match socket::connect(&path).await {
            Ok(s) => break s,
            Err(_) if start.elapsed() < Duration::from_secs(5) => {
                tokio::time::sleep(Duration::from_millis(5)).await
            }
            Err(e) => return Err(e.into()),
        }
    };
    let mut c = Connection::new(stream, Limits::default());
    let msg = vec![BlockHash([7; 32]); BLOCKS_PER_PROMPT as usize];
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let t = Instant::now();
        c.write_frame(&msg).await?;
        anyhow::ensure!(c.read_frame::<u32>().await? == Some(BLOCKS_PER_PROMPT));
        samples.push(t.elapsed());
    }
    Ok(samples)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("mxb").tempdir_in("/tmp")?;
    let socket = dir.path().join("cachemgr.sock");
    let bin = env!("CARGO_BIN_EXE_mlxcel-cachemgr");
    let _manager = Guard(
        Command::new(bin)
            .args([
                "--capacity-bytes",
                "200GiB",
                "--reconcile-interval",
                "off",
                "--log-level",
                "warn",
            ])
            .arg("--socket-dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .spawn()?,
    );
    let start = Instant::now();
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(20),
            "manager did not start"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let geometry = Geometry {
        model_id: "SmolLM2-135M-Instruct".into(),
        layers: 30,
        kv_heads: 3,
        head_dim: 64,
        dtype: Dtype::F16,
        block_tokens: 32,
        pool_blocks: 400_000,
    };
    let conn = connect(&socket, Role::Daemon, Limits::default()).await?;
    let (mut rx, mut tx) = conn.into_split();
    tx.write_frame(&DaemonToCache::Register { call: 0, geometry })
        .await?;
    anyhow::ensure!(matches!(
        rx.read_frame::<CacheToDaemon>().await?,
        Some(CacheToDaemon::Registered { .. })
    ));

    // Fill: 2,000 prompts x 50 blocks = 100k cached blocks.
    let seed = HashSeed::new(&mlxcel_ipc::HashKey([0; 32]), "SmolLM2-135M-Instruct", None);
    let prompts: Vec<Vec<BlockHash>> = (0..PROMPTS)
        .map(|p| {
            let tokens: Vec<u32> = (0..BLOCKS_PER_PROMPT * 32)
                .map(|i| p * 1_000_000 + i)
                .collect();
            block_hashes(&seed, &tokens, 32)
        })
        .collect();
    let fill = Instant::now();
    let mut next_block = 0u32;
    for (call, hashes) in prompts.iter().enumerate() {
        let blocks = hashes
            .iter()
            .map(|&hash| {
                next_block += 1;
                DonatedBlock {
                    hash,
                    block: next_block - 1,
                }
            })
            .collect();
        tx.write_frame(&DaemonToCache::Donate {
            call: call as u64 + 1,
            blocks,
            pins: Vec::new(),
        })
        .await?;
        rx.read_frame::<CacheToDaemon>().await?;
    }
    let fill_time = fill.elapsed();
    let mut admin = AdminClient::connect(&socket, Role::Admin).await?;
    let AdminReply::Stats(stats) = admin.request(&AdminRequest::Stats).await? else {
        anyhow::bail!("stats")
    };
    println!(
        "mlxcel-cachemgr round-trip benchmark ({} cores, release build, one daemon connection over a Unix socket)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "filled {} cached blocks ({} real bytes at {} B/block) with {} donations of {} blocks in {:.2} s",
        stats.blocks,
        stats.used_bytes,
        stats.block_bytes,
        PROMPTS,
        BLOCKS_PER_PROMPT,
        fill_time.as_secs_f64()
    );

    report(
        "transport floor (echo)",
        transport_floor(dir.path()).await?,
        false,
    );

    // Latency, one in flight: acquire a cached 50-block prompt, then unlease.
    let mut acquire = Vec::with_capacity(SAMPLES);
    let mut call = 1_000_000u64;
    for i in 0..SAMPLES {
        let hashes = prompts[(i * 7919) % prompts.len()].clone();
        call += 1;
        let t = Instant::now();
        tx.write_frame(&DaemonToCache::Acquire { call, hashes })
            .await?;
        let Some(CacheToDaemon::Acquired { lease, blocks, .. }) = rx.read_frame().await? else {
            anyhow::bail!("acquire")
        };
        acquire.push(t.elapsed());
        anyhow::ensure!(
            blocks.len() == BLOCKS_PER_PROMPT as usize,
            "acquire must hit the whole prompt"
        );
        if let Some(lease) = lease {
            tx.write_frame(&DaemonToCache::Unlease { lease }).await?;
        }
    }
    report("acquire (50-block hit)", acquire, true);

    // Donate a new 1-block tail under a cached 50-block prefix.
    let mut donate = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES {
        let base = &prompts[i % prompts.len()];
        let tail = seed.chain(base.last(), &[i as u32; 32]);
        let first = (i % prompts.len()) as u32 * BLOCKS_PER_PROMPT;
        let mut blocks: Vec<DonatedBlock> = base
            .iter()
            .zip(first..)
            .map(|(&hash, block)| DonatedBlock { hash, block })
            .collect();
        blocks.push(DonatedBlock {
            hash: tail,
            block: next_block,
        });
        next_block += 1;
        call += 1;
        let t = Instant::now();
        tx.write_frame(&DaemonToCache::Donate {
            call,
            blocks,
            pins: Vec::new(),
        })
        .await?;
        let Some(CacheToDaemon::Donated { outcome, .. }) = rx.read_frame().await? else {
            anyhow::bail!("donate")
        };
        donate.push(t.elapsed());
        anyhow::ensure!(
            outcome.retained.len() == 1,
            "the new tail must be retained: {outcome:?}"
        );
    }
    report("donate (50 cached + 1 new)", donate, true);

    // Throughput: acquires with a window of requests in flight (unleases are fire-and-forget).
    let ops = 100_000usize;
    let t = Instant::now();
    let mut sent = 0usize;
    let mut done = 0usize;
    while done < ops {
        while sent < ops && sent - done < WINDOW {
            call += 1;
            let hashes = prompts[(sent * 31) % prompts.len()].clone();
            tx.write_frame(&DaemonToCache::Acquire { call, hashes })
                .await?;
            sent += 1;
        }
        let Some(CacheToDaemon::Acquired { lease, .. }) = rx.read_frame().await? else {
            anyhow::bail!("acquire")
        };
        if let Some(lease) = lease {
            tx.write_frame(&DaemonToCache::Unlease { lease }).await?;
        }
        done += 1;
    }
    let secs = t.elapsed().as_secs_f64();
    let rate = ops as f64 / secs;
    println!(
        "sustained acquire+unlease    {ops} ops in {secs:.2} s = {rate:.0} ops/s (window {WINDOW}) target >=50000 ops/s: {}",
        if rate >= 50_000.0 { "PASS" } else { "FAIL" }
    );
    let AdminReply::Stats(stats) = admin.request(&AdminRequest::Stats).await? else {
        anyhow::bail!("stats")
    };
    println!(
        "after: {} cached blocks, {} prefix hits, {} active leases",
        stats.blocks, stats.prefix_hits, stats.active_leases
    );
    Ok(())
}
