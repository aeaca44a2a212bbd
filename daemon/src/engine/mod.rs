//! The engine thread: it owns the model, the paged pool and every running sequence, and is the
//! only place MLX runs. Sockets and timers live on tokio and talk to it through [`Command`]s; it
//! answers through per-connection event channels, so a slow client never stalls a step.
//!
//! Scheduling: a FIFO waiting queue admitted by free blocks (up to `max_running` sequences); each
//! step runs a prefill chunk for every sequence still computing its prompt, then one batched
//! decode pass for every sequence ready to sample.
//!
//! The cache side: a request arrives with the prefix the cache manager leased to it; the engine
//! maps those blocks (refcount +1) and prefills only the rest. When a request ends, its full
//! blocks are offered to the manager; the outcome comes back in order with the manager's other
//! orders, and the engine adds the cache's reference to the retained blocks before dropping the
//! sequence's own.

mod sequence;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mlx_rs::{Array, Dtype};
use mlxcel_ipc::proto::cache::{DonatedBlock, Epoch, InventoryReport, LeaseId};
use mlxcel_ipc::proto::daemon::{
    DaemonToFrontend, FinishReason, Generate, ModelInfo, PoolStats, RequestId,
};
use mlxcel_ipc::proto::{ErrorCode, WireError};
use mlxcel_ipc::{BlockId, Geometry};
use tokio::sync::mpsc::UnboundedSender;

use crate::cache_client::{CacheClient, ManagerOrder};
use crate::paged::{PagedBatch, PagedSeq};
use crate::pool::{BlockPool, PoolShape};
use crate::sampler::Sampler;
use crate::{EngineError, Loaded, Result};
use sequence::{Sampled, Sequence};

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub model: PathBuf,
    pub block_tokens: usize,
    /// Bytes for the KV pool (None = a quarter of available memory, at most 4 GiB).
    pub kv_pool_bytes: Option<u64>,
    pub prefill_chunk: usize,
    pub max_running: usize,
    /// The operator's sampling defaults (the model's own settings come first).
    pub sampling: crate::sampling_defaults::OperatorDefaults,
}

/// The prefix the cache manager leased to a request.
#[derive(Debug, Clone, Default)]
pub struct Prefix {
    pub lease: Option<LeaseId>,
    pub blocks: Vec<BlockId>,
}

/// Work for the engine thread.
pub enum Command {
    Submit {
        conn: u64,
        req: Generate,
        prefix: Prefix,
        events: UnboundedSender<DaemonToFrontend>,
    },
    Cancel {
        conn: u64,
        request_id: RequestId,
    },
    ConnectionClosed {
        conn: u64,
    },
    /// The cache-manager client, and the runtime its requests run on.
    AttachCache(CacheClient, tokio::runtime::Handle),
    Order(ManagerOrder),
    Shutdown,
}

/// The engine's counts, published after every scheduling round so that health questions are
/// answered at once, never queued behind a model step (a long prefill takes seconds).
#[derive(Debug, Clone, Copy, Default)]
pub struct EngineVitals {
    pub running: u32,
    pub waiting: u32,
    /// Sequences preempted so far.
    pub preemptions: u64,
    pub pool: PoolStats,
}

/// Where the engine publishes its [`EngineVitals`].
pub type Vitals = Arc<Mutex<EngineVitals>>;

/// The latest published vitals.
pub fn read_vitals(vitals: &Vitals) -> EngineVitals {
    *vitals.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the engine reports once the model is loaded.
pub struct Started {
    pub info: ModelInfo,
    pub geometry: Geometry,
    pub vitals: Vitals,
}

/// Starts the engine thread: loads the model, builds the pool, then serves commands.
pub fn spawn(
    config: EngineConfig,
) -> Result<(Sender<Command>, Started, std::thread::JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || match Engine::load(&config) {
            Ok((engine, started)) => {
                let _ = started_tx.send(Ok(started));
                engine.run(rx);
            }
            Err(e) => {
                let _ = started_tx.send(Err(e));
            }
        })
        .map_err(|e| EngineError::Request(format!("cannot start the engine thread: {e}")))?;
    let started = started_rx
        .recv()
        .map_err(|_| EngineError::Request("the engine thread died while loading".into()))??;
    Ok((tx, started, handle))
}

