//! The process's wiring: the HTTP server, the election, the watches' feed, the scheduler and
//! the volume sweeper started together, and stopped in order; and what winning or losing the
//! Lease changes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::FusedFuture;
use kube::Client;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cluster::adapter::KubeCluster;
use crate::cluster::in_flight;
use crate::cluster::label_guard;
use crate::cluster::leader::Leadership;
use crate::cluster::live::Snapshots;
use crate::cluster::ports::{Clock, Cluster};
use crate::cluster::served::Served;
use crate::cluster::server_clock::ServerClock;
use crate::cluster::watches;
use crate::cluster::writer::{Mode, Writer};
use crate::config::Config;
use crate::daemon::scheduler::Scheduler;
use crate::decide::facts::ObjectKey;
use crate::observe::access::Gate;
use crate::observe::http::{self, Health};
use crate::observe::metrics::Metrics;

use super::feed::apply_watches;
use super::released::sweep_released;
use super::{Controller, DeletesInFlight};

/// How many claims are reconciled at once. A reconcile mostly waits: on the limiter, on a
/// shared proof round or namespace snapshot (whose LISTs are bounded apart, in `cluster::live`),
/// so this bounds waiting more than load. At 16, a burst in namespaces whose re-checks are
/// proven (a round of a second or two, each re-check waiting for the next) was held to about
/// 7 claims a second (bench/, 10,000 builds, 16 due a second).
const CONCURRENCY: usize = 64;

/// Shutdown must finish within the pod's grace period (30 s) whatever the API server does:
/// the lease release and the HTTP server each get this long.
const SHUTDOWN_STEP: Duration = Duration::from_secs(5);

