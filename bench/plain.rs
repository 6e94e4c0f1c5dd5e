//! The API server's side of ready: the initial lists workspace-gc made, sent again by a plain
//! client right after it was ready. curl, through the daemon's own kubeconfig and over
//! HTTP/1.1 as kube's client, every kind at once as the daemon lists them, each kind's requests
//! one after the other as the daemon sent them. Its output is never decoded: it is counted,
//! and a streamed list's is searched for the bookmark that ends its initial events (its watch
//! is then closed). So its time is what the server needs to serve the lists; the report reads
//! the daemon's ready as a ratio to it.

use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use kube::config::Kubeconfig;
use tokio::io::AsyncReadExt;

use crate::results::{PlainLists, PlainRequest};

/// The user agent the plain client sends: the daemon's credentials are its too, and the last
/// part of it ([`AGENT_NAME`], as the audit log is read) tells its requests from the daemon's.
pub const AGENT: &str = "workspace-gc-bench/plain-list";
pub const AGENT_NAME: &str = "plain-list";

/// What the bookmark that ends a streamed list's initial events carries.
const END_OF_LIST: &[u8] = br#""k8s.io/initial-events-end":"true""#;

/// A request the daemon sent, as the audit log recorded it.
#[derive(Debug, Clone, Copy)]
pub struct Sent<'a> {
    pub verb: &'a str,
    pub resource: &'a str,
    pub uri: &'a str,
    pub code: u16,
}

/// One list to send again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replay {
    /// A watch asking for its initial events, read up to the bookmark that ends them.
    Streamed(String),
    /// A LIST's first page; the pages after it are followed again.
    Paged(String),
}

/// The initial lists among `sent` (the daemon's requests up to ready), once each and in the
/// order sent, by resource: its streamed lists, and the first page of each paged list (a LIST
/// without a continue token). Its watches without initial events (the watch after a paged
/// list) list nothing, and a refused request (a streamed list on a server that does not stream
/// lists answers 422) was not served.
pub fn initial_lists<'a>(sent: impl IntoIterator<Item = Sent<'a>>) -> Vec<(String, Vec<Replay>)> {
    let mut out: Vec<(String, Vec<Replay>)> = Vec::new();
    for s in sent {
        if !(200..300).contains(&s.code) {
            continue;
        }
        let replay = match s.verb {
            "watch" if s.uri.contains("sendInitialEvents=true") => {
                Replay::Streamed(s.uri.to_owned())
            }
            "list" if !s.uri.contains("continue=") => Replay::Paged(s.uri.to_owned()),
            _ => continue,
        };
        match out.iter_mut().find(|(resource, _)| resource == s.resource) {
            Some((_, replays)) if replays.contains(&replay) => {}
            Some((_, replays)) => replays.push(replay),
            None => out.push((s.resource.to_owned(), vec![replay])),
        }
    }
    out
}

/// The continue token of a list page, from its head: the API server writes the list's
/// metadata before its items.
pub fn continue_token(head: &[u8]) -> Option<String> {
    const KEY: &[u8] = br#""continue":""#;
    let at = memchr::memmem::find(head, KEY)? + KEY.len();
    let rest = &head[at..];
    let end = memchr::memchr(b'"', rest)?;
    let token = std::str::from_utf8(&rest[..end]).ok()?;
    (!token.is_empty()).then(|| token.to_owned())
}

/// The page after `uri`: the same request with `continue` set to `token` (base64url, which a
/// query carries as it is).
pub fn next_page(uri: &str, token: &str) -> String {
    let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
    let mut params: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("continue="))
        .collect();
    let next = format!("continue={token}");
    params.push(&next);
    format!("{path}?{}", params.join("&"))
}

/// Finds [`END_OF_LIST`] in a stream read in chunks, across their boundaries.
#[derive(Default)]
pub struct EndSearch {
    /// The last bytes of what was read, too few to hold the marker.
    tail: Vec<u8>,
}

impl EndSearch {
    /// Whether the marker ends in `chunk` (or began in what came before it).
    pub fn found(&mut self, chunk: &[u8]) -> bool {
        let keep = END_OF_LIST.len() - 1;
        let mut seam = std::mem::take(&mut self.tail);
        seam.extend_from_slice(&chunk[..chunk.len().min(keep)]);
        if memchr::memmem::find(&seam, END_OF_LIST).is_some()
            || memchr::memmem::find(chunk, END_OF_LIST).is_some()
        {
            return true;
        }
        let joined = if chunk.len() >= keep {
            chunk
        } else {
            &seam[..]
        };
        self.tail = joined[joined.len().saturating_sub(keep)..].to_vec();
        false
    }
}

