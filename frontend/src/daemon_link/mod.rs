//! The front end's one connection to the daemon, kept up by `link_task`: it connects (retrying
//! with backoff while the daemon is away), fetches the model info, builds the model's text
//! tools, and then multiplexes every HTTP request over the connection by request id.
//!
//! A [`Generation`] is one request's stream of events. Dropping it before it ended cancels the
//! request in the daemon, which frees its blocks: this is how client disconnects and stop
//! strings reach the engine.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mlxcel_ipc::client::ClientError;
use mlxcel_ipc::proto::WireError;
use mlxcel_ipc::proto::daemon::{
    DaemonHealth, DaemonToFrontend, FinishReason, FrontendToDaemon, Generate, RequestId, Usage,
};
use mlxcel_ipc::reconnect::{Next, Reconnect, Session as ReconnectSession};
use mlxcel_ipc::socket::LocalStream;
use mlxcel_ipc::{Connection, FrameError, FrameReader, Limits, Role};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;
use crate::text::ModelText;
use referee::{Open, Referee, Verdict};

mod referee;

/// Where and how to reach the daemon.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    pub socket: PathBuf,
    pub limits: Limits,
    /// The longest wait between reconnection attempts.
    pub max_backoff: Duration,
}

/// One event of a generation.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Token {
        token: u32,
        logprob: Option<f32>,
    },
    Done {
        finish: FinishReason,
        usage: Usage,
    },
    /// The daemon refused or failed the request.
    Failed(WireError),
    /// The connection to the daemon ended before the request did.
    Lost(String),
}

/// Handle on the daemon connection; cheap to clone.
#[derive(Clone)]
pub struct DaemonLink {
    state: Arc<Mutex<LinkState>>,
    referee: Referee,
}

enum LinkState {
    Down {
        reason: String,
    },
    /// Connected; the daemon loads its model or warms up (`stage`) and serves nothing yet.
    Starting {
        stage: String,
    },
    Up(Arc<Session>),
}

/// How often the link asks a starting daemon again for its model.
const STARTING_POLL: Duration = Duration::from_millis(200);

