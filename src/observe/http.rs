//! The HTTP endpoint: `/metrics` (OpenMetrics text when asked for, as Prometheus does, else the
//! Prometheus text format), `/healthz` (the daemon is not stuck: its watch loop turns) and
//! `/readyz` (started, and every watch has synced once: kubert's rule, so an API-server outage
//! takes no replica out of its Service nor restarts it; the daemon waits it out with its caches
//! and its body says so). Optionally
//! `/metrics` over HTTPS on an address of its own, for callers the API server authenticates
//! and authorises ([`access`](super::access)), as kubebuilder's controllers serve it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::contract::OwnerKind;
use crate::observe::access::{Access, Gate};

/// How long the watch loop may go without turning before `/healthz` calls the daemon stuck. It
/// turns on every watch event and at least every [`BEAT_EVERY`]; each of its steps is bounded
/// (the reachability probe waits 5 s at most), so a minute without a turn is a wedged daemon,
/// which a restart cures, and never an unreachable API server, which it would not.
pub const STUCK_AFTER: Duration = Duration::from_secs(60);

/// How often the watch loop turns when no event comes.
pub const BEAT_EVERY: Duration = Duration::from_secs(10);

/// What the probes report, set by the controller.
#[derive(Debug, Default)]
pub struct Health {
    synced: AtomicBool,
    leader: AtomicBool,
    /// The watches cannot connect to the API server: the caches are going stale. Told in
    /// `/readyz`'s body, without making it fail.
    unreachable: AtomicBool,
    /// When the watch loop last turned; `None` before its first turn.
    beat: Mutex<Option<Instant>>,
    /// What `/readyz` tells of each owner kind not read where workspace-gc expects it
    /// (`cluster::served`).
    kinds: Mutex<BTreeMap<OwnerKind, String>>,
}

impl Health {
    pub fn set_synced(&self) {
        self.synced.store(true, Ordering::Relaxed);
    }

    pub fn set_unreachable(&self, unreachable: bool) {
        self.unreachable.store(unreachable, Ordering::Relaxed);
    }

    pub fn is_unreachable(&self) -> bool {
        self.unreachable.load(Ordering::Relaxed)
    }

    /// What `/readyz` answers 200 to: every watch has synced once. It stays true for the
    /// process's life (kubert's rule): a replica that lost its API server still has its caches,
    /// and dropping every replica out of its Service at once would only block node drains.
    pub fn is_ready(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// The watch loop turned.
    pub fn beat(&self) {
        *self.beat.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// How long the watch loop has not turned, when longer than [`STUCK_AFTER`] at `now`.
    fn stuck_for(&self, now: Instant) -> Option<Duration> {
        let beat = *self.beat.lock().unwrap_or_else(|e| e.into_inner());
        beat.map(|beat| now.saturating_duration_since(beat))
            .filter(|since| *since > STUCK_AFTER)
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.store(leader, Ordering::Relaxed);
    }

    /// What to tell of an owner kind's serving; `None` once it is read where expected.
    pub fn set_kind_note(&self, kind: OwnerKind, note: Option<String>) {
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        match note {
            Some(note) => kinds.insert(kind, note),
            None => kinds.remove(&kind),
        };
    }

    /// The notes on the owner kinds, a line each.
    fn kind_notes(&self) -> String {
        let kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        kinds.values().map(|note| format!("{note}\n")).collect()
    }
}

struct Shared {
    registry: Registry,
    health: Arc<Health>,
}

/// The HTTPS `/metrics`: where, with which certificate, and who may read it.
pub struct Secure {
    pub addr: SocketAddr,
    pub tls: Arc<rustls::ServerConfig>,
    pub gate: Gate,
}

/// Why the serving certificate cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {file}: {source}")]
    Read {
        file: String,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{file} holds no certificate")]
    NoCertificate { file: String },
    #[error("the certificate and key do not make a TLS server: {0}")]
    Config(#[from] rustls::Error),
}

/// A TLS server configuration (HTTP/1.1) from a PEM certificate chain and key, which it reads
/// again when they change.
pub fn tls_config(cert_file: &Path, key_file: &Path) -> Result<rustls::ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let files = (cert_file.to_owned(), key_file.to_owned());
    let key = load_certificate(&files, &provider)?;
    let resolver = Reloading {
        state: Mutex::new(Loaded {
            key: Arc::new(key),
            stamp: stamp(&files),
            checked: Instant::now(),
        }),
        files,
        provider: provider.clone(),
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// How often the files are checked for a renewal: OpenShift's service CA renews the Secret,
/// and the kubelet swaps the mounted files, while the daemon runs.
const RELOAD_CHECK: Duration = Duration::from_secs(10);

/// The certificate chain and key files.
type Files = (PathBuf, PathBuf);

/// The files' modification times: a renewal changes them.
type Stamp = (Option<SystemTime>, Option<SystemTime>);

fn stamp((cert, key): &Files) -> Stamp {
    let modified = |file: &Path| std::fs::metadata(file).and_then(|m| m.modified()).ok();
    (modified(cert), modified(key))
}

fn load_certificate(
    (cert_file, key_file): &Files,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let read = |file: &Path| {
        let file = file.display().to_string();
        move |source| TlsError::Read { file, source }
    };
    let chain = CertificateDer::pem_file_iter(cert_file)
        .map_err(read(cert_file))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read(cert_file))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            file: cert_file.display().to_string(),
        });
    }
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(read(key_file))?;
    Ok(CertifiedKey::from_der(chain, key, provider)?)
}

