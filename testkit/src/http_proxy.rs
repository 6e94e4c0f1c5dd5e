//! The HTTP side of [`super::Proxy::http`]: what a request is (verb, resource, user, as the API
//! server's authorizer sees it), the fault rules a test sets, and the exchange of one request
//! with the API server.
//!
//! The proxy terminates TLS with the API server's own serving certificate (it names 127.0.0.1)
//! and forwards over TLS trusting the cluster CA, the `Authorization` header untouched. So it
//! carries bearer-token identities (ServiceAccounts, as the daemon in the fault tests), not
//! client certificates: the admin kubeconfig must not go through it.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::AuditEvent;

/// A request as the API server's authorizer names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`; for a
    /// path that names no resource (`/version`, `/readyz`), the method in lower case.
    pub verb: String,
    /// Plural resource (`persistentvolumeclaims`, `leases`); empty for a non-resource path.
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// The username of a bearer token that is a JWT (a ServiceAccount token's `sub`, e.g.
    /// `system:serviceaccount:ns:name`); `None` for any other credentials.
    pub user: Option<String>,
}

impl RequestInfo {
    /// Classifies a request from its method, path (with query) and `Authorization` header.
    pub fn of(method: &Method, path_and_query: &str, authorization: Option<&str>) -> Self {
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        // /api/v1/... or /apis/group/version/...: what follows names the resource.
        let rest = match segments.first() {
            Some(&"api") => segments.get(2..),
            Some(&"apis") => segments.get(3..),
            _ => None,
        }
        .unwrap_or_default();
        let at = |i: usize| rest.get(i).copied().unwrap_or_default().to_owned();
        let (namespace, resource, name, subresource) = match rest {
            ["namespaces", _, _, ..] => (at(1), at(2), at(3), at(4)),
            ["namespaces", ..] => (String::new(), at(0), at(1), at(2)),
            _ => (String::new(), at(0), at(1), at(2)),
        };
        let watch = query
            .split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1");
        let verb = if resource.is_empty() {
            method.as_str().to_lowercase()
        } else {
            match (method, name.is_empty()) {
                (&Method::GET, _) if watch => "watch",
                (&Method::GET, false) => "get",
                (&Method::GET, true) => "list",
                (&Method::POST, _) => "create",
                (&Method::PUT, _) => "update",
                (&Method::PATCH, _) => "patch",
                (&Method::DELETE, false) => "delete",
                (&Method::DELETE, true) => "deletecollection",
                (other, _) => return Self::unusual(other, resource, namespace, name),
            }
            .to_owned()
        };
        RequestInfo {
            verb,
            resource,
            subresource,
            namespace,
            name,
            user: authorization.and_then(token_user),
        }
    }

    fn unusual(method: &Method, resource: String, namespace: String, name: String) -> Self {
        RequestInfo {
            verb: method.as_str().to_lowercase(),
            resource,
            namespace,
            name,
            ..RequestInfo::default()
        }
    }
}

/// The `sub` of a bearer JWT, read without verifying it: the API server verifies it.
fn token_user(authorization: &str) -> Option<String> {
    let token = authorization.strip_prefix("Bearer ")?;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: Value = serde_json::from_slice(&bytes).ok()?;
    Some(claims["sub"].as_str()?.to_owned())
}

/// The username of ServiceAccount `namespace/name`, as tokens and the audit log name it.
pub fn service_account(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// What the proxy does to a request a rule matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answers itself with this status (429, 503, 504, ...) and a Kubernetes `Status` body,
    /// with `Retry-After` when given; the API server never sees the request.
    Refuse {
        status: u16,
        retry_after: Option<u64>,
    },
    /// Sends the request on after this long: the server receives (and executes) it late.
    DelayRequest(Duration),
    /// Forwards at once and holds the response this long: the client learns late (a slow
    /// LIST is an old snapshot by the time it arrives).
    DelayResponse(Duration),
    /// Forwards at once and holds the response until the rule is removed or cleared.
    Stall,
    /// Closes the connection without forwarding: the server never sees it.
    Reset,
    /// Forwards, then closes the connection instead of answering: executed, but the client
    /// never hears how.
    LoseResponse,
    /// Forwards at once and moves the answer's `Date` header ahead by this much: another API
    /// server behind the same address (a load balancer) whose clock runs ahead.
    DateAhead(Duration),
    /// Holds the request until the rule is removed or cleared, then forwards it whatever
    /// became of the client (gone, as an L7 load balancer serves a request whose client left);
    /// the API server's answer is recorded ([`super::Proxy::forwarded`]) and passed on if the
    /// client still waits.
    HoldAndForward,
}