/// The server and the files curl authenticates with, from the daemon's kubeconfig.
struct Credentials {
    server: String,
    ca: String,
    cert: String,
    key: String,
}

impl Credentials {
    fn of(kubeconfig: &Path) -> Result<Self> {
        let config = Kubeconfig::read_from(kubeconfig)?;
        let cluster = config.clusters.first().and_then(|c| c.cluster.as_ref());
        let user = config.auth_infos.first().and_then(|u| u.auth_info.as_ref());
        let missing = || {
            anyhow!(
                "{} lacks a server or a client certificate",
                kubeconfig.display()
            )
        };
        Ok(Self {
            server: cluster.and_then(|c| c.server.clone()).ok_or_else(missing)?,
            ca: cluster
                .and_then(|c| c.certificate_authority.clone())
                .ok_or_else(missing)?,
            cert: user
                .and_then(|u| u.client_certificate.clone())
                .ok_or_else(missing)?,
            key: user
                .and_then(|u| u.client_key.clone())
                .ok_or_else(missing)?,
        })
    }
}

/// Sends `lists` again (every resource at once, each one's requests in order) and times them.
pub async fn replay(kubeconfig: &Path, lists: &[(String, Vec<Replay>)]) -> Result<PlainLists> {
    if lists.is_empty() {
        bail!("the audit log holds no initial list of the daemon's");
    }
    let credentials = Credentials::of(kubeconfig)?;
    let started = Instant::now();
    let credentials = &credentials;
    let kinds = lists.iter().map(|(resource, replays)| async move {
        let mut done = Vec::new();
        for replay in replays {
            done.push(send(credentials, resource, replay).await?);
        }
        Ok::<_, anyhow::Error>(done)
    });
    let requests = futures::future::try_join_all(kinds).await?.concat();
    Ok(PlainLists {
        wall_s: started.elapsed().as_secs_f64(),
        requests,
        ..PlainLists::default()
    })
}

/// One list: a streamed one up to its end, or a paged one page after page.
async fn send(credentials: &Credentials, resource: &str, replay: &Replay) -> Result<PlainRequest> {
    let started = Instant::now();
    let (what, bytes) = match replay {
        Replay::Streamed(uri) => {
            let bytes = curl(credentials, uri, true).await?.0;
            (format!("watch {resource} (streamed)"), bytes)
        }
        Replay::Paged(first) => {
            let (mut uri, mut pages, mut bytes) = (first.clone(), 0, 0);
            loop {
                let (read, token) = curl(credentials, &uri, false).await?;
                pages += 1;
                bytes += read;
                match token {
                    Some(token) => uri = next_page(first, &token),
                    None => break,
                }
            }
            let s = if pages == 1 { "" } else { "s" };
            (format!("list {resource} ({pages} page{s})"), bytes)
        }
    };
    Ok(PlainRequest {
        what,
        seconds: started.elapsed().as_secs_f64(),
        bytes,
    })
}

/// GETs `uri`, reading its answer until it ends or, when `streamed`, until the end of its
/// initial events: the bytes read, and a page's continue token.
async fn curl(
    credentials: &Credentials,
    uri: &str,
    streamed: bool,
) -> Result<(u64, Option<String>)> {
    let mut child = tokio::process::Command::new("curl")
        .args([
            "--silent",
            "--show-error",
            "--fail",
            "--http1.1",
            "--no-buffer",
        ])
        .args(["--noproxy", "*", "--user-agent", AGENT])
        .args(["--cacert", &credentials.ca])
        .args(["--cert", &credentials.cert, "--key", &credentials.key])
        .arg(format!("{}{uri}", credentials.server))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("start curl")?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("curl has no stdout"))?;
    let mut buffer = vec![0u8; 1 << 18];
    let (mut bytes, mut head, mut end) = (0u64, Vec::new(), EndSearch::default());
    loop {
        let read = stdout.read(&mut buffer).await?;
        if read == 0 {
            break;
        }
        let chunk = &buffer[..read];
        bytes += read as u64;
        if head.len() < 1 << 16 {
            head.extend_from_slice(chunk);
        }
        if streamed && end.found(chunk) {
            // The watch would go on; its initial events are what was asked.
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Ok((bytes, None));
        }
    }
    let output = child.wait_with_output().await?;
    if !output.status.success() {
        bail!(
            "curl {uri}: {} {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    if streamed {
        bail!("curl {uri}: the stream ended before its initial events did");
    }
    Ok((bytes, continue_token(&head)))
}
