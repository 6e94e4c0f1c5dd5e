//! A process's own HTTP endpoints, read over loopback: a free port to serve them on, a plain
//! GET, and the Prometheus text exposition they serve. The tests and the benchmark read them.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A plain HTTP/1.0 GET to 127.0.0.1:`port` (HTTP/1.0, so the body is never chunked; no HTTP
/// client crate needed for a few endpoints): the status and the body. A refused connection, or
/// one that does not connect within 2 s or answer within 30 s, reads as status 0.
pub async fn http_get(port: u16, path: &str) -> (u16, String) {
    let connect = tokio::net::TcpStream::connect(("127.0.0.1", port));
    let Ok(Ok(mut stream)) = tokio::time::timeout(Duration::from_secs(2), connect).await else {
        return (0, String::new());
    };
    let request = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return (0, String::new());
    }
    let mut response = Vec::new();
    // A response cut short (an error, or no end within 30 s) is read as far as it came.
    let read = stream.read_to_end(&mut response);
    let _ = tokio::time::timeout(Duration::from_secs(30), read).await;
    let response = String::from_utf8_lossy(&response);
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The sum of the samples of metric `name` whose labels include every `key="value"` of `labels`
/// (as printed, comma-separated; `""` sums every sample), or 0 when there is none: counters appear
/// only once incremented. Label values here are enums and namespaces, which hold no comma.
pub fn metric(text: &str, name: &str, labels: &str) -> f64 {
    let wanted: Vec<&str> = labels.split(',').filter(|l| !l.is_empty()).collect();
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.rsplit_once(' ')?;
            let (series, present) = match key.split_once('{') {
                Some((series, rest)) => (series, rest.strip_suffix('}')?),
                None => (key, ""),
            };
            let present: Vec<&str> = present.split(',').collect();
            (series == name && wanted.iter().all(|l| present.contains(l)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// The sum of every sample of metric `name`, whatever its labels.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    metric(text, name, "")
}