impl Fault {
    /// 429 Too Many Requests with `Retry-After`, as API Priority and Fairness answers.
    pub fn throttle(retry_after: u64) -> Fault {
        Fault::Refuse {
            status: 429,
            retry_after: Some(retry_after),
        }
    }

    /// 503 Service Unavailable without `Retry-After`, answered by the hop itself: the API
    /// server never saw the request, though the answer does not say so.
    pub fn unavailable() -> Fault {
        Fault::Refuse {
            status: 503,
            retry_after: None,
        }
    }

    /// Whether the request never reached the API server.
    pub fn refuses(&self) -> bool {
        matches!(self, Fault::Refuse { .. } | Fault::Reset)
    }
}

/// Which requests a fault applies to. Empty strings and `None` match anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// A verb as [`RequestInfo::verb`] names it, or "" for any.
    pub verb: &'static str,
    /// A plural resource, or "" for any.
    pub resource: &'static str,
    /// A username (see [`service_account`]).
    pub user: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// Applies to this many requests, then no more; `None`: until removed.
    pub times: Option<u64>,
    pub fault: Fault,
}

impl Rule {
    pub fn new(verb: &'static str, resource: &'static str, fault: Fault) -> Rule {
        Rule {
            verb,
            resource,
            user: None,
            namespace: None,
            name: None,
            times: None,
            fault,
        }
    }

    pub fn user(mut self, user: impl Into<String>) -> Rule {
        self.user = Some(user.into());
        self
    }

    pub fn namespace(mut self, namespace: impl Into<String>) -> Rule {
        self.namespace = Some(namespace.into());
        self
    }

    pub fn name(mut self, name: impl Into<String>) -> Rule {
        self.name = Some(name.into());
        self
    }

    pub fn times(mut self, times: u64) -> Rule {
        self.times = Some(times);
        self
    }

    /// Whether the rule names this request (its `times` aside).
    pub fn matches(&self, request: &RequestInfo) -> bool {
        let field = |want: &str, got: &str| want.is_empty() || want == got;
        let optional = |want: &Option<String>, got: Option<&str>| {
            want.as_deref().is_none_or(|w| Some(w) == got)
        };
        field(self.verb, &request.verb)
            && field(self.resource, &request.resource)
            && optional(&self.user, request.user.as_deref())
            && optional(&self.namespace, Some(&request.namespace))
            && optional(&self.name, Some(&request.name))
    }
}

/// A rule's handle, to remove it or count what it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleId(u64);

/// A held request, as the API server answered it once forwarded.
#[derive(Debug, Clone)]
pub struct Forwarded {
    /// When the API server answered it.
    pub at: DateTime<Utc>,
    pub request: RequestInfo,
    /// Its status code; 0 when the API server could not be reached.
    pub status: u16,
}

/// One request a rule applied to.
#[derive(Debug, Clone)]
pub struct Faulted {
    /// When the proxy received it (the same host's clock as the API server's).
    pub at: DateTime<Utc>,
    pub request: RequestInfo,
    /// A DELETE's preconditions `(uid, resourceVersion)`, from its body.
    pub preconditions: (Option<String>, Option<String>),
    pub fault: Fault,
}

impl Faulted {
    /// The request as the audit log would have recorded it had the proxy let it through:
    /// refused attempts count in the at-most-once check. The status is the one the proxy
    /// answered (0 for a reset).
    pub fn as_audit_event(&self) -> AuditEvent {
        let code = match self.fault {
            Fault::Refuse { status, .. } => i64::from(status),
            _ => 0,
        };
        AuditEvent {
            audit_id: String::new(),
            stage: "ResponseComplete".into(),
            user: self.request.user.clone().unwrap_or_default(),
            agent: String::new(),
            verb: self.request.verb.clone(),
            resource: self.request.resource.clone(),
            subresource: String::new(),
            namespace: self.request.namespace.clone(),
            name: self.request.name.clone(),
            uri: String::new(),
            uid: self.preconditions.0.clone(),
            resource_version: self.preconditions.1.clone(),
            code,
            at: self.at,
            completed: self.at,
            request: Value::Null,
        }
    }
}

