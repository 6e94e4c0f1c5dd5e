//! The HTTP endpoint: `/metrics` (OpenMetrics text when asked for, as Prometheus does, else the
//! Prometheus text format), `/healthz` (the process is alive) and
//! `/readyz` (every watch has synced once, and the API server can be reached).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// What the probes report, set by the controller.
#[derive(Debug, Default)]
pub struct Health {
    synced: AtomicBool,
    leader: AtomicBool,
    /// The watches cannot connect to the API server: the caches are going stale.
    unreachable: AtomicBool,
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

    /// What `/readyz` answers 200 to.
    pub fn is_ready(&self) -> bool {
        self.synced.load(Ordering::Relaxed) && !self.is_unreachable()
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.store(leader, Ordering::Relaxed);
    }
}

struct Shared {
    registry: Registry,
    health: Arc<Health>,
}

/// Binds `addr` (so a port in use fails start-up) and serves until `stop` is cancelled.
pub async fn serve(
    addr: SocketAddr,
    registry: Registry,
    health: Arc<Health>,
    stop: CancellationToken,
) -> std::io::Result<JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    info!(addr = %listener.local_addr()?, "serving /metrics, /healthz and /readyz");
    let shared = Arc::new(Shared { registry, health });
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(shared);
    Ok(tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(error) = served {
            warn!(%error, "the HTTP server failed");
        }
    }))
}

async fn metrics(headers: HeaderMap, State(shared): State<Arc<Shared>>) -> impl IntoResponse {
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

async fn ready(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let health = &shared.health;
    if !health.synced.load(Ordering::Relaxed) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the watches have not all synced yet\n".to_owned(),
        )
    } else if health.is_unreachable() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the API server cannot be reached; the watches are retrying\n".to_owned(),
        )
    } else {
        let role = if health.leader.load(Ordering::Relaxed) {
            "leader"
        } else {
            "standby"
        };
        (StatusCode::OK, format!("ready ({role})\n"))
    }
}
