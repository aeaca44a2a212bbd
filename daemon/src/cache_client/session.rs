//! The connection task: connect, register, then move messages between the handle, the
//! manager and the engine until the session fails; then tell the engine and reconnect (the
//! loop is `mlxcel_ipc::reconnect`, shared with the front end's daemon link).

use std::time::Duration;

use mlxcel_ipc::client::ClientError;
use mlxcel_ipc::proto::cache::{CacheToDaemon, DaemonToCache, ReleaseId};
use mlxcel_ipc::reconnect::{Next, Reconnect, Session as ReconnectSession};
use mlxcel_ipc::socket::LocalStream;
use mlxcel_ipc::{Connection, FRAME_DEADLINE, FrameReader, FrameWriter, Limits, Role};
use tokio::sync::{mpsc, oneshot, watch};

use super::{CacheClientConfig, Donations, ManagerOrder, Pending, Registration};

/// State shared between the handle and the connection task.
pub(super) struct Shared {
    pub(super) pending: Pending,
    pub(super) donations: Donations,
    pub(super) epoch: watch::Sender<Option<Registration>>,
    pub(super) orders: mpsc::UnboundedSender<ManagerOrder>,
}

pub(super) async fn connection_task(
    config: CacheClientConfig,
    mut out_rx: mpsc::UnboundedReceiver<DaemonToCache>,
    shared: Shared,
) {
    // A hung manager accepts the connection but never answers the handshake: retry later.
    let reconnect = Reconnect {
        socket: config.socket.clone(),
        role: Role::Daemon,
        limits: Limits::default(),
        connect_timeout: config.request_timeout,
        first_backoff: Duration::from_millis(50),
        max_backoff: config.max_backoff,
    };
    let mut session = ManagerSession {
        config: &config,
        out_rx: &mut out_rx,
        shared: &shared,
    };
    reconnect.run(&mut session).await;
}

/// The cache manager's side of [`Reconnect`]: register and serve, then tell the engine.
struct ManagerSession<'a> {
    config: &'a CacheClientConfig,
    out_rx: &'a mut mpsc::UnboundedReceiver<DaemonToCache>,
    shared: &'a Shared,
}

impl ReconnectSession for ManagerSession<'_> {
    async fn run(&mut self, conn: Connection<LocalStream>) -> Next {
        let shared = self.shared;
        let (reader, writer) = conn.into_split();
        session(self.config, reader, writer, self.out_rx, shared).await;
        let _ = shared.epoch.send(None);
        if let Ok(mut p) = shared.pending.lock() {
            p.clear();
        }
        let lost: Vec<u64> = shared
            .donations
            .lock()
            .map(|mut d| d.drain().map(|(_, (t, _))| t).collect())
            .unwrap_or_default();
        for tag in lost {
            let _ = shared.orders.send(ManagerOrder::DonationLost { tag });
        }
        if shared.orders.send(ManagerOrder::Disconnected).is_err() {
            return Next::Stop;
        }
        tracing::warn!("cache manager connection lost; serving without prefix reuse, reconnecting");
        Next::Retry
    }

    fn unreachable(&mut self, error: &ClientError) -> Next {
        tracing::debug!(%error, "cache manager not reachable");
        Next::Retry
    }

    fn between(&mut self) -> Next {
        // Requests sent while disconnected are dropped: their callers already got None.
        while self.out_rx.try_recv().is_ok() {}
        if self.shared.orders.is_closed() {
            Next::Stop
        } else {
            Next::Retry
        }
    }
}

type Reader = FrameReader<tokio::io::ReadHalf<mlxcel_ipc::socket::LocalStream>>;
type Writer = FrameWriter<tokio::io::WriteHalf<mlxcel_ipc::socket::LocalStream>>;