/// Serves the certificate last loaded, loading it again when the files change; a renewal that
/// cannot be used (half-written, mismatched) keeps the previous one and is retried.
#[derive(Debug)]
struct Reloading {
    files: Files,
    provider: Arc<rustls::crypto::CryptoProvider>,
    state: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    stamp: Stamp,
    checked: Instant,
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.checked.elapsed() >= RELOAD_CHECK {
            state.checked = Instant::now();
            let stamp = stamp(&self.files);
            if stamp != state.stamp {
                match load_certificate(&self.files, &self.provider) {
                    Ok(key) => {
                        info!("loaded the renewed serving certificate");
                        state.key = Arc::new(key);
                        state.stamp = stamp;
                    }
                    Err(error) => {
                        warn!(%error, "the renewed serving certificate cannot be used yet; serving the previous one");
                    }
                }
            }
        }
        Some(state.key.clone())
    }
}

/// Binds `addr` (so a port in use fails start-up), and `secure.addr` when given, and serves
/// until `stop` is cancelled.
pub async fn serve(
    addr: SocketAddr,
    secure: Option<Secure>,
    registry: Registry,
    health: Arc<Health>,
    stop: CancellationToken,
) -> Result<JoinHandle<()>, (SocketAddr, std::io::Error)> {
    let bind = |addr: SocketAddr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|error| (addr, error))
    };
    let listener = bind(addr).await?;
    info!(%addr, "serving /metrics, /healthz and /readyz");
    let secure_listener = match &secure {
        Some(secure) => {
            let listener = bind(secure.addr).await?;
            info!(addr = %secure.addr, "serving /metrics over HTTPS, to authorised callers");
            Some(listener)
        }
        None => None,
    };
    let shared = Arc::new(Shared { registry, health });
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(alive))
        .route("/readyz", get(ready))
        .with_state(shared.clone());
    let secure_task = secure.zip(secure_listener).map(|(secure, listener)| {
        let acceptor = tokio_rustls::TlsAcceptor::from(secure.tls);
        let app = Router::new()
            .route("/metrics", get(secure_metrics))
            .with_state(Arc::new(Guarded {
                shared,
                gate: secure.gate,
            }));
        tokio::spawn(serve_tls(listener, acceptor, app, stop.clone()))
    });
    Ok(tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(error) = served {
            warn!(%error, "the HTTP server failed");
        }
        if let Some(task) = secure_task {
            let _ = task.await;
        }
    }))
}

/// A handshake that takes longer is dropped, so a silent client holds nothing for long.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts TLS connections until `stop`; each is handshaken and served on a task of its own.
async fn serve_tls(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    app: Router,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(connection) => connection,
            Err(error) => {
                // Out of file descriptors, typically: wait instead of spinning.
                warn!(%error, "HTTPS accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (acceptor, app, stop) = (acceptor.clone(), app.clone(), stop.clone());
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => return debug!(%peer, %error, "TLS handshake failed"),
                Err(_) => return debug!(%peer, "TLS handshake timed out"),
            };
            let service = hyper_util::service::TowerToHyperService::new(app);
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service);
            tokio::select! {
                served = connection => if let Err(error) = served {
                    debug!(%peer, %error, "HTTPS connection ended");
                },
                _ = stop.cancelled() => {}
            }
        });
    }
}

