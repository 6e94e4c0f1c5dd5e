//! The work queue: claims to reconcile now or at an exact instant, each claim at most once at a
//! time, at most `concurrency` at once. No periodic sweep: a claim is reconciled when something
//! it depends on changes, or when its verdict's recheck instant arrives.
//!
//! A reconcile returns its [`Outcome`] and the scheduler applies it: done, again at an instant,
//! or again after a per-claim exponential backoff when it failed (as client-go's rate-limited
//! work queue does), reset by the next outcome that is not a failure. A reconcile that panics
//! counts as a failure: its claim is retried, never lost. Unlike client-go's queue, a claim
//! whose write failed (a DELETE refused, throttled or unanswered) is not run before its backoff
//! ends, whatever wakes it: a failing reconcile's own writes (a revocation, a Lease write)
//! change what it watches, and their events must not turn a standing failure into a storm.
//! Waiting only delays a delete. A claim that failed before writing anything (the cache behind
//! the live re-check, a read that failed) is still run at once by a change, which is what it
//! waits for.
//!
//! Why not kube-runtime's `Controller`: it reconciles one main kind's objects, handed over as
//! `Arc<K>` from a reflector store of whole objects, and maps other kinds onto them one object at
//! a time. workspace-gc's claims are driven by six kinds through its own compact index (the
//! cache, which keeps a few fields per object to stay small at 50,000 builds), and the index,
//! not a mapper, knows which claims a change of a run or a pod affects. What this module does in
//! the Controller's place is small: earliest-instant-wins timers (as `kube::runtime::scheduler`
//! has them), one reconcile per claim at a time (a claim asked for while running runs again
//! after) and a concurrency cap, in one type whose invariants its tests check together.
//!
//! What an operator sees of it ([`Scheduler::report_to`]), as client-go's work queue shows it:
//! the depth by state, how long the claim due the longest has waited and the longest reconcile
//! has run (sampled every second, so they grow while nothing else happens), the wait from due
//! to start, adds, retries by failure, and the attempts a claim took to conclude or has failed
//! so far; no series names a claim.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::{Id, JoinSet};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};
use tracing::{error, warn};

use crate::decide::facts::ObjectKey;
use crate::observe::metrics::Metrics;

/// The longest a timer is set for.
const MAX_DELAY: Duration = Duration::from_secs(24 * 60 * 60);
/// The first retry after a failure; each further failure in a row doubles it.
const BACKOFF_BASE: Duration = Duration::from_secs(1);
/// The longest backoff: a claim that keeps failing is still retried this often, so it is
/// collected within this long once the fault is over.
pub const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// The longest backoff after refusals ([`Failure::Denied`]): a standing RBAC or admission
/// denial then costs a re-check, a Lease write and a DELETE every five minutes per claim, not
/// every ten seconds. A change to the claim still runs it at once.
pub const DENIED_BACKOFF_MAX: Duration = Duration::from_secs(5 * 60);
/// The longest backoff while a DELETE without an answer cannot be revoked
/// ([`Failure::Unrevoked`]): a webhook or a network path that keeps failing then costs one
/// revocation a minute per claim owed one, not six; the claim stays kept meanwhile, and its
/// slot of the cap stays taken.
pub const UNREVOKED_BACKOFF_MAX: Duration = Duration::from_secs(60);
/// After stop, how long reconciles in flight may take to finish before they are abandoned:
/// the process must end within the pod's termination grace period whatever the API server
/// does (every request is bounded too; this bounds what is left).
const DRAIN: Duration = Duration::from_secs(10);
/// How often the queue's gauges are sampled while it reports: ages need a clock, not an event.
const SAMPLE: Duration = Duration::from_secs(1);

/// What a reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing until something the claim depends on changes.
    Done,
    /// Reconcile again at this instant (a deadline, the end of the cap's window).
    At(Instant),
    /// It could not conclude: retry after the claim's backoff.
    Retry(Failure),
}

