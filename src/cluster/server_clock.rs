//! The API server's clock, as this replica can know it. A deadline is met only once it has
//! passed by the API server's clock too: the deadlines come from its timestamps (completion and
//! creation times), so judging them by this node's clock alone lets a clock that runs ahead
//! (an RTC in local time before NTP syncs, a VM restored from a snapshot) delete early.
//!
//! Every answer of the API server carries its time in the `Date` header, to the second. A
//! request handed to the client at monotonic instant `sent` and answered at `received` with
//! `Date: D` says that, at some instant between the two, the server's clock read within
//! `[D, D + 1 s)`. So at a later instant `m` it reads at least `D + (m - received)` and less
//! than `D + 1 s + (m - sent)`, give or take the rate difference of the two clocks
//! ([`DRIFT_DIVISOR`]). The bounds are anchored on the monotonic clock, not the wall clock, so
//! a step of the wall clock between two answers cannot falsify them.
//!
//! API servers behind one address answer with their own clocks. Answers of clocks apart by
//! more than an answer's uncertainty contradict each other; each contradiction measures how
//! far apart the two clocks may be. Up to [`TOLERATED_DISAGREEMENT`] the blast-radius cap
//! absorbs it; beyond, the cap is held full (a [`Dispute`]) until answers have stayed within it
//! for a whole window.
//!
//! [`Estimator`] is the pure part: samples in, bounds out. [`ServerClock`] shares one between
//! the tower layer on the client ([`ServerClock::layer`]) that feeds it and the code that
//! judges deadlines ([`ServerClock::now`]), and publishes the offset and the dispute.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use http::{HeaderMap, Request, Response};
use tower_layer::Layer;
use tower_service::Service;
use tracing::{debug, info, warn};

use crate::config::MAX_DURATION;
use crate::observe::metrics::Metrics;

/// The rate of this machine's monotonic clock against the server's clock is trusted to 1 part
/// in this many (0.1 %, twice NTP's largest slew of 500 ppm): the bounds widen by that much of
/// the time since their answer.
pub const DRIFT_DIVISOR: u32 = 1000;

/// An offset surely beyond this (by both bounds) is warned about; the `WorkspaceGCClockOffset`
/// alert uses the same threshold. Safety does not depend on it: a fast clock is corrected, a
/// slow one only delays deletes. It points at a node whose clock needs fixing.
pub const WARN_BEYOND: Duration = Duration::from_secs(30);

/// Before any answer, how long until a deadline is looked at again.
const UNKNOWN_RECHECK: Duration = Duration::from_secs(10);

/// How far apart the clocks of the API servers behind one address may be without holding the
/// blast-radius cap. The cap judges its window this much before the earliest the server's clock
/// can read (`Limiter::with_tolerance`), so a deletion dated on one server's clock counts a
/// whole window on any other clock within this of it. A `Date` is to the second, so two
/// answers of clocks δ apart that contradict each other measure at most δ + 2 s and both round
/// trips: 4 s absorbs servers a second apart (NTP keeps them within milliseconds), and a full
/// cap waits 4 s longer (under 1 % of the shipped 10-minute window). A contradiction measured
/// beyond it holds the cap ([`Dispute`]).
pub const TOLERATED_DISAGREEMENT: Duration = Duration::from_secs(4);

/// One answer of the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// When the request was handed to the client.
    pub sent: Instant,
    /// When its answer's headers arrived.
    pub received: Instant,
    /// The answer's `Date`: the server's clock when it answered, truncated to the second.
    pub date: DateTime<Utc>,
}

/// What the server's clock reads at a monotonic instant: at least `earliest`, less than
/// `latest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub earliest: DateTime<Utc>,
    pub latest: DateTime<Utc>,
}

impl Bounds {
    /// The instant to judge deadlines at, for a local clock reading `local`: the earlier of the
    /// two clocks, so a fast local clock never makes anything due early, and a slow one keeps
    /// judging as it always did.
    pub fn judging(&self, local: DateTime<Utc>) -> DateTime<Utc> {
        local.min(self.earliest)
    }

    /// The server's clock minus `local`, in seconds: (lower, upper).
    pub fn offset(&self, local: DateTime<Utc>) -> (f64, f64) {
        let seconds = |at: DateTime<Utc>| at.signed_duration_since(local).as_seconds_f64();
        (seconds(self.earliest), seconds(self.latest))
    }

