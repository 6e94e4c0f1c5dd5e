//! A proxy in front of the API server that a test can break while the cluster itself, and the
//! test's own client, carry on. Two modes share one connection layer:
//!
//! - [`Proxy::start`]: TCP pass-through, TLS untouched; the API server's certificate names
//!   127.0.0.1, which is where the proxy listens, so clients verify it as usual.
//! - [`Proxy::http`]: terminates TLS with the API server's own certificate, sees each request
//!   (verb, resource, user) and applies the fault rules a test sets at run time: refusals
//!   (429 with `Retry-After`, 503, 504), delays, stalls, resets (see `http_proxy.rs`).
//!
//! Either mode breaks whole connections in two ways:
//!
//! - **cut**: a network partition. Open connections are torn down and new ones closed at once.
//! - **stall**: the connections open at that moment stop delivering what the server sends,
//!   without any error, until the client sends on them again. The daemon's watches (one HTTP/1.1
//!   connection each, on which the client never sends after its request) go silent, as watches
//!   on a wedged API server replica do, while every new request works: an idle pooled
//!   connection is released by the request the client sends on it.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::ControlPlane;
use super::http_proxy::{Faulted, Forwarded, Interceptor, Rule, RuleId, Rules};

/// One proxied connection's "held" switch: while set, what goes to the client waits.
#[derive(Default)]
struct Hold {
    held: AtomicBool,
    writer: AtomicWaker,
}

impl Hold {
    fn set(&self, held: bool) {
        self.held.store(held, Ordering::SeqCst);
        if !held {
            self.writer.wake();
        }
    }
}

/// The client's side of a proxied connection, with its [`Hold`].
struct Held {
    stream: TcpStream,
    hold: Arc<Hold>,
}

impl AsyncRead for Held {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(poll, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            // The client speaks on this connection: a new request, not a silent watch.
            this.hold.set(false);
        }
        poll
    }
}

impl AsyncWrite for Held {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.hold.held.load(Ordering::SeqCst) {
            this.hold.writer.register(cx.waker());
            // Released between the check and the registration: go on.
            if this.hold.held.load(Ordering::SeqCst) {
                return Poll::Pending;
            }
        }
        Pin::new(&mut this.stream).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// What a connection carries.
#[derive(Clone)]
enum Mode {
    /// Bytes, to this `host:port`.
    Tcp(String),
    /// HTTP requests, each judged by the rules.
    Http(Arc<Interceptor>),
}

pub struct Proxy {
    port: u16,
    /// `true` while cut.
    cut: watch::Sender<bool>,
    connections: Arc<Mutex<Vec<Weak<Hold>>>>,
    interceptor: Option<Arc<Interceptor>>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Forwards 127.0.0.1:<port> to `upstream` ("127.0.0.1:6443"), TLS untouched.
    pub async fn start(upstream: String) -> Proxy {
        Self::listen(Mode::Tcp(upstream)).await
    }

    /// An HTTP-level proxy to `control_plane`'s API server, with fault rules. Clients must
    /// authenticate with a bearer token (a ServiceAccount kubeconfig), which it passes on.
    pub async fn http(control_plane: &ControlPlane) -> Proxy {
        let pki = control_plane.dir().join("pki");
        let interceptor = Arc::new(Interceptor::new(&pki, control_plane.api_address()));
        Self::listen(Mode::Http(interceptor)).await
    }

    async fn listen(mode: Mode) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let (cut, cut_rx) = watch::channel(false);
        let connections: Arc<Mutex<Vec<Weak<Hold>>>> = Arc::default();
        let registry = connections.clone();
        let interceptor = match &mode {
            Mode::Http(interceptor) => Some(interceptor.clone()),
            Mode::Tcp(_) => None,
        };
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                if *cut_rx.borrow() {
                    // Accept-and-close, as a peer that resets: the client fails at once instead
                    // of waiting for a connect timeout.
                    drop(client);
                    continue;
                }
                let hold = Arc::new(Hold::default());
                {
                    let mut open = registry.lock().unwrap_or_else(|e| e.into_inner());
                    open.retain(|c| c.strong_count() > 0);
                    open.push(Arc::downgrade(&hold));
                }
                let client = Held {
                    stream: client,
                    hold,
                };
                let mut cut = cut_rx.clone();
                let mode = mode.clone();
                tokio::spawn(async move {
                    // The connection ends when either side closes, or with the cut.
                    tokio::select! {
                        () = carry(mode, client) => {}
                        _ = cut.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Proxy {
            port,
            cut,
            connections,
            interceptor,
            task,
        }
    }

    /// The URL clients should use instead of the API server's.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// A copy of `kubeconfig` (one of `control_plane`'s, e.g. a ServiceAccount's) that reaches
    /// the API server through this proxy, next to it.
    pub fn kubeconfig(&self, control_plane: &ControlPlane, kubeconfig: &Path) -> PathBuf {
        let server = control_plane.config().cluster_url.to_string();
        let text = std::fs::read_to_string(kubeconfig)
            .unwrap_or_else(|e| panic!("read {}: {e}", kubeconfig.display()));
        let path = kubeconfig.with_extension(format!("via-{}", self.port));
        std::fs::write(
            &path,
            text.replace(server.trim_end_matches('/'), &self.url()),
        )
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }

    /// Partitions: every open connection is torn down and new ones fail.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Heals the partition.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }

    /// Holds what the server sends on every connection open now, until the client sends on it.
    pub fn stall(&self) {
        self.set_held(true);
    }

    /// Delivers what was held and stops holding.
    pub fn unstall(&self) {
        self.set_held(false);
    }

    fn set_held(&self, held: bool) {
        let open = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        for connection in open.iter().filter_map(Weak::upgrade) {
            connection.set(held);
        }
    }

    /// Applies `rule` to the requests that follow (after the rules added before it: the first
    /// that matches wins). [`Proxy::http`] only.
    pub fn add(&self, rule: Rule) -> RuleId {
        self.rules().add(rule)
    }

    /// Lifts one rule; requests it stalls go on.
    pub fn remove(&self, rule: RuleId) {
        self.rules().remove(rule);
    }

    /// Lifts every rule; stalled requests go on.
    pub fn clear(&self) {
        self.rules().clear();
    }

    /// How many requests `rule` applied to, while it is in force.
    pub fn hits(&self, rule: RuleId) -> u64 {
        self.rules().hits(rule)
    }

    /// How many requests the proxy refused or reset, so that the API server never saw them.
    pub fn refused(&self) -> u64 {
        self.rules().refused()
    }

    /// Every request a rule applied to, in order.
    pub fn faulted(&self) -> Vec<Faulted> {
        self.rules().faulted()
    }

    /// The requests a [`super::Fault::HoldAndForward`] rule held and then forwarded, with the
    /// API server's answers, in the order they were answered.
    pub fn forwarded(&self) -> Vec<Forwarded> {
        self.rules().forwarded()
    }

    fn rules(&self) -> &Rules {
        &self
            .interceptor
            .as_ref()
            .expect("fault rules need a Proxy::http")
            .rules
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Open connections end with their tasks once the cut fires.
        self.cut.send_replace(true);
        self.task.abort();
    }
}

/// Carries one client connection until either side closes.
async fn carry(mode: Mode, mut client: Held) {
    match mode {
        Mode::Tcp(upstream) => {
            let Ok(mut server) = TcpStream::connect(&upstream).await else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        }
        Mode::Http(interceptor) => interceptor.serve(client).await,
    }
}