impl Outcome {
    /// The outcome of doing both: a failure wins; otherwise the earlier instant.
    pub fn and(self, other: Outcome) -> Outcome {
        match (self, other) {
            (Outcome::Retry(failure), _) | (_, Outcome::Retry(failure)) => Outcome::Retry(failure),
            (Outcome::At(a), Outcome::At(b)) => Outcome::At(a.min(b)),
            (Outcome::At(at), Outcome::Done) | (Outcome::Done, Outcome::At(at)) => Outcome::At(at),
            (Outcome::Done, Outcome::Done) => Outcome::Done,
        }
    }
}

/// Why a reconcile could not conclude: a bounded category, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Failure {
    /// The live re-check could not read what the decision rests on.
    LiveUnread,
    /// The live re-check took longer than its bound: what it read is not live any more.
    LiveTooSlow,
    /// The live re-check did not confirm the cache's verdict: the cache is behind.
    LiveDisagrees,
    /// The count of deletions in the current window is not known.
    CapUnknown,
    /// This replica may not write: not leading, or the fence's reach has passed.
    Fenced,
    /// The delete could not go out before the live re-check or the fence lapsed.
    TooLate,
    /// The claim changed or was re-created since the decision.
    Conflict,
    /// The API server throttled the delete (429).
    Throttled,
    /// The API server refused the delete (RBAC, admission, another 4xx): retried with a
    /// backoff of minutes, not seconds, since it will likely be refused again.
    Denied,
    /// The delete got no answer: it may or may not have been carried out.
    Unanswered,
    /// The revocation of a delete without an answer failed too: it may still land.
    Unrevoked,
    /// The reconcile panicked.
    Panicked,
}

impl Failure {
    /// Whether a claim that failed so waits for its whole backoff, whatever wakes it: its
    /// write reached (or may have reached) the API server and failed, and its own writes'
    /// events would otherwise run it again at once.
    pub fn holds_back(self) -> bool {
        matches!(
            self,
            Failure::Denied | Failure::Throttled | Failure::Unanswered | Failure::Unrevoked
        )
    }

    pub fn category(self) -> &'static str {
        match self {
            Failure::LiveUnread => "live-unread",
            Failure::LiveTooSlow => "live-too-slow",
            Failure::LiveDisagrees => "live-disagrees",
            Failure::CapUnknown => "cap-unknown",
            Failure::Fenced => "fenced",
            Failure::TooLate => "too-late",
            Failure::Conflict => "conflict",
            Failure::Throttled => "throttled",
            Failure::Denied => "denied",
            Failure::Unanswered => "unanswered",
            Failure::Unrevoked => "unrevoked",
            Failure::Panicked => "panicked",
        }
    }
}

/// The backoff after `failures` failures in a row (at least one) over `streak` (from the first
/// of them to the last, `last`): doubling from the first, and never shorter than the streak, so that a claim
/// whose attempts are spaced by something else (the pace, at 1,000 due claims 200 s apart)
/// reaches its ceiling in a few attempts, not after ten doublings of its own.
fn backoff_after(failures: u32, streak: Duration, last: Failure) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    let ceiling = match last {
        Failure::Denied => DENIED_BACKOFF_MAX,
        Failure::Unrevoked => UNREVOKED_BACKOFF_MAX,
        _ => BACKOFF_MAX,
    };
    BACKOFF_BASE
        .saturating_mul(1 << doublings)
        .max(streak)
        .min(ceiling)
}

/// A claim's failures in a row, and when the first of them ended.
#[derive(Debug, Clone, Copy)]
struct Streak {
    failures: u32,
    since: Instant,
}

/// Asks for a claim to be reconciled now or at an instant. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Schedule {
    requests: mpsc::UnboundedSender<(ObjectKey, Option<Instant>)>,
}

impl Schedule {
    pub fn now(&self, key: ObjectKey) {
        // A closed channel means the scheduler stopped (shutdown): nothing left to do.
        let _ = self.requests.send((key, None));
    }

    pub fn at(&self, key: ObjectKey, at: Instant) {
        let _ = self.requests.send((key, Some(at)));
    }
}