    /// Whether the offset from `local` surely exceeds `limit`, either way.
    pub fn beyond(&self, local: DateTime<Utc>, limit: Duration) -> bool {
        let (lower, upper) = self.offset(local);
        let limit = limit.as_secs_f64();
        lower > limit || upper < -limit
    }
}

/// The two anchors one answer gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Answer {
    lower: Anchor,
    upper: Anchor,
}

/// A reading of the server's clock that holds at a monotonic instant: at or past it for a
/// lower anchor, before it for an upper one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Anchor {
    at: Instant,
    server: DateTime<Utc>,
}

impl Anchor {
    /// The least the server's clock can read at `then`, for a lower anchor. Too far to
    /// represent: the earliest instant there is, which makes nothing due.
    fn earliest(&self, then: Instant) -> DateTime<Utc> {
        self.moved(then, Side::Earliest)
            .unwrap_or(DateTime::<Utc>::MIN_UTC)
    }

    /// The most the server's clock can read at `then`, for an upper anchor.
    fn latest(&self, then: Instant) -> DateTime<Utc> {
        self.moved(then, Side::Latest)
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    }

    /// The reading carried to `then` at the slowest (`Earliest`) or fastest rate the clocks'
    /// drift allows.
    fn moved(&self, then: Instant, side: Side) -> Option<DateTime<Utc>> {
        let (forward, elapsed) = match then.checked_duration_since(self.at) {
            Some(elapsed) => (true, elapsed),
            None => (false, self.at.duration_since(then)),
        };
        let slack = elapsed / DRIFT_DIVISOR;
        // Forward in time the earliest reading grows slowest; backward it shrinks fastest.
        let span = if forward == (side == Side::Earliest) {
            elapsed.checked_sub(slack)?
        } else {
            elapsed.checked_add(slack)?
        };
        let span = TimeDelta::from_std(span).ok()?;
        if forward {
            self.server.checked_add_signed(span)
        } else {
            self.server.checked_sub_signed(span)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Earliest,
    Latest,
}

/// What a new sample did to the estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// It is the first.
    First,
    /// It agrees with the earlier ones, and narrowed the bounds or left them as they were.
    Agrees,
    /// It contradicts them: API servers behind one address whose clocks disagree, or a clock
    /// was stepped (the server's, or this machine slept). The estimate starts again from it
    /// alone. `apart`: the most the clocks of the two answers that disagree can be apart
    /// (at least the truth: the true disagreement of two honest clocks is never larger).
    Contradicts { apart: Duration },
}

/// The tightest bounds the samples so far allow. Pure: no clock is read here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Estimator {
    /// The answer whose lower anchor is the estimate's, and the one whose upper anchor is:
    /// each keeps its other anchor, to measure a contradiction by.
    answers: Option<(Answer, Answer)>,
}

impl Estimator {
    /// Takes in one answer.
    pub fn observe(&mut self, sample: Sample) -> Observed {
        let answer = answer_of(sample);
        let Some((old_low, old_high)) = self.answers else {
            self.answers = Some((answer, answer));
            return Observed::First;
        };
        // Compared where both hold onwards, so that later instants see the same order.
        let then = old_low.lower.at.max(answer.lower.at);
        let low = if old_low.lower.earliest(then) > answer.lower.earliest(then) {
            old_low
        } else {
            answer
        };
        let then = old_high.upper.at.max(answer.upper.at);
        let high = if old_high.upper.latest(then) < answer.upper.latest(then) {
            old_high
        } else {
            answer
        };
        let received = sample.sent.max(sample.received);
        if low.lower.earliest(received) >= high.upper.latest(received) {
            self.answers = Some((answer, answer));
            // `low`'s clock is surely ahead of `high`'s, by at most the span from the least
            // `high`'s can read to the most `low`'s can. Beyond the range, as far apart as can be.
            let apart = low.upper.latest(received) - high.lower.earliest(received);
            let apart = apart.to_std().unwrap_or(Duration::MAX);
            return Observed::Contradicts { apart };
        }
        self.answers = Some((low, high));
        Observed::Agrees
    }

    /// What the server's clock reads at monotonic instant `at`; `None` before any sample.
    pub fn bounds(&self, at: Instant) -> Option<Bounds> {
        let (low, high) = self.answers?;
        Some(Bounds {
            earliest: low.lower.earliest(at),
            latest: high.upper.latest(at),
        })
    }
}

