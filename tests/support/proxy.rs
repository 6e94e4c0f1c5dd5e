//! A TCP proxy in front of the API server that a test can break in two ways while the cluster
//! itself, and the test's own client, carry on:
//!
//! - **cut**: a network partition. Open connections are torn down and new ones closed at once.
//! - **stall**: the connections open at that moment stop delivering what the server sends,
//!   without any error, until the client sends on them again. The daemon's watches (one HTTP/1.1
//!   connection each, on which the client never sends after its request) go silent, as watches
//!   on a wedged API server replica do, while every new request works: an idle pooled
//!   connection is released by the request the client sends on it.
//!
//! TLS passes through untouched; the API server's certificate names 127.0.0.1, which is where
//! the proxy listens, so clients verify it as usual.

use std::sync::{Arc, Mutex, Weak};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One proxied connection's "held" switch: while true, bytes from the server wait.
type Held = watch::Sender<bool>;

pub struct Proxy {
    port: u16,
    /// `true` while cut.
    cut: watch::Sender<bool>,
    connections: Arc<Mutex<Vec<Weak<Held>>>>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Forwards 127.0.0.1:<port> to `upstream` ("127.0.0.1:6443").
    pub async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let (cut, cut_rx) = watch::channel(false);
        let connections: Arc<Mutex<Vec<Weak<Held>>>> = Arc::default();
        let registry = connections.clone();
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
                let held = Arc::new(watch::channel(false).0);
                {
                    let mut open = registry.lock().unwrap_or_else(|e| e.into_inner());
                    open.retain(|c| c.strong_count() > 0);
                    open.push(Arc::downgrade(&held));
                }
                tokio::spawn(forward(client, upstream.clone(), held, cut_rx.clone()));
            }
        });
        Proxy {
            port,
            cut,
            connections,
            task,
        }
    }

    /// The URL clients should use instead of the API server's.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
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
            connection.send_replace(held);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Open connections end with their forwarding tasks once the cut fires.
        self.cut.send_replace(true);
        self.task.abort();
    }
}

/// Copies both ways until either side closes or the proxy is cut.
async fn forward(
    client: TcpStream,
    upstream: String,
    held: Arc<Held>,
    mut cut: watch::Receiver<bool>,
) {
    let Ok(server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream_held = held.clone();
    let up = async move {
        let mut buf = vec![0; 16 * 1024];
        loop {
            let n = client_read.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            // The client speaks on this connection: a new request, not a silent watch.
            upstream_held.send_replace(false);
            if server_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let mut released = held.subscribe();
    let down = async move {
        let mut buf = vec![0; 16 * 1024];
        loop {
            let n = server_read.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            if released.wait_for(|held| !*held).await.is_err() {
                return;
            }
            if client_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
        _ = cut.wait_for(|cut| *cut) => {}
    }
}