/// The receiving end, run by [`Scheduler::run`].
pub struct Scheduler {
    requests: mpsc::UnboundedReceiver<(ObjectKey, Option<Instant>)>,
    delayed: DelayQueue<ObjectKey>,
    /// Pending timers, so a claim has at most one: the earliest.
    timers: HashMap<ObjectKey, (delay_queue::Key, Instant)>,
    /// Claims due, in order, each with the instant it fell due.
    ready: VecDeque<(ObjectKey, Instant)>,
    queued: HashSet<ObjectKey>,
    /// Claims being reconciled, each with the instant it started.
    running: HashMap<ObjectKey, Instant>,
    /// Claims asked for while running: reconciled again once the current run ends.
    dirty: HashSet<ObjectKey>,
    /// Failures in a row, per claim that is backing off.
    failures: HashMap<ObjectKey, Streak>,
    /// Until when each claim whose write failed waits, whatever asks for it.
    backing_off: HashMap<ObjectKey, Instant>,
    report: Option<Report>,
}

/// Where the queue reports ([`Scheduler::report_to`]).
struct Report {
    metrics: Arc<Metrics>,
    /// Samples gauges of other concerns at each of the queue's samples.
    sample: Box<dyn Fn(&Metrics) + Send>,
}

impl Scheduler {
    pub fn new() -> (Schedule, Scheduler) {
        let (requests, receiver) = mpsc::unbounded_channel();
        let scheduler = Scheduler {
            requests: receiver,
            delayed: DelayQueue::new(),
            timers: HashMap::new(),
            ready: VecDeque::new(),
            queued: HashSet::new(),
            running: HashMap::new(),
            dirty: HashSet::new(),
            failures: HashMap::new(),
            backing_off: HashMap::new(),
            report: None,
        };
        (Schedule { requests }, scheduler)
    }

    /// Reports the queue to `metrics` while it runs, and calls `sample` at each sample of its
    /// gauges ([`SAMPLE`]): gauges of state the controller does not hold a lock for (the
    /// DELETEs in flight) are read there, beside the queue's.
    pub fn report_to(&mut self, metrics: Arc<Metrics>, sample: impl Fn(&Metrics) + Send + 'static) {
        self.report = Some(Report {
            metrics,
            sample: Box::new(sample),
        });
    }

    /// The requests waiting, in order, each with its instant (`None`: now); taken, so the
    /// next call sees only later ones. For tests that observe what a reconcile schedules.
    #[cfg(test)]
    pub fn take_requests(&mut self) -> Vec<(ObjectKey, Option<Instant>)> {
        std::iter::from_fn(|| self.requests.try_recv().ok()).collect()
    }