/// One registered connection, until it fails. The write half gets a task of its own (a write
/// must not wait behind a read); this loop reads the manager's messages and forwards the
/// engine's requests.
async fn session(
    config: &CacheClientConfig,
    reader: Reader,
    mut writer: Writer,
    out_rx: &mut mpsc::UnboundedReceiver<DaemonToCache>,
    shared: &Shared,
) {
    // One writer: requests from the engine and acknowledgements of orders share it.
    let (to_manager, mut to_write) = mpsc::unbounded_channel::<DaemonToCache>();
    let writer_task = tokio::spawn(async move {
        while let Some(m) = to_write.recv().await {
            if writer.write_frame(&m).await.is_err() {
                return;
            }
        }
    });
    // Frame reads are cancel-safe, so the loop below reads the socket itself; half a frame
    // followed by silence ends the session after the frame deadline.
    let mut reader = reader.with_frame_deadline(FRAME_DEADLINE);
    let register = DaemonToCache::Register {
        call: 0,
        geometry: config.geometry.clone(),
    };
    if to_manager.send(register).is_ok() {
        let mut check = tokio::time::interval(config.donation_timeout.min(DONATION_CHECK) / 2);
        loop {
            tokio::select! {
                msg = out_rx.recv() => match msg {
                    Some(m) => if to_manager.send(m).is_err() { break },
                    None => break,
                },
                frame = reader.read_frame::<CacheToDaemon>() => match frame {
                    Ok(Some(m)) => if !handle(m, shared, &to_manager).await { break },
                    Ok(None) => break,
                    Err(e) if e.is_recoverable() => {
                        tracing::warn!(error = %e, "bad frame from the cache manager")
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cache manager connection failed");
                        break;
                    }
                },
                _ = check.tick() => if donation_overdue(shared, config.donation_timeout) { break },
            }
        }
    }
    writer_task.abort();
}

/// How often, at most, unanswered donations are looked at.
const DONATION_CHECK: Duration = Duration::from_secs(1);

/// Whether a donation has waited longer than `limit` (the manager is hung or lost).
fn donation_overdue(shared: &Shared, limit: Duration) -> bool {
    let oldest = shared
        .donations
        .lock()
        .ok()
        .and_then(|d| d.values().map(|(_, sent)| *sent).min());
    let overdue = oldest.is_some_and(|sent| sent.elapsed() > limit);
    if overdue {
        tracing::warn!(
            limit_ms = limit.as_millis() as u64,
            "the cache manager left a donation unanswered; treating it as gone"
        );
    }
    overdue
}

/// Handles one message from the manager; false ends the session.
async fn handle(
    msg: CacheToDaemon,
    shared: &Shared,
    ack: &mpsc::UnboundedSender<DaemonToCache>,
) -> bool {
    let Shared {
        pending,
        donations,
        epoch,
        orders,
    } = shared;
    match msg {
        CacheToDaemon::Registered {
            epoch: e,
            block_bytes,
            hash_key,
            ..
        } => {
            let registration = Registration { epoch: e, hash_key };
            tracing::info!(
                epoch = e.0,
                block_bytes,
                "registered with the cache manager"
            );
            let _ = orders.send(ManagerOrder::Registered(registration));
            let _ = epoch.send(Some(registration));
        }
        CacheToDaemon::Error {
            call: Some(0),
            error,
        } => {
            tracing::error!(%error, "the cache manager refused our registration");
            return false;
        }
        CacheToDaemon::Release { release, blocks } => {
            let (done, applied) = oneshot::channel();
            if orders.send(ManagerOrder::Release { blocks, done }).is_err() {
                return false;
            }
            // In order: the next message is read only once this release is applied.
            if applied.await.is_err() {
                return false;
            }
            return ack
                .send(DaemonToCache::ReleaseAck {
                    release: ReleaseId(release.0),
                })
                .is_ok();
        }
        CacheToDaemon::InventoryRequest { inventory } => {
            let (reply, report) = oneshot::channel();
            if orders.send(ManagerOrder::Inventory { reply }).is_err() {
                return false;
            }
            let Ok(report) = report.await else {
                return false;
            };
            return ack
                .send(DaemonToCache::Inventory { inventory, report })
                .is_ok();
        }
        CacheToDaemon::Donated { call, outcome }
            if donations.lock().is_ok_and(|d| d.contains_key(&call)) =>
        {
            let tag = donations
                .lock()
                .ok()
                .and_then(|mut d| d.remove(&call))
                .map(|(tag, _)| tag);
            if let Some(tag) = tag {
                return orders.send(ManagerOrder::Donated { tag, outcome }).is_ok();
            }
        }
        reply => {
            let call = match &reply {
                CacheToDaemon::Acquired { call, .. }
                | CacheToDaemon::Donated { call, .. }
                | CacheToDaemon::Reclaimed { call, .. } => Some(*call),
                CacheToDaemon::Error { call, .. } => *call,
                _ => None,
            };
            let waiter = call.and_then(|c| pending.lock().ok().and_then(|mut p| p.remove(&c)));
            let unclaimed = match waiter {
                Some(w) => w.send(reply).err(),
                None => Some(reply),
            };
            // Nobody waits any more (its deadline passed): end the lease it granted at once.
            if let Some(CacheToDaemon::Acquired {
                lease: Some(lease), ..
            }) = unclaimed
            {
                tracing::debug!(lease = lease.0, "late acquire reply; unleasing");
                return ack.send(DaemonToCache::Unlease { lease }).is_ok();
            }
        }
    }
    true
}