/// The lower and upper anchor one answer gives: the server's clock read at least its `Date`
/// when it arrived, and less than a second more when it was sent.
fn answer_of(sample: Sample) -> Answer {
    let lower = Anchor {
        at: sample.sent.max(sample.received),
        server: sample.date,
    };
    let upper = Anchor {
        at: sample.sent.min(sample.received),
        server: (sample.date.checked_add_signed(TimeDelta::seconds(1)))
            .unwrap_or(DateTime::<Utc>::MAX_UTC),
    };
    Answer { lower, upper }
}

/// A hold of the blast-radius cap: answers of the API server disagreed beyond
/// [`TOLERATED_DISAGREEMENT`], so the deletions the cap counts cannot be dated within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dispute {
    /// The contradiction that began it: a hold is told once, however many extend it.
    pub since: tokio::time::Instant,
    /// When it ends: a window after the last contradiction beyond the tolerance.
    pub until: tokio::time::Instant,
}

/// The contradictions beyond the tolerance of the latest hold: its first and its last.
#[derive(Debug, Clone, Copy)]
struct Hold {
    since: Instant,
    last: Instant,
}

impl Hold {
    /// When it ends, `span` after its last contradiction; as asked at `at`, a span beyond what
    /// an instant can hold ends never before the next ask.
    fn until(&self, span: Duration, at: Instant) -> Instant {
        (self.last.checked_add(span))
            .or_else(|| at.checked_add(UNKNOWN_RECHECK))
            .unwrap_or(at)
    }
}

/// The `Date` header of an answer, if it has a valid one (IMF-fixdate, RFC 9110).
pub fn date_of(headers: &HeaderMap) -> Option<DateTime<Utc>> {
    let text = headers.get(http::header::DATE)?.to_str().ok()?;
    DateTime::parse_from_rfc2822(text)
        .ok()
        .map(|date| date.with_timezone(&Utc))
}

/// The API server's clock as the answers of one client tell it; cheap to clone, all clones
/// share one estimate.
#[derive(Clone, Default)]
pub struct ServerClock {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    estimator: Mutex<Estimator>,
    metrics: OnceLock<Arc<Metrics>>,
    /// Whether the offset was last surely beyond [`WARN_BEYOND`]: the log says transitions only.
    skewed: AtomicBool,
    /// The latest hold of the cap, standing or ended.
    hold: Mutex<Option<Hold>>,
    /// How long a hold lasts after its last contradiction: the cap's window
    /// ([`ServerClock::report_to`]); for good until told.
    span: OnceLock<Duration>,
    /// Whether a hold was last published as standing: its end is logged once.
    held: AtomicBool,
}

impl ServerClock {
    /// The tower layer that feeds this clock from every answer of the client it wraps.
    pub fn layer(&self) -> ClockLayer {
        ClockLayer {
            clock: self.clone(),
        }
    }

    /// Publishes the offset and the dispute to `metrics` from now on, a dispute holding the
    /// cap for `window` after its last contradiction (the first call wins).
    pub fn report_to(&self, metrics: Arc<Metrics>, window: Duration) {
        let _ = self.shared.metrics.set(metrics);
        let _ = self.shared.span.set(window);
        self.publish(Instant::now(), Utc::now());
    }

    /// Whether any answer has been seen.
    pub fn known(&self) -> bool {
        self.bounds_at(Instant::now()).is_some()
    }

    /// The instant deadlines are judged at: this replica's clock, never later than the earliest
    /// the API server's clock can read now. Before any answer the earliest instant there is,
    /// so nothing is due (`connect` waits for an answer before anything is decided).
    pub fn now(&self) -> DateTime<Utc> {
        let (at, local) = (Instant::now(), Utc::now());
        self.bounds_at(at)
            .map_or(DateTime::<Utc>::MIN_UTC, |bounds| bounds.judging(local))
    }

    /// The API server's clock now, as bounds (`None` before any answer): the blast-radius
    /// ledger is dated by it, so replicas whose clocks disagree count the same window.
    pub fn server_bounds(&self) -> Option<Bounds> {
        self.bounds_at(Instant::now())
    }

    /// The monotonic instant [`ServerClock::now`] reaches `deadline`: at once for a deadline
    /// already passed; a while from now before any answer.
    pub fn instant_at(&self, deadline: DateTime<Utc>) -> tokio::time::Instant {
        let (at, local) = (Instant::now(), Utc::now());
        let wait = match self.bounds_at(at) {
            Some(bounds) => (deadline - bounds.judging(local))
                .to_std()
                .unwrap_or(Duration::ZERO),
            None => UNKNOWN_RECHECK,
        };
        tokio::time::Instant::from_std(at.checked_add(wait).unwrap_or(at))
    }