struct Entry {
    id: RuleId,
    rule: Rule,
    hits: Arc<AtomicU64>,
}

/// The rules in force, first match wins; a change wakes the requests a [`Fault::Stall`] holds.
#[derive(Default)]
pub(super) struct Rules {
    entries: Mutex<Vec<Entry>>,
    next: AtomicU64,
    /// Requests a rule answered itself or reset before the server saw them.
    refused: AtomicU64,
    faulted: Mutex<Vec<Faulted>>,
    forwarded: Mutex<Vec<Forwarded>>,
    changed: watch::Sender<u64>,
}

impl Rules {
    pub(super) fn add(&self, rule: Rule) -> RuleId {
        let id = RuleId(self.next.fetch_add(1, Ordering::Relaxed));
        let hits = Arc::default();
        lock(&self.entries).push(Entry { id, rule, hits });
        self.changed.send_modify(|n| *n += 1);
        id
    }

    pub(super) fn remove(&self, id: RuleId) {
        lock(&self.entries).retain(|e| e.id != id);
        self.changed.send_modify(|n| *n += 1);
    }

    pub(super) fn clear(&self) {
        lock(&self.entries).clear();
        self.changed.send_modify(|n| *n += 1);
    }

    /// How many requests the rule applied to (0 once removed).
    pub(super) fn hits(&self, id: RuleId) -> u64 {
        lock(&self.entries)
            .iter()
            .find(|e| e.id == id)
            .map_or(0, |e| e.hits.load(Ordering::Relaxed))
    }

    pub(super) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    pub(super) fn faulted(&self) -> Vec<Faulted> {
        lock(&self.faulted).clone()
    }

    pub(super) fn forwarded(&self) -> Vec<Forwarded> {
        lock(&self.forwarded).clone()
    }

    /// The first rule with uses left that matches, counted as used.
    pub(super) fn apply(&self, request: &RequestInfo) -> Option<(RuleId, Fault)> {
        let entries = lock(&self.entries);
        let entry = entries.iter().find(|e| {
            e.rule.matches(request)
                && e.rule
                    .times
                    .is_none_or(|times| e.hits.load(Ordering::Relaxed) < times)
        })?;
        entry.hits.fetch_add(1, Ordering::Relaxed);
        Some((entry.id, entry.rule.fault.clone()))
    }