/// One live connection to the daemon, with the model it serves.
pub struct Session {
    out: mpsc::UnboundedSender<FrontendToDaemon>,
    /// Open requests; `None` once the connection has ended (new requests are refused).
    pending: Mutex<Option<HashMap<RequestId, Open>>>,
    /// Health requests waiting for their reply (the daemon answers in order).
    health: Mutex<VecDeque<oneshot::Sender<DaemonHealth>>>,
    next_id: AtomicU64,
    pub model: Arc<ModelText>,
    /// Entries of the model's tokenizer: a token id at or above it is a lie.
    vocab: u32,
    referee: Referee,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks cannot leave them inconsistent (single inserts/removes).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl DaemonLink {
    /// Starts `link_task`, which keeps a connection up until `shutdown`.
    pub fn spawn(config: LinkConfig, shutdown: CancellationToken) -> Self {
        let link = DaemonLink {
            state: Arc::new(Mutex::new(LinkState::Down {
                reason: format!("not connected yet to {}", config.socket.display()),
            })),
            referee: Referee::default(),
        };
        tokio::spawn(link_task(link.clone(), config, shutdown));
        link
    }

    /// The live session, or 503 with the reason the daemon is unreachable or not serving yet.
    pub fn session(&self) -> Result<Arc<Session>, ApiError> {
        match &*lock(&self.state) {
            LinkState::Up(s) => Ok(s.clone()),
            LinkState::Down { reason } => Err(ApiError::daemon_down(reason.clone())),
            LinkState::Starting { stage } => {
                Err(ApiError::daemon_down(format!("it is starting ({stage})")))
            }
        }
    }

    /// What a starting daemon is doing, while it starts.
    pub fn starting(&self) -> Option<String> {
        match &*lock(&self.state) {
            LinkState::Starting { stage } => Some(stage.clone()),
            _ => None,
        }
    }

    /// How often the daemon has broken the protocol since the front end started.
    pub fn protocol_violations(&self) -> u64 {
        self.referee.lies()
    }

    fn set(&self, state: LinkState) {
        *lock(&self.state) = state;
    }
}

impl Session {
    /// Sends `request` (its id is assigned here) and returns its event stream.
    pub fn generate(self: &Arc<Self>, mut request: Generate) -> Result<Generation, ApiError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        request.request_id = id;
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut pending = lock(&self.pending);
            let Some(map) = pending.as_mut() else {
                return Err(ApiError::daemon_down("the connection to the daemon ended"));
            };
            map.insert(
                id,
                Open {
                    events: tx,
                    prompt_tokens: u32::try_from(request.prompt.len()).unwrap_or(u32::MAX),
                    max_tokens: request.max_tokens,
                    sent: 0,
                },
            );
        }
        if self.out.send(FrontendToDaemon::Generate(request)).is_err() {
            self.forget(id);
            return Err(ApiError::daemon_down("the connection to the daemon ended"));
        }
        Ok(Generation {
            id,
            rx,
            session: self.clone(),
            ended: false,
        })
    }

    /// The daemon's health, or None when it does not answer within `timeout`.
    pub async fn health(&self, timeout: Duration) -> Option<DaemonHealth> {
        let (tx, rx) = oneshot::channel();
        {
            let mut waiters = lock(&self.health);
            waiters.push_back(tx);
            self.out.send(FrontendToDaemon::Health).ok()?;
        }
        tokio::time::timeout(timeout, rx).await.ok()?.ok()
    }

    fn forget(&self, id: RequestId) {
        if let Some(map) = lock(&self.pending).as_mut() {
            map.remove(&id);
        }
    }

    fn dispatch(&self, msg: DaemonToFrontend) {
        let id = match &msg {
            DaemonToFrontend::Token { request_id, .. }
            | DaemonToFrontend::Done { request_id, .. }
            | DaemonToFrontend::Failed { request_id, .. } => *request_id,
            DaemonToFrontend::Health(h) => {
                if let Some(waiter) = lock(&self.health).pop_front() {
                    let _ = waiter.send(h.clone());
                }
                return;
            }
            DaemonToFrontend::Info(_) | DaemonToFrontend::Starting { .. } => return,
            DaemonToFrontend::Error(e) => {
                tracing::warn!(code = ?e.code, "the daemon reported an error: {}", e.message);
                return;
            }
        };
        if id == 0 || id >= self.next_id.load(Ordering::Relaxed) {
            self.referee.lie(format_args!(
                "an event for request {id}, which was never sent"
            ));
            return;
        }
        let mut pending = lock(&self.pending);
        let Some(map) = pending.as_mut() else { return };
        // Not open: it ended, or its client went and it was cancelled (events may still come).
        let Some(open) = map.get_mut(&id) else { return };
        let (event, last, cancel) = match msg {
            DaemonToFrontend::Token { token, logprob, .. } => {
                match self.referee.token(open, id, self.vocab, token, logprob) {
                    Verdict::Deliver(event) => (event, false, false),
                    Verdict::End(event) => (event, true, true),
                }
            }
            DaemonToFrontend::Done { finish, usage, .. } => {
                let usage = self.referee.usage(open, id, usage);
                (Event::Done { finish, usage }, true, false)
            }
            DaemonToFrontend::Failed { error, .. } => (Event::Failed(error), true, false),
            _ => return,
        };
        let _ = open.events.send(event);
        if last {
            map.remove(&id);
        }
        drop(pending);
        if cancel {
            let _ = self.out.send(FrontendToDaemon::Cancel { request_id: id });
        }
    }

    /// Ends every open request with `Lost` and refuses new ones.
    fn close(&self, reason: &str) {
        let pending = lock(&self.pending).take().unwrap_or_default();
        for (_, open) in pending {
            let _ = open.events.send(Event::Lost(reason.to_string()));
        }
        lock(&self.health).clear();
    }
}

/// One request's events. Dropping it before `Done`/`Failed` cancels the request in the daemon.
pub struct Generation {
    id: RequestId,
    rx: mpsc::UnboundedReceiver<Event>,
    session: Arc<Session>,
    ended: bool,
}

impl Generation {
    /// The next event; after a final one (`Done`, `Failed`, `Lost`) this keeps returning `Lost`.
    pub async fn next(&mut self) -> Event {
        let event = self
            .rx
            .recv()
            .await
            .unwrap_or_else(|| Event::Lost("the connection to the daemon ended".into()));
        if !matches!(event, Event::Token { .. }) {
            self.ended = true;
        }
        event
    }

    /// Asks the daemon to stop; the request still ends with `Done { Cancelled }` (with usage).
    pub fn cancel(&self) {
        let _ = self.session.out.send(FrontendToDaemon::Cancel {
            request_id: self.id,
        });
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.ended {
            self.session.forget(self.id);
            self.cancel();
        }
    }
}