/// What `run` needs besides the configuration.
pub struct RunOptions {
    /// This replica's identity for the lease and events (the pod name in a cluster).
    pub identity: String,
    /// The namespace this replica runs in, for the lease.
    pub pod_namespace: Option<String>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub listen: SocketAddr,
    /// The API server's clock, fed by the client's answers: deadlines are judged by it.
    pub clock: ServerClock,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("could not serve HTTP on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// A task the daemon cannot work without ended: exit, so that the pod restarts, rather
    /// than run half alive.
    #[error("the {0} stopped unexpectedly; exiting so that the pod restarts")]
    TaskEnded(&'static str),
    #[error("http.tls_cert_file, http.tls_key_file: {0}")]
    Tls(#[from] http::TlsError),
}

/// Runs the daemon until `stop` is cancelled: finishes the deletes in flight, releases the
/// lease, and returns.
pub async fn run(
    client: Client,
    config: Config,
    options: RunOptions,
    stop: CancellationToken,
) -> Result<(), RunError> {
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    options
        .clock
        .report_to(metrics.clone(), config.deletion.window);
    // A client built without the clock's layer (in-process tests) tells it nothing by itself.
    if !options.clock.known()
        && let Err(error) = options.clock.ask(&client).await
    {
        warn!(%error, "cannot read the API server's clock yet; nothing is due until it is known");
    }
    let health = Arc::new(Health::default());
    let secure = match (
        &config.http.secure_listen,
        &config.http.tls_cert_file,
        &config.http.tls_key_file,
    ) {
        (Some(addr), Some(cert), Some(key)) => Some(http::Secure {
            addr: *addr,
            tls: Arc::new(http::tls_config(cert, key)?),
            gate: Gate::new(client.clone()),
        }),
        // Validation sets the three together.
        _ => None,
    };
    let server = http::serve(
        options.listen,
        secure,
        registry,
        health.clone(),
        stop.clone(),
    )
    .await
    .map_err(|(addr, source)| RunError::Listen { addr, source })?;

    let lease_namespace = config
        .leader_election
        .lease_namespace(options.pod_namespace.as_deref())
        .to_owned();
    // The DELETEs that may still land: the controller drives it, the elector writes it on
    // the Lease.
    let registry = Arc::new(DeletesInFlight::default());
    let leadership = Leadership::start(
        client.clone(),
        &config.leader_election,
        &lease_namespace,
        options.identity.clone(),
        metrics.clone(),
        registry.clone(),
    );

    let mode = if config.deletion.dry_run {
        Mode::DryRun {
            server_side: config.deletion.server_side_dry_run,
        }
    } else {
        Mode::Delete
    };
    info!(?mode, "starting");
    let (schedule, mut scheduler) = Scheduler::new();
    let deletes = registry.clone();
    scheduler.report_to(metrics.clone(), move |metrics| {
        metrics.deletes_unresolved(in_flight::unresolved(&deletes));
    });
    let served = Served::new(client.clone(), Some((metrics.clone(), health.clone())));
    let cluster = KubeCluster {
        writer: Writer::new(
            client.clone(),
            mode,
            Some(options.identity),
            leadership.fence(),
        ),
        fence: leadership.fence(),
        leading: leadership.subscribe(),
        snapshots: Snapshots::default(),
        served: served.clone(),
        client: client.clone(),
        metrics: metrics.clone(),
    };
    let controller = Arc::new(Controller::new(
        &config,
        cluster,
        options.clock,
        metrics.clone(),
        schedule,
        registry,
    ));

    // Fused, so that a task already seen to end is not polled again below.
    let feeder = tokio::spawn(apply_watches(
        controller.clone(),
        watches::updates(&client, &config, &served),
        health.clone(),
    ));
    let follower = tokio::spawn(follow_leadership(controller.clone(), health));
    // Whether the label guard is installed, told at startup and on each change; like the
    // sweeper, not among the tasks the daemon cannot work without.
    let guard_watch = tokio::spawn(label_guard::watch(
        client.clone(),
        metrics.clone(),
        stop.clone(),
    ));
    // Not among the tasks the daemon cannot work without: it only ever ends on stop.
    let sweeper = (config.deletion.released_volume_ttl)
        .map(|ttl| tokio::spawn(sweep_released(controller.clone(), ttl, stop.clone())));
    let aborts = [feeder.abort_handle(), follower.abort_handle()];
    let (mut feeder, mut follower, mut server) = (feeder.fuse(), follower.fuse(), server.fuse());

    let reconciler = controller.clone();
    let scheduling = scheduler.run(
        CONCURRENCY,
        move |key| reconciler.clone().reconcile(key),
        stop.clone(),
    );
    tokio::pin!(scheduling);
    // The watches, the election (whose end closes the leadership channel the follower reads)
    // and the HTTP server run until stop; one that ends before is fatal.
    let mut scheduled = false;
    let ended = tokio::select! {
        () = &mut scheduling => {
            scheduled = true;
            None
        }
        _ = &mut feeder => Some("watch stream"),
        _ = &mut follower => Some("leader election"),
        _ = &mut server => Some("HTTP server"),
    };
    // The HTTP server ends on stop too, while the scheduler drains.
    let ended = ended.filter(|_| !stop.is_cancelled());
    if !scheduled {
        stop.cancel();
        scheduling.await;
    }

    for abort in aborts {
        abort.abort();
    }
    if let Some(sweeper) = sweeper {
        let _ = sweeper.await;
    }
    // It writes nothing: a read in flight is dropped.
    guard_watch.abort();
    for task in [&mut feeder, &mut follower] {
        if !task.is_terminated() {
            let _ = task.await;
        }
    }
    drop(controller);
    if tokio::time::timeout(SHUTDOWN_STEP, leadership.release())
        .await
        .is_err()
    {
        warn!("releasing the lease took too long; a standby takes over when it expires");
    }
    if !server.is_terminated()
        && tokio::time::timeout(SHUTDOWN_STEP, &mut server)
            .await
            .is_err()
    {
        warn!("the HTTP server did not stop in time; leaving it");
    }
    match ended {
        Some(task) => Err(RunError::TaskEnded(task)),
        None => {
            info!("stopped");
            Ok(())
        }
    }
}

/// Publishes leadership to metrics and, on winning the lease, re-evaluates every claim: the
/// standby decided but did not act.
pub(super) async fn follow_leadership<C: Cluster, K: Clock>(
    controller: Arc<Controller<C, K>>,
    health: Arc<Health>,
) {
    let mut leading = controller.cluster.leadership();
    loop {
        let is_leader = *leading.borrow_and_update();
        controller.metrics.set_leader(is_leader);
        health.set_leader(is_leader);
        if is_leader {
            info!("leading: this replica deletes");
            // The DELETEs the Lease names are registered first and the cap opens last, so no
            // reconcile is admitted before every one that may still land is known.
            controller.reconcile_owed();
            controller.recover_rounds();
            controller.recover_cap();
            let keys: Vec<ObjectKey> = {
                let index = controller.cache.read();
                if index.synced() {
                    index.claims().map(|c| c.key.clone()).collect()
                } else {
                    Vec::new()
                }
            };
            controller.wake(keys);
            let namespaces = controller.cache.read().namespace_names();
            for namespace in namespaces {
                controller.warn_namespace(&namespace).await;
            }
        } else {
            info!("standing by: another replica holds the lease");
            controller.deletes.slots.forget();
            controller.notices.forget_warnings();
        }
        if leading.changed().await.is_err() {
            return;
        }
    }
}