    fn record(&self, faulted: Faulted) {
        if faulted.fault.refuses() {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        lock(&self.faulted).push(faulted);
    }

    /// Returns once rule `id` is no longer in force.
    async fn removed(&self, id: RuleId) {
        let mut changed = self.changed.subscribe();
        while lock(&self.entries).iter().any(|e| e.id == id) {
            if changed.changed().await.is_err() {
                return;
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the proxy needs to serve one connection: TLS as the API server, a client to it, the
/// rules.
pub(super) struct Interceptor {
    acceptor: TlsAcceptor,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    upstream: String,
    pub(super) rules: Rules,
}

type ProxyBody = Either<Incoming, Full<Bytes>>;

/// The service's error: hyper closes the connection without an answer.
#[derive(Debug)]
struct Reset;

impl std::fmt::Display for Reset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection reset by the fault proxy")
    }
}

impl std::error::Error for Reset {}

impl Interceptor {
    /// Serves as the API server whose certificates are in `pki` (`apiserver.crt`,
    /// `apiserver.key`, `ca.crt`, as scripts/control-plane makes them) at `upstream`.
    pub(super) fn new(pki: &Path, upstream: String) -> Interceptor {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(pki.join("apiserver.crt"))
                .expect("read the API server's certificate")
                .collect::<Result<_, _>>()
                .expect("parse the API server's certificate");
        let key = PrivateKeyDer::from_pem_file(pki.join("apiserver.key"))
            .expect("read the API server's key");
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("the API server's certificate and key");
        // HTTP/1.1 only: one watch per connection, so stalling a connection stalls one stream.
        server.alpn_protocols = vec![b"http/1.1".to_vec()];

        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(pki.join("ca.crt")).expect("read the cluster CA") {
            roots
                .add(ca.expect("parse the cluster CA"))
                .expect("add the cluster CA");
        }
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .build();
        Interceptor {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            client: Client::builder(TokioExecutor::new()).build(connector),
            upstream,
            rules: Rules::default(),
        }
    }

    /// Serves one client connection until it closes.
    pub(super) async fn serve<S>(self: Arc<Self>, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Ok(tls) = self.acceptor.accept(stream).await else {
            return;
        };
        let service = hyper::service::service_fn(move |request| {
            let interceptor = self.clone();
            async move { interceptor.exchange(request).await }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(tls), service)
            .await;
    }

    async fn exchange(
        self: Arc<Self>,
        request: Request<Incoming>,
    ) -> Result<Response<ProxyBody>, Reset> {
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let authorization = request
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let info = RequestInfo::of(request.method(), &path, authorization);
        let (parts, body) = request.into_parts();
        // Requests are small; whole, a DELETE's preconditions can be read from it.
        let body = body.collect().await.map_err(|_| Reset)?.to_bytes();
        let applied = self.rules.apply(&info);
        if let Some((_, fault)) = &applied {
            let preconditions = if info.verb == "delete" {
                let body: Value = serde_json::from_slice(&body).unwrap_or_default();
                let field = |key: &str| body["preconditions"][key].as_str().map(str::to_owned);
                (field("uid"), field("resourceVersion"))
            } else {
                (None, None)
            };
            self.rules.record(Faulted {
                at: Utc::now(),
                request: info.clone(),
                preconditions,
                fault: fault.clone(),
            });
        }
        match &applied {
            Some((
                _,
                Fault::Refuse {
                    status,
                    retry_after,
                },
            )) => {
                return Ok(refusal(*status, *retry_after).map(Either::Right));
            }
            Some((_, Fault::Reset)) => return Err(Reset),
            Some((_, Fault::DelayRequest(delay))) => tokio::time::sleep(*delay).await,
            _ => {}
        }
        let mut upstream = Request::from_parts(parts, Full::new(body));
        *upstream.uri_mut() = format!("https://{}{path}", self.upstream)
            .parse()
            .map_err(|_| Reset)?;
        // An API server that is down looks to the client as it would without the proxy: the
        // connection fails.
        if let Some((id, Fault::HoldAndForward)) = applied {
            // Its own task: dropping this exchange (the client gave up) does not stop it.
            let this = self.clone();
            let held = tokio::spawn(async move {
                this.rules.removed(id).await;
                let response = this.client.request(upstream).await;
                let status = response.as_ref().map_or(0, |r| r.status().as_u16());
                lock(&this.rules.forwarded).push(Forwarded {
                    at: Utc::now(),
                    request: info,
                    status,
                });
                response
            });
            let response = held.await.map_err(|_| Reset)?.map_err(|_| Reset)?;
            return Ok(response.map(Either::Left));
        }
        let response = self.client.request(upstream).await.map_err(|_| Reset)?;
        match applied {
            Some((_, Fault::DelayResponse(delay))) => tokio::time::sleep(delay).await,
            Some((id, Fault::Stall)) => self.rules.removed(id).await,
            Some((_, Fault::LoseResponse)) => return Err(Reset),
            Some((_, Fault::DateAhead(ahead))) => {
                let mut response = response;
                let moved = (response.headers().get(http::header::DATE))
                    .and_then(|date| date.to_str().ok())
                    .and_then(|date| chrono::DateTime::parse_from_rfc2822(date).ok())
                    .map(|date| date.with_timezone(&Utc) + ahead)
                    .map(|date| date.format("%a, %d %b %Y %H:%M:%S GMT").to_string());
                if let Some(value) = moved.and_then(|text| HeaderValue::from_str(&text).ok()) {
                    response.headers_mut().insert(http::header::DATE, value);
                }
                return Ok(response.map(Either::Left));
            }
            _ => {}
        }
        Ok(response.map(Either::Left))
    }
}

/// The answer an overloaded API server gives: a `Status` object with the code's reason.
fn refusal(status: u16, retry_after: Option<u64>) -> Response<Full<Bytes>> {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let reason = match code.as_u16() {
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    };
    let mut body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("refused by the test's fault proxy ({status})"),
        "reason": reason,
        "code": status,
    });
    if let Some(seconds) = retry_after {
        body["details"] = json!({ "retryAfterSeconds": seconds });
    }
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = code;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(seconds) = retry_after {
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}