/// Keeps a session up: connect, fetch the model, serve, and reconnect when it ends (the loop
/// is `mlxcel_ipc::reconnect`, shared with the daemon's cache-manager client).
async fn link_task(link: DaemonLink, config: LinkConfig, shutdown: CancellationToken) {
    // A hung daemon may accept and never answer the handshake: retry later.
    let reconnect = Reconnect {
        socket: config.socket.clone(),
        role: Role::Frontend,
        limits: config.limits,
        connect_timeout: Duration::from_secs(10),
        first_backoff: Duration::from_millis(50),
        max_backoff: config.max_backoff,
    };
    let mut session = LinkSession {
        link: &link,
        socket: &config.socket,
    };
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = reconnect.run(&mut session) => {}
    }
}

/// The daemon's side of [`Reconnect`]: the link is up while a session runs.
struct LinkSession<'a> {
    link: &'a DaemonLink,
    socket: &'a PathBuf,
}

impl ReconnectSession for LinkSession<'_> {
    async fn run(&mut self, conn: Connection<LocalStream>) -> Next {
        let Err(reason) = run_session(self.link, self.socket, conn).await;
        tracing::debug!(%reason, "daemon link down; reconnecting");
        self.link.set(LinkState::Down { reason });
        Next::Retry
    }

    fn unreachable(&mut self, error: &ClientError) -> Next {
        let reason = format!("cannot reach {}: {error}", self.socket.display());
        tracing::debug!(%reason, "daemon not reachable");
        self.link.set(LinkState::Down { reason });
        Next::Retry
    }
}

/// One connection's life, until it ends: why it could not start or why it ended.
async fn run_session(
    link: &DaemonLink,
    socket: &std::path::Path,
    conn: Connection<LocalStream>,
) -> Result<std::convert::Infallible, String> {
    let (mut reader, mut writer) = conn.into_split();
    writer
        .write_frame(&FrontendToDaemon::Info)
        .await
        .map_err(|e| format!("daemon connection failed: {e}"))?;
    let info = loop {
        match reader.read_frame::<DaemonToFrontend>().await {
            Ok(Some(DaemonToFrontend::Info(info))) => break info,
            Ok(Some(DaemonToFrontend::Starting { stage })) => {
                link.set(LinkState::Starting { stage });
                tokio::time::sleep(STARTING_POLL).await;
                writer
                    .write_frame(&FrontendToDaemon::Info)
                    .await
                    .map_err(|e| format!("daemon connection failed: {e}"))?;
            }
            Ok(Some(_)) => continue,
            Ok(None) => return Err("the daemon closed the connection".into()),
            Err(e) => return Err(format!("daemon connection failed: {e}")),
        }
    };
    let model = tokio::task::spawn_blocking(move || ModelText::new(&info))
        .await
        .map_err(|e| format!("building the model's tokenizer failed: {e}"))??;
    let (out, mut out_rx) = mpsc::unbounded_channel::<FrontendToDaemon>();
    let session = Arc::new(Session {
        out,
        pending: Mutex::new(Some(HashMap::new())),
        health: Mutex::new(VecDeque::new()),
        next_id: AtomicU64::new(1),
        vocab: u32::try_from(model.tokenizer.get_vocab_size(true)).unwrap_or(u32::MAX),
        model: Arc::new(model),
        referee: link.referee.clone(),
    });
    let writer_task = tokio::spawn(async move {
        while let Some(msg) = out_rx.recv().await {
            if writer.write_frame(&msg).await.is_err() {
                return;
            }
        }
    });
    tracing::info!(model = %session.model.model_id, socket = %socket.display(), "connected to the daemon");
    link.set(LinkState::Up(session.clone()));
    let ended = read_loop(&mut reader, &session).await;
    link.set(LinkState::Down {
        reason: ended.clone(),
    });
    session.close(&ended);
    writer_task.abort();
    tracing::warn!("{ended}");
    Err(ended)
}

async fn read_loop(
    reader: &mut FrameReader<tokio::io::ReadHalf<LocalStream>>,
    session: &Session,
) -> String {
    loop {
        match reader.read_frame::<DaemonToFrontend>().await {
            Ok(Some(msg)) => session.dispatch(msg),
            Ok(None) => return "the daemon closed the connection".into(),
            Err(e) if e.is_recoverable() => {
                session
                    .referee
                    .lie(format_args!("an undecodable frame: {e}"));
            }
            Err(e) => {
                if matches!(e, FrameError::TooLarge { .. }) {
                    session.referee.lie(format_args!("{e}"));
                }
                return format!("the daemon connection failed: {e}");
            }
        }
    }
}