    /// Runs until `stop` is cancelled, then gives the reconciles in flight [`DRAIN`] to finish
    /// and abandons the rest.
    pub async fn run<F, Fut>(mut self, concurrency: usize, reconcile: F, stop: CancellationToken)
    where
        F: Fn(ObjectKey) -> Fut,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let mut in_flight: JoinSet<(ObjectKey, Outcome)> = JoinSet::new();
        // Which claim each task reconciles, so a panicking one's claim is not lost.
        let mut tasks: HashMap<Id, ObjectKey> = HashMap::new();
        let mut sampling = tokio::time::interval(SAMPLE);
        sampling.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            // Take every request already waiting first, so a burst for one claim coalesces.
            while let Ok((key, at)) = self.requests.try_recv() {
                self.request(key, at);
            }
            while in_flight.len() < concurrency.max(1) {
                let Some((key, due)) = self.ready.pop_front() else {
                    break;
                };
                self.queued.remove(&key);
                let now = Instant::now();
                self.report(|metrics| metrics.queue_waited(now.saturating_duration_since(due)));
                self.running.insert(key.clone(), now);
                let run = reconcile(key.clone());
                let task = key.clone();
                let handle = in_flight.spawn(async move { (task, run.await) });
                tasks.insert(handle.id(), key);
            }
            tokio::select! {
                () = stop.cancelled() => break,
                Some((key, at)) = self.requests.recv() => self.request(key, at),
                Some(expired) = self.delayed.next(), if !self.delayed.is_empty() => {
                    let key = expired.into_inner();
                    let due = self.timers.remove(&key).map_or_else(Instant::now, |(_, at)| at);
                    self.enqueue(key, due);
                }
                _ = sampling.tick(), if self.report.is_some() => self.sample(),
                Some(done) = in_flight.join_next_with_id(), if !in_flight.is_empty() => {
                    let (key, outcome) = match done {
                        Ok((id, (key, outcome))) => {
                            tasks.remove(&id);
                            (key, outcome)
                        }
                        Err(join) => {
                            let Some(key) = tasks.remove(&join.id()) else { continue };
                            error!(claim = %key, error = %join, "a reconcile panicked; retrying it");
                            (key, Outcome::Retry(Failure::Panicked))
                        }
                    };
                    self.finished(key, outcome);
                }
            }
        }
        let drained = tokio::time::timeout(DRAIN, async {
            while in_flight.join_next().await.is_some() {}
        });
        if drained.await.is_err() {
            warn!(
                abandoned = in_flight.len(),
                "reconciles still in flight after the drain period; abandoning them"
            );
            in_flight.abort_all();
        }
    }

    /// Calls `record` with the metrics, when the queue reports.
    fn report(&self, record: impl FnOnce(&Metrics)) {
        if let Some(report) = &self.report {
            record(&report.metrics);
        }
    }

    /// Sets the queue's gauges, and has the other concerns' sampled.
    fn sample(&self) {
        let Some(report) = &self.report else {
            return;
        };
        let now = Instant::now();
        let metrics = &report.metrics;
        let age = |since: Option<Instant>| {
            since.map_or(Duration::ZERO, |at| now.saturating_duration_since(at))
        };
        metrics.queue_depth(self.ready.len(), self.running.len(), self.timers.len());
        metrics.queue_ages(
            age(self.ready.iter().map(|(_, due)| *due).min()),
            age(self.running.values().copied().min()),
        );
        metrics.queue_retrying(self.failures.values().map(|streak| streak.failures));
        (report.sample)(metrics);
    }

    /// Applies a finished reconcile's outcome.
    fn finished(&mut self, key: ObjectKey, outcome: Outcome) {
        self.running.remove(&key);
        match outcome {
            Outcome::Done | Outcome::At(_) => {
                let failures = self.failures.remove(&key).map_or(0, |s| s.failures);
                self.report(|metrics| metrics.queue_settled(failures.saturating_add(1)));
                self.backing_off.remove(&key);
                if let Outcome::At(at) = outcome {
                    self.request(key.clone(), Some(at));
                }
            }
            Outcome::Retry(failure) => {
                self.report(|metrics| metrics.reconcile_retry(failure.category()));
                let now = Instant::now();
                let streak = self.failures.entry(key.clone()).or_insert(Streak {
                    failures: 0,
                    since: now,
                });
                streak.failures = streak.failures.saturating_add(1);
                let at = now + backoff_after(streak.failures, now - streak.since, failure);
                if failure.holds_back() {
                    self.backing_off.insert(key.clone(), at);
                } else {
                    self.backing_off.remove(&key);
                }
                self.request(key.clone(), Some(at));
            }
        }
        if self.dirty.remove(&key) {
            self.request(key, None);
        }
    }

    fn request(&mut self, key: ObjectKey, at: Option<Instant>) {
        let now = Instant::now();
        // A claim backing off waits for the end of its backoff, whatever asks for it sooner.
        let at = match self.backing_off.get(&key).copied() {
            Some(until) if until > now => Some(at.map_or(until, |at| at.max(until))),
            Some(_) => {
                self.backing_off.remove(&key);
                at
            }
            None => at,
        };
        // The timer wheel cannot hold far deadlines; waking early only re-decides and reschedules.
        let at = at.map(|at| at.min(now + MAX_DELAY));
        match at {
            Some(at) if at > now => {
                if let Some((timer, current)) = self.timers.get(&key).copied() {
                    if current <= at {
                        return;
                    }
                    self.delayed.remove(&timer);
                }
                let timer = self.delayed.insert_at(key.clone(), at);
                self.timers.insert(key, (timer, at));
            }
            _ => self.enqueue(key, now),
        }
    }

    /// Puts a claim that fell `due` in line, or marks it to run again after its current run.
    fn enqueue(&mut self, key: ObjectKey, due: Instant) {
        let added = if self.running.contains_key(&key) {
            self.dirty.insert(key)
        } else if self.queued.insert(key.clone()) {
            self.ready.push_back((key, due));
            true
        } else {
            false
        };
        if added {
            self.report(Metrics::queue_added);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("ns", name)
    }

    #[tokio::test(start_paused = true)]
    async fn runs_each_claim_once_and_at_its_instant() {
        let (schedule, scheduler) = Scheduler::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let log = seen.clone();
        let start = Instant::now();
        schedule.at(key("later"), start + Duration::from_secs(30));
        // An earlier request replaces a later one; a later one does not move an earlier one.
        schedule.at(key("later"), start + Duration::from_secs(10));
        schedule.at(key("later"), start + Duration::from_secs(20));
        // Requests waiting together coalesce.
        schedule.now(key("a"));
        schedule.now(key("a"));
        let task = tokio::spawn(scheduler.run(
            2,
            move |k: ObjectKey| {
                let log = log.clone();
                async move {
                    log.lock().unwrap().push((k.name, start.elapsed()));
                    Outcome::Done
                }
            },
            stop.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(60)).await;
        stop.cancel();
        task.await.unwrap();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen,
            vec![
                ("a".to_owned(), Duration::ZERO),
                ("later".to_owned(), Duration::from_secs(10)),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_asked_for_while_running_runs_again_after() {
        let (schedule, scheduler) = Scheduler::new();
        let runs = Arc::new(Mutex::new(0));
        let stop = CancellationToken::new();
        let counter = runs.clone();
        let again = schedule.clone();
        let task = tokio::spawn(scheduler.run(
            4,
            move |k: ObjectKey| {
                let counter = counter.clone();
                let again = again.clone();
                async move {
                    let first = {
                        let mut n = counter.lock().unwrap();
                        *n += 1;
                        *n == 1
                    };
                    if first {
                        again.now(k);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Outcome::Done
                }
            },
            stop.clone(),
        ));
        schedule.now(key("x"));
        tokio::time::sleep(Duration::from_secs(5)).await;
        stop.cancel();
        task.await.unwrap();
        assert_eq!(*runs.lock().unwrap(), 2);
    }

    /// Runs `scheduler` with `reconcile` for `for_`, with one request for `x` at the start, and
    /// returns when each reconcile of `x` started.
    async fn starts_of<Fut>(
        reconcile: impl Fn(u32) -> Fut + Send + Sync + 'static,
        for_: Duration,
    ) -> Vec<Duration>
    where
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let (schedule, scheduler) = Scheduler::new();
        let starts = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let log = starts.clone();
        let reconcile = Arc::new(reconcile);
        let start = Instant::now();
        let task = tokio::spawn(scheduler.run(
            4,
            move |_: ObjectKey| {
                let log = log.clone();
                let reconcile = reconcile.clone();
                let n = {
                    let mut log = log.lock().unwrap();
                    log.push(start.elapsed());
                    u32::try_from(log.len()).unwrap()
                };
                async move { reconcile(n).await }
            },
            stop.clone(),
        ));
        schedule.now(key("x"));
        tokio::time::sleep(for_).await;
        stop.cancel();
        task.await.unwrap();
        starts.lock().unwrap().clone()
    }

    #[test]
    fn a_denial_backs_off_to_minutes_and_throttling_to_seconds() {
        let ceilings = |failure| {
            (1..=20)
                .map(|n| backoff_after(n, Duration::ZERO, failure))
                .max()
        };
        assert_eq!(ceilings(Failure::Throttled), Some(BACKOFF_MAX));
        assert_eq!(ceilings(Failure::Denied), Some(DENIED_BACKOFF_MAX));
        assert_eq!(
            backoff_after(1, Duration::ZERO, Failure::Denied),
            BACKOFF_BASE,
            "the first retry is as soon"
        );
        // The backoff follows the last failure: throttled after denials, seconds again.
        assert_eq!(
            backoff_after(12, Duration::ZERO, Failure::Throttled),
            BACKOFF_MAX
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_exponentially_up_to_the_maximum_and_reset_on_success() {
        // Fails five times, succeeds once asking to come back in 3 s, then fails again.
        let starts = starts_of(
            |n| async move {
                match n {
                    6 => Outcome::At(Instant::now() + Duration::from_secs(3)),
                    _ => Outcome::Retry(Failure::Throttled),
                }
            },
            Duration::from_secs(40),
        )
        .await;
        let secs: Vec<u64> = starts.iter().map(Duration::as_secs).collect();
        // 1, 2, 4, 8, then capped at 10; the success's instant; then the backoff starts over.
        assert_eq!(&secs[..9], &[0, 1, 3, 7, 15, 25, 28, 29, 31], "{secs:?}");
    }

    /// A claim whose attempts are spaced by something else (here each run waits 200 s, as for
    /// its pace slot at 1,000 due claims) backs off by its streak's length: at its ceiling
    /// after three attempts, not after ten doublings.
    #[tokio::test(start_paused = true)]
    async fn failures_spaced_apart_back_off_by_the_streak() {
        let starts = starts_of(
            |_| async {
                tokio::time::sleep(Duration::from_secs(200)).await;
                Outcome::Retry(Failure::Denied)
            },
            Duration::from_secs(1700),
        )
        .await;
        let secs: Vec<u64> = starts.iter().map(Duration::as_secs).collect();
        // Failed at 200 (1 s), at 401 (its streak 201 s), at 802 and on (the 300 s ceiling).
        assert_eq!(&secs[..5], &[0, 201, 602, 1102, 1602], "{secs:?}");
    }

    /// When a claim failing with `failure` five times in a row (each run waking it twice more,
    /// as its own writes' events do) runs, in seconds; a change wakes it at 3.5 s and at 30 s.
    async fn runs_woken_while_failing(failure: Failure) -> Vec<f64> {
        let (schedule, scheduler) = Scheduler::new();
        let starts = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let start = Instant::now();
        let task = tokio::spawn(scheduler.run(
            2,
            {
                let starts = starts.clone();
                let schedule = schedule.clone();
                move |k: ObjectKey| {
                    let n = {
                        let mut starts = starts.lock().unwrap();
                        starts.push(start.elapsed());
                        starts.len()
                    };
                    let schedule = schedule.clone();
                    async move {
                        if n > 5 {
                            return Outcome::Done;
                        }
                        schedule.now(k.clone());
                        schedule.now(k);
                        Outcome::Retry(failure)
                    }
                }
            },
            stop.clone(),
        ));
        schedule.now(key("x"));
        tokio::time::sleep(Duration::from_millis(3500)).await;
        schedule.now(key("x"));
        tokio::time::sleep(Duration::from_millis(26_500)).await;
        schedule.now(key("x"));
        tokio::time::sleep(Duration::from_secs(5)).await;
        stop.cancel();
        task.await.unwrap();
        (starts.lock().unwrap().iter())
            .map(Duration::as_secs_f64)
            .collect()
    }

    /// A claim whose write failed waits for its backoff whatever wakes it, its own writes'
    /// events included: a standing failure costs one attempt per backoff, not a storm. Once it
    /// succeeds, a change runs it at once again.
    #[tokio::test(start_paused = true)]
    async fn a_claim_whose_write_failed_waits_for_its_backoff_whatever_wakes_it() {
        let secs = runs_woken_while_failing(Failure::Unanswered).await;
        // 1, 2, 4, 8, then 10 s apart; then the success; then the change at once.
        assert_eq!(secs, vec![0.0, 1.0, 3.0, 7.0, 15.0, 25.0, 30.0], "{secs:?}");
    }

    /// A claim that failed before writing anything (here the cache was behind its live
    /// re-check) is run again at once by a change: the change is what it waits for.
    #[tokio::test(start_paused = true)]
    async fn a_claim_that_wrote_nothing_is_run_at_once_by_a_change() {
        let secs = runs_woken_while_failing(Failure::LiveDisagrees).await;
        assert_eq!(secs[..3], [0.0, 0.0, 0.0], "{secs:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_reconcile_is_retried_not_lost() {
        let starts = starts_of(
            |n| async move {
                if n == 1 {
                    panic!("a bug in a reconcile");
                }
                Outcome::Done
            },
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(starts, vec![Duration::ZERO, BACKOFF_BASE]);
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_abandons_a_reconcile_that_never_ends_after_the_drain_period() {
        let (schedule, scheduler) = Scheduler::new();
        let stop = CancellationToken::new();
        let task = tokio::spawn(scheduler.run(
            1,
            |_: ObjectKey| async {
                std::future::pending::<()>().await;
                Outcome::Done
            },
            stop.clone(),
        ));
        schedule.now(key("stuck"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let stopped = Instant::now();
        stop.cancel();
        task.await.unwrap();
        assert_eq!(stopped.elapsed().as_secs(), DRAIN.as_secs());
    }

    /// A scheduler reporting to metrics of its own, which `sample` reads: the text of a series.
    fn reporting() -> (Schedule, Scheduler, impl Fn(&str) -> Option<f64>) {
        let (schedule, mut scheduler) = Scheduler::new();
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(Metrics::register(&mut registry));
        scheduler.report_to(metrics, |_| {});
        let read = move |series: &str| {
            let text = crate::observe::metrics::tests::exposition(&registry);
            testkit::sample(&text, series)
        };
        (schedule, scheduler, read)
    }

    /// With one worker held 30 s by a slow claim, the depth by state, the oldest ready claim's
    /// wait and the running one's age read as they stand, every second; each wait from due to
    /// start is observed once, and so is each add.
    #[tokio::test(start_paused = true)]
    async fn the_queue_reports_its_depth_and_how_long_its_oldest_have_waited() {
        let (schedule, scheduler, read) = reporting();
        let stop = CancellationToken::new();
        let start = Instant::now();
        let task = tokio::spawn(scheduler.run(
            1,
            |k: ObjectKey| async move {
                if k.name == "slow" {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
                Outcome::Done
            },
            stop.clone(),
        ));
        for name in ["slow", "a", "b"] {
            schedule.now(key(name));
        }
        schedule.now(key("a"));
        schedule.at(key("later"), start + Duration::from_secs(100));
        tokio::time::sleep(Duration::from_millis(10_500)).await;
        let depth = |state: &str| read(&format!("workspace_gc_queue_depth{{state=\"{state}\"}}"));
        assert_eq!(depth("ready"), Some(2.0));
        assert_eq!(depth("running"), Some(1.0));
        assert_eq!(depth("scheduled"), Some(1.0));
        let ages = || {
            (
                read("workspace_gc_queue_oldest_due_seconds"),
                read("workspace_gc_queue_longest_running_seconds"),
            )
        };
        assert_eq!(
            ages(),
            (Some(10.0), Some(10.0)),
            "oldest ready, longest running"
        );
        assert_eq!(read("workspace_gc_queue_adds_total"), Some(3.0), "a once");

        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(depth("ready"), Some(0.0));
        assert_eq!(depth("running"), Some(0.0));
        assert_eq!(ages(), (Some(0.0), Some(0.0)), "none waits or runs");
        // slow at once, a and b after its 30 s.
        assert_eq!(read("workspace_gc_queue_wait_seconds_count"), Some(3.0));
        assert_eq!(read("workspace_gc_queue_wait_seconds_sum"), Some(60.0));

        // Past `later`'s instant by more than a sample's period: the sample after it ran.
        tokio::time::sleep(Duration::from_secs(62)).await;
        stop.cancel();
        task.await.unwrap();
        assert_eq!(depth("scheduled"), Some(0.0));
        // later ran at its instant, waiting nothing: its due is its instant, not its request.
        assert_eq!(read("workspace_gc_queue_wait_seconds_count"), Some(4.0));
        assert_eq!(read("workspace_gc_queue_wait_seconds_sum"), Some(60.0));
        assert_eq!(read("workspace_gc_queue_adds_total"), Some(4.0));
    }

    /// Each failure is a retry by its category (a panic included); while failing, the claim
    /// counts among those retrying; once it concludes, the attempts it took are observed and it
    /// counts no more.
    #[tokio::test(start_paused = true)]
    async fn retries_count_by_failure_and_a_claim_reports_its_attempts_when_it_concludes() {
        let (schedule, scheduler, read) = reporting();
        let stop = CancellationToken::new();
        let runs = Arc::new(Mutex::new(0));
        let task = tokio::spawn(scheduler.run(
            1,
            {
                let runs = runs.clone();
                move |_: ObjectKey| {
                    let n = {
                        let mut runs = runs.lock().unwrap();
                        *runs += 1;
                        *runs
                    };
                    async move {
                        match n {
                            1 | 2 => Outcome::Retry(Failure::Throttled),
                            3 => panic!("a bug in a reconcile"),
                            _ => Outcome::Done,
                        }
                    }
                }
            },
            stop.clone(),
        ));
        schedule.now(key("x"));
        // Runs at 0, 1 and 3 s failed; the next is at 7 s.
        tokio::time::sleep(Duration::from_millis(5500)).await;
        let retrying = |at_least: &str| {
            read(&format!(
                "workspace_gc_queue_retrying_claims{{at_least=\"{at_least}\"}}"
            ))
        };
        assert_eq!(retrying("1"), Some(1.0));
        assert_eq!(retrying("5"), Some(0.0));
        let retries = |category: &str| {
            read(&format!(
                "workspace_gc_reconcile_retries_total{{category=\"{category}\"}}"
            ))
        };
        assert_eq!(retries("throttled"), Some(2.0));
        assert_eq!(retries("panicked"), Some(1.0));
        assert_eq!(read("workspace_gc_queue_settle_attempts_count"), Some(0.0));

        tokio::time::sleep(Duration::from_secs(5)).await;
        stop.cancel();
        task.await.unwrap();
        assert_eq!(*runs.lock().unwrap(), 4);
        assert_eq!(retrying("1"), Some(0.0));
        assert_eq!(read("workspace_gc_queue_settle_attempts_count"), Some(1.0));
        assert_eq!(read("workspace_gc_queue_settle_attempts_sum"), Some(4.0));
    }

    /// What the queue is given to sample is read at each of its samples: the DELETEs in flight,
    /// as the daemon wires them, move with the registry without anyone telling the metrics.
    #[tokio::test(start_paused = true)]
    async fn the_deletes_in_flight_are_sampled_with_the_queue() {
        use crate::cluster::in_flight::{self, InFlight, Sent};
        let (_schedule, mut scheduler) = Scheduler::new();
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(Metrics::register(&mut registry));
        let deletes = Arc::new(in_flight::Shared::<()>::default());
        let sampled = deletes.clone();
        scheduler.report_to(metrics, move |metrics| {
            metrics.deletes_unresolved(in_flight::unresolved(&sampled));
        });
        let stop = CancellationToken::new();
        let task = tokio::spawn(scheduler.run(1, |_| async { Outcome::Done }, stop.clone()));
        let unresolved = |state: &str| {
            let text = crate::observe::metrics::tests::exposition(&registry);
            let series = format!("workspace_gc_deletes_unresolved{{state=\"{state}\"}}");
            testkit::sample(&text, &series)
        };
        assert_eq!(unresolved("unanswered"), Some(0.0), "exported before any");
        let delete = InFlight {
            namespace: "ns".into(),
            name: "a".into(),
            uid: "u1".into(),
            resource_version: "1".into(),
        };
        deletes.lock().unwrap().name(&delete).unwrap();
        // Half a sample apart from the samples, so none falls on a read.
        tokio::time::sleep(SAMPLE + SAMPLE / 2).await;
        assert_eq!(unresolved("sending"), Some(1.0));
        deletes
            .lock()
            .unwrap()
            .sent(&delete, Sent::Unanswered, None);
        tokio::time::sleep(SAMPLE).await;
        assert_eq!(unresolved("sending"), Some(0.0));
        assert_eq!(unresolved("unanswered"), Some(1.0));
        stop.cancel();
        task.await.unwrap();
    }

    #[test]
    fn outcomes_combine_to_the_more_urgent() {
        let now = Instant::now();
        let later = now + Duration::from_secs(5);
        assert_eq!(Outcome::At(later).and(Outcome::At(now)), Outcome::At(now));
        assert_eq!(Outcome::Done.and(Outcome::At(later)), Outcome::At(later));
        assert_eq!(
            Outcome::At(now).and(Outcome::Retry(Failure::Fenced)),
            Outcome::Retry(Failure::Fenced)
        );
        assert_eq!(Outcome::Done.and(Outcome::Done), Outcome::Done);
    }
}