struct Guarded {
    shared: Arc<Shared>,
    gate: Gate,
}

/// `/metrics` to a caller the API server authenticates (TokenReview) and allows to `get`
/// `/metrics` (SubjectAccessReview).
async fn secure_metrics(headers: HeaderMap, State(guarded): State<Arc<Guarded>>) -> Response {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    match guarded.gate.check(authorization).await {
        Access::Allowed => render_metrics(&headers, &guarded.shared),
        Access::Unauthenticated => (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response(),
        Access::Forbidden => (StatusCode::FORBIDDEN, "Forbidden\n").into_response(),
        Access::Unknown(error) => {
            warn!(%error, "cannot tell whether a /metrics caller may read it");
            (StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error\n").into_response()
        }
    }
}

async fn metrics(headers: HeaderMap, State(shared): State<Arc<Shared>>) -> Response {
    render_metrics(&headers, &shared)
}

fn render_metrics(headers: &HeaderMap, shared: &Shared) -> Response {
    let mut body = String::new();
    if encode(&mut body, &shared.registry).is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    // Negotiated as Prometheus' own client libraries do: OpenMetrics only for a client that
    // lists it (Prometheus does), the older text format for anyone else.
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|value| value.contains("application/openmetrics-text"));
    let (content_type, body) = if openmetrics {
        (
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            body,
        )
    } else {
        (
            "text/plain; version=0.0.4; charset=utf-8",
            crate::observe::metrics::classic_text(&body),
        )
    };
    (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// 200 unless the watch loop has not turned for [`STUCK_AFTER`].
async fn alive(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    liveness(&shared.health, Instant::now())
}

fn liveness(health: &Health, now: Instant) -> (StatusCode, String) {
    match health.stuck_for(now) {
        Some(since) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "stuck: the watch loop has not turned for {} s\n",
                since.as_secs()
            ),
        ),
        None => (StatusCode::OK, "ok\n".to_owned()),
    }
}

/// 200 or 503 by [`Health::is_ready`]; the body also names each owner kind not read where
/// expected. A kind whose facts are unknown leaves the daemon ready: it keeps what that kind
/// could protect and decides every other claim.
async fn ready(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let health = &shared.health;
    let (status, said) = readiness(health);
    (status, format!("{said}{}", health.kind_notes()))
}

fn readiness(health: &Health) -> (StatusCode, String) {
    if !health.synced.load(Ordering::Relaxed) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the watches have not all synced yet\n".to_owned(),
        )
    } else {
        let role = if health.leader.load(Ordering::Relaxed) {
            "leader"
        } else {
            "standby"
        };
        let outage = if health.is_unreachable() {
            "; the API server cannot be reached, the watches are retrying"
        } else {
            ""
        };
        (StatusCode::OK, format!("ready ({role}){outage}\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_synced_whatever_the_api_server_does() {
        let health = Health::default();
        assert_eq!(readiness(&health).0, StatusCode::SERVICE_UNAVAILABLE);
        health.set_synced();
        assert_eq!(
            readiness(&health),
            (StatusCode::OK, "ready (standby)\n".to_owned())
        );
        health.set_unreachable(true);
        let (status, body) = readiness(&health);
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("cannot be reached"), "{body}");
        health.set_unreachable(false);
        assert_eq!(readiness(&health).1, "ready (standby)\n");
    }

    #[test]
    fn alive_until_the_watch_loop_stops_turning() {
        let health = Health::default();
        let now = Instant::now();
        // Before its first turn the loop is starting, not stuck.
        assert_eq!(liveness(&health, now + STUCK_AFTER * 2).0, StatusCode::OK);
        // Taken just before the beat, so the beat is no earlier.
        let beat = Instant::now();
        health.beat();
        assert_eq!(liveness(&health, beat + STUCK_AFTER).0, StatusCode::OK);
        let (status, body) = liveness(&health, beat + STUCK_AFTER + Duration::from_secs(5));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.starts_with("stuck"), "{body}");
        // An unreachable API server is not a stuck daemon: the loop keeps turning.
        health.set_unreachable(true);
        health.beat();
        assert_eq!(liveness(&health, Instant::now()).0, StatusCode::OK);
    }
}