    /// Asks the API server for its time once, through `client`: for a client built without
    /// [`ServerClock::layer`].
    pub async fn ask(&self, client: &kube::Client) -> Result<(), kube::Error> {
        let request = Request::get("/version")
            .body(kube::client::Body::from(Vec::new()))
            .map_err(kube::Error::HttpError)?;
        let sent = Instant::now();
        let response = client.send(request).await?;
        self.answered(sent, Instant::now(), response.headers());
        Ok(())
    }

    fn bounds_at(&self, at: Instant) -> Option<Bounds> {
        self.estimator().bounds(at)
    }

    /// The hold of the cap standing now, if any; the gauge is published with it, so a slot
    /// asked for sees the same as the metrics.
    pub fn dispute(&self) -> Option<Dispute> {
        self.publish_dispute(Instant::now())
    }

    /// The hold standing at `at`.
    fn dispute_at(&self, at: Instant) -> Option<Dispute> {
        let hold = (*self.hold())?;
        let until = hold.until(self.span(), at);
        (at < until).then(|| Dispute {
            since: tokio::time::Instant::from_std(hold.since),
            until: tokio::time::Instant::from_std(until),
        })
    }

    fn hold(&self) -> std::sync::MutexGuard<'_, Option<Hold>> {
        self.shared.hold.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn span(&self) -> Duration {
        self.shared.span.get().copied().unwrap_or(MAX_DURATION)
    }

    /// Answers disagreed by up to `apart` at `at`: beyond the tolerance, the cap is held (a
    /// new hold, or the standing one extended).
    fn contradicted(&self, apart: Duration, at: Instant, offset: (f64, f64)) {
        let (offset_lower_seconds, offset_upper_seconds) = offset;
        let apart_seconds = apart.as_secs_f64();
        let tolerated_seconds = TOLERATED_DISAGREEMENT.as_secs_f64();
        if apart <= TOLERATED_DISAGREEMENT {
            debug!(
                apart_seconds,
                tolerated_seconds,
                "the API server's clock disagrees with its earlier answers within the tolerance (API servers behind one address); estimating afresh"
            );
            return;
        }
        let span = self.span();
        let mut hold = self.hold();
        let standing = hold.filter(|hold| at < hold.until(span, at));
        *hold = Some(match standing {
            Some(Hold { since, last }) => Hold {
                since,
                last: last.max(at),
            },
            None => Hold {
                since: at,
                last: at,
            },
        });
        drop(hold);
        if standing.is_some() {
            debug!(
                apart_seconds,
                "the API server's clock disagrees again beyond the tolerance; the hold of the blast-radius cap is extended"
            );
        } else {
            warn!(
                apart_seconds,
                tolerated_seconds,
                offset_lower_seconds,
                offset_upper_seconds,
                "the API server's clock disagrees with its earlier answers beyond the tolerance (API servers behind one address whose clocks disagree, or a clock stepped); the blast-radius cap admits no deletion until answers stay within it for a window"
            );
        }
    }

    /// Sets the dispute gauge as the hold stands at `at`, and logs the end of one.
    fn publish_dispute(&self, at: Instant) -> Option<Dispute> {
        let dispute = self.dispute_at(at);
        let held = dispute.is_some();
        if let Some(metrics) = self.shared.metrics.get() {
            metrics.set_clock_disputed(held);
        }
        if self.shared.held.swap(held, Ordering::Relaxed) && !held {
            info!(
                "the API server's answers have agreed within the tolerance for a window: the blast-radius cap admits deletions again"
            );
        }
        dispute
    }