struct Finishing {
    seq: PagedSeq,
    lease: Option<LeaseId>,
}

struct Engine {
    loaded: Loaded,
    pool: BlockPool,
    config: EngineConfig,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    /// Blocks the engine holds a cache reference on.
    cache_held: HashSet<BlockId>,
    /// Sequences whose donation outcome has not arrived yet, by tag.
    finishing: HashMap<u64, Finishing>,
    next_tag: u64,
    preemptions: u64,
    cache: Option<CacheClient>,
    runtime: Option<tokio::runtime::Handle>,
    epoch: Option<Epoch>,
    vitals: Vitals,
}

fn pool_blocks(config: &EngineConfig, block_bytes: u64) -> u32 {
    let bytes = config.kv_pool_bytes.unwrap_or_else(|| {
        let available = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemAvailable:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            })
            .map_or(8 << 30, |kb| kb * 1024);
        (available / 4).min(4 << 30)
    });
    (bytes / block_bytes.max(1)).min(u64::from(u32::MAX)) as u32
}

impl Engine {
    fn load(config: &EngineConfig) -> Result<(Engine, Started)> {
        // Checked before the weights load, so a bad setting fails at once.
        let defaults = crate::sampling_defaults::resolve(&config.model, &config.sampling)?;
        tracing::info!("sampling defaults: {}", defaults.describe());
        let loaded = crate::load(&config.model)?;
        let c = &loaded.model.config;
        let dtype = loaded.model.placement.dtype;
        let mut shape = PoolShape {
            layers: c.layers,
            num_blocks: 0,
            block_tokens: config.block_tokens,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            dtype,
        };
        shape.num_blocks = pool_blocks(config, shape.block_bytes() as u64);
        if shape.num_blocks == 0 {
            return Err(EngineError::Request(
                "the KV pool is smaller than one block".into(),
            ));
        }
        let pool = BlockPool::new(shape)?;
        let geometry = Geometry {
            model_id: loaded.model_id.clone(),
            layers: c.layers as u32,
            kv_heads: c.kv_heads as u32,
            head_dim: c.head_dim as u32,
            dtype: match dtype {
                Dtype::Float32 => mlxcel_ipc::Dtype::F32,
                Dtype::Bfloat16 => mlxcel_ipc::Dtype::BF16,
                _ => mlxcel_ipc::Dtype::F16,
            },
            block_tokens: config.block_tokens as u32,
            pool_blocks: shape.num_blocks,
        };
        tracing::info!(
            blocks = shape.num_blocks,
            block_bytes = shape.block_bytes(),
            pool_bytes = pool.measured_bytes(),
            "KV pool ready"
        );
        let info = ModelInfo {
            model_id: loaded.model_id.clone(),
            context_length: loaded.text.context_length as u32,
            vocab_size: c.vocab as u32,
            tokenizer_json: loaded.text.tokenizer_json()?,
            chat_template: loaded.text.chat_template.clone(),
            bos: loaded.text.bos,
            eos: loaded.text.eos,
            stop_ids: loaded.text.stop_ids.clone(),
            geometry: geometry.clone(),
            pool: PoolStats::default(),
            sampling_defaults: defaults.values,
        };
        let engine = Engine {
            loaded,
            pool,
            config: config.clone(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            cache_held: HashSet::new(),
            finishing: HashMap::new(),
            next_tag: 1,
            preemptions: 0,
            cache: None,
            runtime: None,
            epoch: None,
            vitals: Vitals::default(),
        };
        engine.publish();
        let info = ModelInfo {
            pool: engine.pool_stats(),
            ..info
        };
        let vitals = engine.vitals.clone();
        Ok((
            engine,
            Started {
                info,
                geometry,
                vitals,
            },
        ))
    }

    fn pool_stats(&self) -> PoolStats {
        let shape = self.pool.shape();
        PoolStats {
            total_blocks: shape.num_blocks,
            free_blocks: self.pool.free_blocks(),
            cache_blocks: self.cache_held.len() as u32,
            block_bytes: shape.block_bytes() as u64,
            pool_bytes_measured: self.pool.measured_bytes(),
        }
    }

    fn publish(&self) {
        let now = EngineVitals {
            running: self.running.len() as u32,
            waiting: self.waiting.len() as u32,
            preemptions: self.preemptions,
            pool: self.pool_stats(),
        };
        *self.vitals.lock().unwrap_or_else(|p| p.into_inner()) = now;
    }

    fn run(mut self, rx: Receiver<Command>) {
        loop {
            // Idle: wait for work. Waiting for room: wait a little (releases arrive as commands).
            // Busy: take whatever arrived, then step.
            if self.running.is_empty() {
                let next = if self.waiting.is_empty() {
                    rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
                } else {
                    rx.recv_timeout(Duration::from_millis(20))
                };
                match next {
                    Ok(cmd) => {
                        if !self.command(cmd) {
                            break;
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(cmd) => {
                        if !self.command(cmd) {
                            self.shutdown();
                            return;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.shutdown();
                        return;
                    }
                }
            }
            self.admit();
            self.publish();
            self.step_all();
            self.publish();
        }
        self.shutdown();
    }

    /// Applies one command; false to stop.
    fn command(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Submit {
                conn,
                req,
                prefix,
                events,
            } => self.submit(conn, req, prefix, events),
            Command::Cancel { conn, request_id } => {
                self.cancel(|s| s.conn == conn && s.id == request_id)
            }
            Command::ConnectionClosed { conn } => self.cancel(|s| s.conn == conn),
            Command::AttachCache(client, runtime) => {
                self.cache = Some(client);
                self.runtime = Some(runtime);
            }
            Command::Order(order) => self.order(order),
            Command::Shutdown => return false,
        }
        true
    }

    fn submit(
        &mut self,
        conn: u64,
        req: Generate,
        prefix: Prefix,
        events: UnboundedSender<DaemonToFrontend>,
    ) {
        let ctx = self.loaded.model.config.context_length;
        let fail = |events: &UnboundedSender<DaemonToFrontend>, message: String| {
            let error = WireError::new(ErrorCode::BadRequest, message);
            let _ = events.send(DaemonToFrontend::Failed {
                request_id: req.request_id,
                error,
            });
        };
        if req.prompt.is_empty() {
            return fail(&events, "the prompt is empty".into());
        }
        if req.prompt.len() >= ctx {
            self.unlease(prefix.lease);
            return fail(
                &events,
                format!(
                    "the prompt has {} tokens; the context window is {ctx}",
                    req.prompt.len()
                ),
            );
        }
        if let Some(&bad) = req
            .prompt
            .iter()
            .find(|&&t| t as usize >= self.loaded.model.config.vocab)
        {
            self.unlease(prefix.lease);
            return fail(&events, format!("token id {bad} is outside the vocabulary"));
        }
        let bt = self.config.block_tokens;
        // Map only blocks that leave at least one prompt token to compute, and only live ones.
        let usable = prefix.blocks.len().min((req.prompt.len() - 1) / bt);
        let mapped: Vec<BlockId> = prefix.blocks[..usable]
            .iter()
            .copied()
            .take_while(|&b| self.pool.refcount(b) > 0)
            .collect();
        for &b in &mapped {
            self.pool.retain(b);
        }
        let cached_tokens = mapped.len() * bt;
        let params = req.sampling.clone();
        let now = Instant::now();
        self.waiting.push_back(Sequence {
            conn,
            id: req.request_id,
            sampler: Sampler::new(params, &req.prompt),
            max_tokens: (req.max_tokens as usize).min(ctx - req.prompt.len()),
            kv: PagedSeq::with_prefix(mapped, bt),
            prompt: req.prompt,
            generated: Vec::new(),
            lease: prefix.lease,
            cached_tokens,
            stop_ids: req.stop_ids,
            logprobs: req.logprobs,
            salt: req.cache_salt,
            events,
            queued_at: now,
            started_at: now,
            prefill_done_at: None,
            next_logits: None,
        });
    }

    /// Starts waiting sequences, oldest first, while the pool has room for their prompts.
    fn admit(&mut self) {
        while self.running.len() < self.config.max_running {
            let Some(front) = self.waiting.front() else {
                break;
            };
            let bt = self.config.block_tokens;
            let tokens = front.prompt.len() + front.generated.len();
            let need = tokens.div_ceil(bt).saturating_sub(front.kv.table.len()) as u32;
            if need > self.pool.free_blocks() {
                if self.running.is_empty() && need > self.pool.shape().num_blocks {
                    // Can never fit: fail it rather than wait forever.
                    if let Some(s) = self.waiting.pop_front() {
                        let message = "the prompt needs more KV blocks than the pool has";
                        self.fail(s, WireError::new(ErrorCode::BadRequest, message));
                    }
                    continue;
                }
                self.reclaim(need - self.pool.free_blocks());
                break;
            }
            if let Some(mut s) = self.waiting.pop_front() {
                s.started_at = Instant::now();
                self.running.push(s);
            }
        }
    }

    /// Asks the cache manager to evict cached blocks the pool needs (fire and forget; the
    /// releases arrive as orders).
    fn reclaim(&self, blocks: u32) {
        if let (Some(client), Some(rt)) = (self.cache.clone(), &self.runtime)
            && !self.cache_held.is_empty()
        {
            rt.spawn(async move {
                client.reclaim(blocks).await;
            });
        }
    }

    /// One scheduler step: a prefill chunk for each sequence that needs one, then one batched
    /// decode step for every sequence ready to sample.
    fn step_all(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if !self.running[i].needs_prefill() {
                i += 1;
                continue;
            }
            match self.running[i].prefill_step(
                &self.loaded.model,
                &mut self.pool,
                self.config.prefill_chunk,
            ) {
                Ok(()) => i += 1,
                Err(e) => {
                    if self.pool_full(i, e) {
                        i += 1;
                    }
                }
            }
        }
        // Sample every ready sequence; those that go on need their new token computed.
        let mut next: Vec<(usize, u32)> = Vec::new();
        let mut finished: Vec<(usize, End)> = Vec::new();
        for (i, s) in self.running.iter_mut().enumerate() {
            if s.needs_prefill() || s.next_logits.is_none() {
                continue;
            }
            match s.sample_next() {
                Ok(Sampled::Next(token)) => next.push((i, token)),
                Ok(Sampled::Finished(reason)) => finished.push((i, End::Finished(reason))),
                Err(e) => {
                    tracing::error!(request = s.id, error = %e, "sampling failed");
                    finished.push((i, End::Failed(e)));
                }
            }
        }
        // Room for one more token each (sequences are untouched until the batch runs).
        let mut batch: Vec<(usize, u32)> = Vec::new();
        let mut starved: Vec<usize> = Vec::new();
        for (i, token) in next {
            if self.running[i].kv.reserve(&mut self.pool, 1) {
                batch.push((i, token));
            } else {
                starved.push(i);
            }
        }
        if !batch.is_empty() {
            let tokens: Vec<u32> = batch.iter().map(|&(_, t)| t).collect();
            let pool = &mut self.pool;
            let mut seqs: Vec<&mut Sequence> = self
                .running
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| batch.iter().any(|&(b, _)| b == *i))
                .map(|(_, s)| s)
                .collect();
            let result = {
                let kv: Vec<&mut PagedSeq> = seqs.iter_mut().map(|s| &mut s.kv).collect();
                let mut batch_kv = PagedBatch::new(kv, pool);
                self.loaded.model.forward_batch(&tokens, &mut batch_kv)
            };
            match result.and_then(|l| {
                l.eval()?;
                Ok(l)
            }) {
                Ok(logits) => {
                    for (row, s) in seqs.into_iter().enumerate() {
                        let pick = Array::from_slice(&[row as i32], &[1]);
                        s.next_logits = logits.take_axis(pick, 0).ok();
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "batched decode step failed");
                    for &(i, _) in &batch {
                        let e = EngineError::Internal(format!("the decode step failed: {e}"));
                        finished.push((i, End::Failed(e)));
                    }
                }
            }
        }
        // Retire finished sequences (highest index first so indexes stay valid), then handle
        // the ones that found no room.
        finished.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
        finished.dedup_by_key(|f| f.0);
        for (i, end) in finished {
            let s = self.running.remove(i);
            starved.retain(|&x| x != i);
            for x in starved.iter_mut() {
                if *x > i {
                    *x -= 1;
                }
            }
            match end {
                End::Finished(reason) => self.finish(s, reason),
                End::Failed(e) => self.fail(s, e.wire()),
            }
        }
        starved.sort_unstable_by_key(|&i| std::cmp::Reverse(i));
        for i in starved {
            if i < self.running.len() {
                // Its sampled token is in `generated`: it is recomputed with the rest.
                self.pool_full(
                    i,
                    EngineError::PoolExhausted {
                        needed_tokens: 1,
                        free_blocks: 0,
                    },
                );
            }
        }
    }

    /// Handles a step of sequence `i` that failed; true when sequence `i` is still in place.
    fn pool_full(&mut self, i: usize, e: EngineError) -> bool {
        match e {
            EngineError::PoolExhausted { .. }
                if self.running.len() == 1
                    && self.cache_held.is_empty()
                    && self.finishing.is_empty() =>
            {
                // Alone, nothing to reclaim and no finished request's blocks about to come
                // back (a donation the manager has not answered yet): this can never fit.
                let s = self.running.remove(i);
                let message = "the request needs more KV blocks than the pool has";
                self.fail(s, WireError::new(ErrorCode::BadRequest, message));
                false
            }
            EngineError::PoolExhausted { .. } => {
                // Ask the cache for room and preempt the youngest running sequence; it keeps
                // its output and sampler and recomputes its K/V when it runs again.
                self.reclaim(1);
                let youngest = self.running.len() - 1;
                let mut s = self.running.remove(youngest);
                tracing::info!(request = s.id, "preempting: the KV pool is full");
                self.preemptions += 1;
                s.kv.free(&mut self.pool);
                s.next_logits = None;
                self.waiting.push_front(s);
                youngest != i
            }
            e => {
                tracing::error!(request = self.running[i].id, error = %e, "prefill failed");
                let s = self.running.remove(i);
                self.fail(s, e.wire());
                false
            }
        }
    }

    /// Offers the full blocks to the cache (or frees them), then reports the end. The donation
    /// is queued to the manager first, so a request sent after this `Done` finds its prefix.
    fn finish(&mut self, mut s: Sequence, reason: FinishReason) {
        let usage = s.usage();
        let bt = self.config.block_tokens;
        let hashes = s.full_block_hashes(&self.loaded.model_id, bt);
        let blocks: Vec<DonatedBlock> = hashes
            .iter()
            .zip(&s.kv.table)
            .map(|(&hash, &block)| DonatedBlock { hash, block })
            .collect();
        let tag = self.next_tag;
        self.next_tag += 1;
        let offered = !blocks.is_empty()
            && self
                .cache
                .as_ref()
                .is_some_and(|c| c.donate_ordered(tag, blocks));
        if offered {
            let seq = std::mem::take(&mut s.kv);
            self.finishing.insert(
                tag,
                Finishing {
                    seq,
                    lease: s.lease,
                },
            );
        } else {
            s.kv.free(&mut self.pool);
            self.unlease(s.lease);
        }
        let _ = s.events.send(DaemonToFrontend::Done {
            request_id: s.id,
            finish: reason,
            usage,
        });
    }

    fn cancel(&mut self, matches: impl Fn(&Sequence) -> bool) {
        let mut gone: Vec<Sequence> = Vec::new();
        let mut keep = Vec::with_capacity(self.running.len());
        for s in self.running.drain(..) {
            if matches(&s) {
                gone.push(s)
            } else {
                keep.push(s)
            }
        }
        self.running = keep;
        let (waiting_gone, waiting_keep): (Vec<_>, Vec<_>) =
            self.waiting.drain(..).partition(|s| matches(s));
        self.waiting = waiting_keep.into();
        for mut s in gone.into_iter().chain(waiting_gone) {
            let usage = s.usage();
            let _ = s.events.send(DaemonToFrontend::Done {
                request_id: s.id,
                finish: FinishReason::Cancelled,
                usage,
            });
            s.kv.free(&mut self.pool);
            self.unlease(s.lease);
        }
    }

    /// Ends a request with an error and gives back what it held.
    fn fail(&mut self, mut s: Sequence, error: WireError) {
        let _ = s.events.send(DaemonToFrontend::Failed {
            request_id: s.id,
            error,
        });
        s.kv.free(&mut self.pool);
        self.unlease(s.lease);
    }

    fn unlease(&self, lease: Option<LeaseId>) {
        if let (Some(lease), Some(client)) = (lease, &self.cache) {
            client.unlease(lease);
        }
    }

    fn order(&mut self, order: ManagerOrder) {
        match order {
            ManagerOrder::Registered(epoch) => self.epoch = Some(epoch),
            ManagerOrder::Release { blocks, done } => {
                for b in blocks {
                    if self.cache_held.remove(&b) {
                        self.pool.release(b);
                    } else {
                        tracing::warn!(block = b, "release of a block not held for the cache");
                    }
                }
                let _ = done.send(());
            }
            ManagerOrder::Inventory { reply } => {
                let stats = self.pool_stats();
                let _ = reply.send(InventoryReport {
                    epoch: self.epoch.unwrap_or(Epoch(0)),
                    cache_blocks: self.cache_held.iter().copied().collect(),
                    pool_blocks: stats.total_blocks,
                    free_blocks: stats.free_blocks,
                    pool_bytes_measured: stats.pool_bytes_measured,
                    engine_active_bytes: mlx_rs::memory::active_memory().unwrap_or(0) as u64,
                });
            }
            ManagerOrder::Donated { tag, outcome } => {
                if let Some(mut f) = self.finishing.remove(&tag) {
                    for &b in &outcome.retained {
                        if self.cache_held.insert(b) {
                            self.pool.retain(b);
                        }
                    }
                    f.seq.free(&mut self.pool);
                    self.unlease(f.lease);
                }
            }
            ManagerOrder::DonationLost { tag } => {
                if let Some(mut f) = self.finishing.remove(&tag) {
                    f.seq.free(&mut self.pool);
                }
            }
            ManagerOrder::Disconnected => {
                self.epoch = None;
                for b in self.cache_held.drain() {
                    self.pool.release(b);
                }
            }
        }
    }

    fn shutdown(&mut self) {
        self.cancel(|_| true);
        for (_, mut f) in self.finishing.drain() {
            f.seq.free(&mut self.pool);
        }
        for b in self.cache_held.drain() {
            self.pool.release(b);
        }
        tracing::info!(free_blocks = self.pool.free_blocks(), "engine stopped");
    }
}

/// How a running sequence leaves the batch in a step.
enum End {
    /// It finished normally: its blocks are offered to the cache.
    Finished(FinishReason),
    /// It failed: the client gets the error and its blocks are freed.
    Failed(EngineError),
}
