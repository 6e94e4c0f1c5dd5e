//! The work queue: claims to reconcile now or at an exact instant, each claim at most once at a
//! time, at most `concurrency` at once. No periodic sweep: a claim is reconciled when something
//! it depends on changes, or when its verdict's recheck instant arrives.
//!
//! Why not kube-runtime's `Controller`: it reconciles one main kind's objects, handed over as
//! `Arc<K>` from a reflector store of whole objects, and maps other kinds onto them one object at
//! a time. workspace-gc's claims are driven by six kinds through its own compact index (the
//! cache, which keeps a few fields per object to stay small at 50,000 builds), and the index,
//! not a mapper, knows which claims a change of a run or a pod affects. What this module does in
//! the Controller's place is small: earliest-instant-wins timers (as `kube::runtime::scheduler`
//! has them), one reconcile per claim at a time (a claim asked for while running runs again
//! after) and a concurrency cap, in one type whose invariants its tests check together.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};

use crate::decide::facts::ObjectKey;

/// The longest a timer is set for.
const MAX_DELAY: Duration = Duration::from_secs(24 * 60 * 60);

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
    ready: VecDeque<ObjectKey>,
    queued: HashSet<ObjectKey>,
    running: HashSet<ObjectKey>,
    /// Claims asked for while running: reconciled again once the current run ends.
    dirty: HashSet<ObjectKey>,
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
            running: HashSet::new(),
            dirty: HashSet::new(),
        };
        (Schedule { requests }, scheduler)
    }

    /// Runs until `stop` is cancelled, then waits for the reconciles in flight to finish.
    pub async fn run<F, Fut>(mut self, concurrency: usize, reconcile: F, stop: CancellationToken)
    where
        F: Fn(ObjectKey) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut in_flight: JoinSet<ObjectKey> = JoinSet::new();
        loop {
            // Take every request already waiting first, so a burst for one claim coalesces.
            while let Ok((key, at)) = self.requests.try_recv() {
                self.request(key, at);
            }
            while in_flight.len() < concurrency.max(1) {
                let Some(key) = self.ready.pop_front() else {
                    break;
                };
                self.queued.remove(&key);
                self.running.insert(key.clone());
                let run = reconcile(key.clone());
                in_flight.spawn(async move {
                    run.await;
                    key
                });
            }
            tokio::select! {
                () = stop.cancelled() => break,
                Some((key, at)) = self.requests.recv() => self.request(key, at),
                Some(expired) = self.delayed.next(), if !self.delayed.is_empty() => {
                    let key = expired.into_inner();
                    self.timers.remove(&key);
                    self.enqueue(key);
                }
                Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                    // A panicking reconcile loses its key; its next change or recheck restores it.
                    if let Ok(key) = done {
                        self.running.remove(&key);
                        if self.dirty.remove(&key) {
                            self.enqueue(key);
                        }
                    }
                }
            }
        }
        while in_flight.join_next().await.is_some() {}
    }

    fn request(&mut self, key: ObjectKey, at: Option<Instant>) {
        // The timer wheel cannot hold far deadlines; waking early only re-decides and reschedules.
        let at = at.map(|at| at.min(Instant::now() + MAX_DELAY));
        match at {
            Some(at) if at > Instant::now() => {
                if let Some((timer, current)) = self.timers.get(&key).copied() {
                    if current <= at {
                        return;
                    }
                    self.delayed.remove(&timer);
                }
                let timer = self.delayed.insert_at(key.clone(), at);
                self.timers.insert(key, (timer, at));
            }
            _ => self.enqueue(key),
        }
    }

    fn enqueue(&mut self, key: ObjectKey) {
        if self.running.contains(&key) {
            self.dirty.insert(key);
        } else if self.queued.insert(key.clone()) {
            self.ready.push_back(key);
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
                async move { log.lock().unwrap().push((k.name, start.elapsed())) }
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
}