    fn estimator(&self) -> std::sync::MutexGuard<'_, Estimator> {
        self.shared
            .estimator
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Takes in an answer sent at `sent` and received at `received` with `headers`.
    fn answered(&self, sent: Instant, received: Instant, headers: &HeaderMap) {
        let Some(date) = date_of(headers) else {
            debug!("an answer of the API server without a valid Date header");
            return;
        };
        let observed = self.estimator().observe(Sample {
            sent,
            received,
            date,
        });
        // Judged at its arrival: the instant the estimate compares it at.
        let (at, local) = (sent.max(received), Utc::now());
        let Some(bounds) = self.bounds_at(at) else {
            return;
        };
        let (lower, upper) = bounds.offset(local);
        match observed {
            Observed::First => info!(
                offset_lower_seconds = lower,
                offset_upper_seconds = upper,
                "the API server's clock is known; deadlines are judged by the earlier of it and this replica's"
            ),
            Observed::Contradicts { apart } => self.contradicted(apart, at, (lower, upper)),
            Observed::Agrees => {}
        }
        self.publish(at, local);
    }

    /// Sets the offset metric and the dispute gauge, and logs when the offset crosses
    /// [`WARN_BEYOND`].
    fn publish(&self, at: Instant, local: DateTime<Utc>) {
        self.publish_dispute(at);
        let Some(bounds) = self.bounds_at(at) else {
            return;
        };
        let (lower, upper) = bounds.offset(local);
        if let Some(metrics) = self.shared.metrics.get() {
            metrics.set_clock_offset(lower, upper);
        }
        let skewed = bounds.beyond(local, WARN_BEYOND);
        if self.shared.skewed.swap(skewed, Ordering::Relaxed) == skewed {
            return;
        }
        let bound_seconds = WARN_BEYOND.as_secs();
        if skewed {
            warn!(
                offset_lower_seconds = lower,
                offset_upper_seconds = upper,
                bound_seconds,
                "this replica's clock and the API server's differ by more than the bound; deadlines are judged by the earlier of the two. Fix the node's clock (NTP)"
            );
        } else {
            info!(
                offset_lower_seconds = lower,
                offset_upper_seconds = upper,
                bound_seconds,
                "this replica's clock and the API server's agree within the bound again"
            );
        }
    }
}

/// See [`ServerClock::layer`].
#[derive(Clone)]
pub struct ClockLayer {
    clock: ServerClock,
}

impl<S> Layer<S> for ClockLayer {
    type Service = ClockService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ClockService {
            inner,
            clock: self.clock.clone(),
        }
    }
}

/// The service of [`ClockLayer`]: passes every request on and reads the `Date` of its answer.
#[derive(Clone)]
pub struct ClockService<S> {
    inner: S,
    clock: ServerClock,
}

impl<S, B, R> Service<Request<B>> for ClockService<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // Taken before the request goes out, and `received` once its answer's headers are in:
        // the server wrote its Date in between.
        let sent = Instant::now();
        let answer = self.inner.call(request);
        let clock = self.clock.clone();
        Box::pin(async move {
            let response = answer.await?;
            clock.answered(sent, Instant::now(), response.headers());
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use proptest::prelude::*;

    use super::*;

    fn at(base: Instant, millis: u64) -> Instant {
        base + Duration::from_millis(millis)
    }

    fn utc(seconds: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(seconds, 0).unwrap()
    }

    const EPOCH: i64 = 1_800_000_000;

    #[test]
    fn one_answer_bounds_the_server_by_its_second_and_round_trip() {
        let base = Instant::now();
        let mut estimator = Estimator::default();
        assert_eq!(estimator.bounds(base), None);
        let sample = Sample {
            sent: at(base, 0),
            received: at(base, 200),
            date: utc(EPOCH),
        };
        assert_eq!(estimator.observe(sample), Observed::First);
        let bounds = estimator.bounds(at(base, 200)).unwrap();
        assert_eq!(bounds.earliest, utc(EPOCH));
        // One second of resolution plus the 200 ms round trip, and 0.1 % of it for drift.
        let latest = utc(EPOCH) + TimeDelta::milliseconds(1200);
        assert!(bounds.latest >= latest, "{bounds:?}");
        assert!(
            bounds.latest <= latest + TimeDelta::milliseconds(1),
            "{bounds:?}"
        );
    }

    #[test]
    fn a_local_clock_two_hours_ahead_is_judged_two_hours_back() {
        let base = Instant::now();
        let mut estimator = Estimator::default();
        estimator.observe(Sample {
            sent: base,
            received: at(base, 50),
            date: utc(EPOCH),
        });
        let local = utc(EPOCH + 7200);
        let bounds = estimator.bounds(at(base, 50)).unwrap();
        let (lower, upper) = bounds.offset(local);
        assert!((-7200.0..-7198.0).contains(&upper), "{upper}");
        assert!((-7200.1..=-7200.0).contains(&lower), "{lower}");
        assert_eq!(bounds.judging(local), utc(EPOCH));
        assert!(bounds.beyond(local, WARN_BEYOND));
        // A local clock behind the server is used as it is.
        let behind = utc(EPOCH - 7200);
        assert_eq!(bounds.judging(behind), behind);
        assert!(bounds.beyond(behind, WARN_BEYOND));
        assert!(!bounds.beyond(utc(EPOCH), WARN_BEYOND));
    }

    #[test]
    fn a_contradicting_answer_starts_afresh() {
        let base = Instant::now();
        let mut estimator = Estimator::default();
        estimator.observe(Sample {
            sent: base,
            received: at(base, 10),
            date: utc(EPOCH),
        });
        // Ten seconds later the server says an hour earlier: its clock was stepped back.
        let stepped = Sample {
            sent: at(base, 10_000),
            received: at(base, 10_010),
            date: utc(EPOCH - 3600),
        };
        let Observed::Contradicts { apart } = estimator.observe(stepped) else {
            panic!("a contradiction");
        };
        // An hour and the ten seconds the first server's clock moved on since, and the two
        // answers' uncertainty (each a second, its round trip, and the drift since).
        let (least, most) = (Duration::from_secs(3610), Duration::from_millis(3_611_021));
        assert!(least < apart && apart <= most, "{apart:?}");
        let bounds = estimator.bounds(at(base, 10_010)).unwrap();
        assert_eq!(bounds.earliest, utc(EPOCH - 3600));
    }

    #[test]
    fn the_date_header_parses_as_the_api_server_writes_it() {
        let mut headers = HeaderMap::new();
        assert_eq!(date_of(&headers), None);
        headers.insert(
            http::header::DATE,
            "Tue, 01 Dec 2026 14:42:07 GMT".parse().unwrap(),
        );
        assert_eq!(
            date_of(&headers),
            Some(Utc.with_ymd_and_hms(2026, 12, 1, 14, 42, 7).unwrap())
        );
        headers.insert(http::header::DATE, "yesterday".parse().unwrap());
        assert_eq!(date_of(&headers), None);
    }

    /// The answers of two API servers behind one address, `apart` milliseconds apart, from
    /// `from` milliseconds after `base` for `seconds`: one every 437 ms (so that they fall at
    /// every phase of a second) from each in turn, each with a 2 ms round trip; the first
    /// server's clock reads `EPOCH` at `base`.
    fn balanced(base: Instant, apart: u64, from: u64, seconds: u64) -> Vec<Sample> {
        (0..seconds * 1000 / 437)
            .map(|i| {
                let sent = from + i * 437;
                let offset = if i % 2 == 0 { 0 } else { apart };
                answer(base, sent, offset)
            })
            .collect()
    }

    /// An answer sent `sent` milliseconds after `base`, from a server `offset` milliseconds
    /// ahead of `EPOCH` at `base`, with a 2 ms round trip.
    fn answer(base: Instant, sent: u64, offset: u64) -> Sample {
        let server = utc(EPOCH) + TimeDelta::milliseconds((sent + 1 + offset) as i64);
        Sample {
            sent: at(base, sent),
            received: at(base, sent + 2),
            date: utc(server.timestamp()),
        }
    }

    /// Feeds `samples` to `clock` as the client's layer does.
    fn feed(clock: &ServerClock, samples: &[Sample]) {
        for sample in samples {
            let date = sample.date.format("%a, %d %b %Y %H:%M:%S GMT").to_string();
            let mut headers = HeaderMap::new();
            headers.insert(http::header::DATE, date.parse().unwrap());
            clock.answered(sample.sent, sample.received, &headers);
        }
    }

    /// Through a balancer over two API servers 0.3 s apart, answers contradict each other
    /// (their `Date`s straddle a second), each measured far within what the cap absorbs: no
    /// dispute. (Before, each contradiction held the cap full for a window.)
    #[test]
    fn servers_a_fraction_of_a_second_apart_never_hold_the_cap() {
        let base = Instant::now();
        let samples = balanced(base, 300, 0, 120);
        let mut estimator = Estimator::default();
        let measured: Vec<Duration> = (samples.iter())
            .filter_map(|&sample| match estimator.observe(sample) {
                Observed::Contradicts { apart } => Some(apart),
                _ => None,
            })
            .collect();
        assert!(measured.len() > 10, "they contradict: {measured:?}");
        assert!(
            measured
                .iter()
                .all(|&apart| apart <= TOLERATED_DISAGREEMENT),
            "{measured:?}"
        );
        let clock = ServerClock::default();
        feed(&clock, &samples);
        assert_eq!(clock.dispute_at(samples[samples.len() - 1].received), None);
    }

    /// Whether `registry` says the cap is held.
    fn disputed(registry: &prometheus_client::registry::Registry) -> bool {
        crate::observe::metrics::tests::exposition(registry)
            .lines()
            .any(|line| line == "workspace_gc_blast_radius_clock_disputed 1")
    }

    /// Servers 5 s apart hold the cap: the gauge reads 1 from the first contradiction, without
    /// waiting for a claim to ask for a slot; contradictions that go on extend that hold (one
    /// hold: told once); it ends a window after the last, and the gauge with it. A later
    /// contradiction begins another.
    #[test]
    fn a_dispute_is_published_from_the_contradiction_until_its_hold_ends() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(Metrics::register(&mut registry));
        let window = Duration::from_secs(60);
        let clock = ServerClock::default();
        clock.report_to(metrics, window);
        let base = Instant::now();
        let first = balanced(base, 5000, 0, 1);
        feed(&clock, &first[..2]);
        let since = tokio::time::Instant::from_std(first[1].received);
        let held = clock.dispute_at(first[1].received);
        assert_eq!(held.map(|held| held.since), Some(since));
        assert!(disputed(&registry), "published from the contradiction");
        // Contradictions for a minute more: one hold, extended to a window past the last.
        let more = balanced(base, 5000, 1000, 60);
        feed(&clock, &more);
        let last = more[more.len() - 1].received;
        let held = clock.dispute_at(last).expect("held");
        assert_eq!(held.since, since, "one hold");
        assert_eq!(held.until, tokio::time::Instant::from_std(last + window));
        // Then only the server that answered last: held for the rest of the window.
        let agreeing = |millis| answer(base, millis, 0);
        feed(&clock, &[agreeing(62_000)]);
        assert!(disputed(&registry));
        feed(&clock, &[agreeing(121_000)]);
        assert!(
            !disputed(&registry),
            "the hold ended a window after the last"
        );
        assert_eq!(clock.dispute_at(at(base, 122_100)), None);
        // The other server again: a new hold.
        let again = answer(base, 123_000, 5000);
        feed(&clock, &[again]);
        let held = clock.dispute_at(again.received).expect("held again");
        assert_eq!(held.since, tokio::time::Instant::from_std(again.received));
        assert!(disputed(&registry));
    }

    /// A server whose clock reads `offset` milliseconds ahead of monotonic time `t` (in
    /// milliseconds since `base`, plus `EPOCH`) and runs `ppm` parts per million fast or slow,
    /// and its answers: (sent, round trip, where in the round trip it wrote its Date, in 1/1000).
    #[derive(Debug, Clone)]
    struct Server {
        offset: i64,
        ppm: i64,
        answers: Vec<(u64, u64, u64)>,
    }

    impl Server {
        /// Its clock at `t`, exactly: nanoseconds.
        fn at_nanos(&self, t: u64) -> i128 {
            let t = i128::from(t);
            (i128::from(EPOCH) * 1000 + i128::from(self.offset) + t) * 1_000_000
                + t * i128::from(self.ppm)
        }

        fn at(&self, t: u64) -> DateTime<Utc> {
            let nanos = self.at_nanos(t);
            let seconds = i64::try_from(nanos.div_euclid(1_000_000_000)).unwrap();
            let rest = u32::try_from(nanos.rem_euclid(1_000_000_000)).unwrap();
            Utc.timestamp_opt(seconds, rest).unwrap()
        }

        fn samples(&self, base: Instant) -> impl Iterator<Item = Sample> + '_ {
            self.answers.iter().map(move |&(start, trip, phase)| {
                let written = self.at(start + trip * phase / 1000);
                Sample {
                    sent: at(base, start),
                    received: at(base, start + trip),
                    date: utc(written.timestamp()),
                }
            })
        }

        /// The latest instant an answer arrived.
        fn last(&self) -> u64 {
            self.answers
                .iter()
                .map(|(s, t, _)| s + t)
                .max()
                .unwrap_or(0)
        }
    }

    fn server() -> impl Strategy<Value = Server> {
        (
            -10_000_000i64..10_000_000,
            // Within NTP's largest slew, half the drift the bounds allow for.
            -500i64..=500,
            prop::collection::vec((0u64..600_000, 0u64..5_000, 0u64..=1000), 1..20),
        )
            .prop_map(|(offset, ppm, answers)| Server {
                offset,
                ppm,
                answers,
            })
    }

    proptest! {
        /// Whatever the round trips, the order of the answers, the offset and the drift, the
        /// server's true time lies within the bounds at any instant asked, and no answer of a
        /// steady server is taken for a contradiction.
        #[test]
        fn the_true_server_time_is_always_within_the_bounds(
            server in server(),
            asked in prop::collection::vec(0u64..1_200_000, 1..10),
        ) {
            let base = Instant::now();
            let mut estimator = Estimator::default();
            for sample in server.samples(base) {
                let observed = estimator.observe(sample);
                let contradicts = matches!(observed, Observed::Contradicts { .. });
                prop_assert!(!contradicts, "{:?}", observed);
            }
            for t in asked {
                let bounds = estimator.bounds(at(base, t)).unwrap();
                let truth = server.at(t);
                prop_assert!(bounds.earliest <= truth, "{bounds:?} {truth}");
                prop_assert!(truth < bounds.latest, "{bounds:?} {truth}");
            }
        }

        /// The judging instant is never later than the server's time nor the local clock, and
        /// is the local clock when that is behind the server by more than the uncertainty.
        #[test]
        fn the_judging_instant_never_runs_ahead_of_either_clock(
            server in server(),
            local_offset in -10_000_000i64..10_000_000,
        ) {
            let base = Instant::now();
            let mut estimator = Estimator::default();
            for sample in server.samples(base) {
                estimator.observe(sample);
            }
            let last = server.last();
            let truth = server.at(last);
            let local = truth + TimeDelta::milliseconds(local_offset);
            let judging = estimator.bounds(at(base, last)).unwrap().judging(local);
            prop_assert!(judging <= truth);
            prop_assert!(judging <= local);
            // The last answer alone bounds it within its second and round trip (under 5 s).
            if local <= truth - TimeDelta::seconds(6) {
                prop_assert_eq!(judging, local);
            }
        }

        /// Two honest servers `apart` milliseconds apart behind one address: a contradiction
        /// never measures them closer than they are, and servers up to a second apart whose
        /// answers come within 200 ms are always measured within the tolerance.
        #[test]
        fn a_contradiction_measures_at_least_the_disagreement(
            offset in -10_000_000i64..10_000_000,
            apart in 0i64..10_000,
            answers in prop::collection::vec(
                (0u64..30_000, 0u64..200, 0u64..=1000, any::<bool>()),
                1..60,
            ),
        ) {
            let base = Instant::now();
            let (ahead, behind): (Vec<_>, Vec<_>) = answers.into_iter().partition(|a| a.3);
            let server = |shift: i64, answers: Vec<(u64, u64, u64, bool)>| Server {
                offset: offset + shift,
                ppm: 0,
                answers: answers.into_iter().map(|(s, t, p, _)| (s, t, p)).collect(),
            };
            let (ahead, behind) = (server(apart, ahead), server(0, behind));
            let mut samples: Vec<Sample> = ahead.samples(base).chain(behind.samples(base)).collect();
            samples.sort_by_key(|sample| sample.received);
            let truth = Duration::from_millis(apart.unsigned_abs());
            let mut estimator = Estimator::default();
            for sample in samples {
                if let Observed::Contradicts { apart: measured } = estimator.observe(sample) {
                    prop_assert!(measured >= truth, "{measured:?} {truth:?}");
                    if truth <= Duration::from_secs(1) {
                        prop_assert!(measured <= TOLERATED_DISAGREEMENT, "{measured:?}");
                    }
                }
            }
        }

        /// More answers never widen the bounds at an instant after them all.
        #[test]
        fn more_answers_only_narrow_the_bounds(server in server()) {
            let base = Instant::now();
            let mut estimator = Estimator::default();
            let asked = at(base, 700_000);
            let mut previous: Option<Bounds> = None;
            for sample in server.samples(base) {
                estimator.observe(sample);
                let bounds = estimator.bounds(asked).unwrap();
                if let Some(previous) = previous {
                    prop_assert!(bounds.earliest >= previous.earliest);
                    prop_assert!(bounds.latest <= previous.latest);
                }
                previous = Some(bounds);
            }
        }
    }
}
