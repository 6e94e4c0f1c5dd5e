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
//! [`Estimator`] is the pure part: samples in, bounds out. [`ServerClock`] shares one between
//! the tower layer on the client ([`ServerClock::layer`]) that feeds it and the code that
//! judges deadlines ([`ServerClock::now`]), and publishes the offset.

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
    /// It contradicts them: a clock was stepped (the server's, or this machine slept). The
    /// estimate starts again from it alone.
    Contradicts,
}

/// The tightest bounds the samples so far allow. Pure: no clock is read here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Estimator {
    /// The lower and the upper anchor.
    anchors: Option<(Anchor, Anchor)>,
}

impl Estimator {
    /// Takes in one answer.
    pub fn observe(&mut self, sample: Sample) -> Observed {
        let (lower, upper) = anchors_of(sample);
        let Some((old_lower, old_upper)) = self.anchors else {
            self.anchors = Some((lower, upper));
            return Observed::First;
        };
        // Compared where both hold onwards, so that later instants see the same order.
        let then = old_lower.at.max(lower.at);
        let lower = if old_lower.earliest(then) > lower.earliest(then) {
            old_lower
        } else {
            lower
        };
        let then = old_upper.at.max(upper.at);
        let upper = if old_upper.latest(then) < upper.latest(then) {
            old_upper
        } else {
            upper
        };
        let received = sample.sent.max(sample.received);
        if lower.earliest(received) >= upper.latest(received) {
            self.anchors = Some(anchors_of(sample));
            return Observed::Contradicts;
        }
        self.anchors = Some((lower, upper));
        Observed::Agrees
    }

    /// What the server's clock reads at monotonic instant `at`; `None` before any sample.
    pub fn bounds(&self, at: Instant) -> Option<Bounds> {
        let (lower, upper) = self.anchors?;
        Some(Bounds {
            earliest: lower.earliest(at),
            latest: upper.latest(at),
        })
    }
}

/// The lower and upper anchor one answer gives: the server's clock read at least its `Date`
/// when it arrived, and less than a second more when it was sent.
fn anchors_of(sample: Sample) -> (Anchor, Anchor) {
    let lower = Anchor {
        at: sample.sent.max(sample.received),
        server: sample.date,
    };
    let upper = Anchor {
        at: sample.sent.min(sample.received),
        server: (sample.date.checked_add_signed(TimeDelta::seconds(1)))
            .unwrap_or(DateTime::<Utc>::MAX_UTC),
    };
    (lower, upper)
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
    /// When an answer last contradicted the earlier ones: API servers behind one address whose
    /// clocks disagree, or a stepped clock.
    contradicted: Mutex<Option<Instant>>,
}

impl ServerClock {
    /// The tower layer that feeds this clock from every answer of the client it wraps.
    pub fn layer(&self) -> ClockLayer {
        ClockLayer {
            clock: self.clone(),
        }
    }

    /// Publishes the offset to `metrics` from now on (the first call wins).
    pub fn report_to(&self, metrics: Arc<Metrics>) {
        let _ = self.shared.metrics.set(metrics);
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

    /// The monotonic instant an answer last contradicted the earlier ones; `None` if none has.
    pub fn contradicted_at(&self) -> Option<tokio::time::Instant> {
        let at = *self
            .shared
            .contradicted
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        at.map(tokio::time::Instant::from_std)
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
        let (at, local) = (Instant::now(), Utc::now());
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
            Observed::Contradicts => {
                *self
                    .shared
                    .contradicted
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(at);
                warn!(
                    offset_lower_seconds = lower,
                    offset_upper_seconds = upper,
                    "the API server's clock disagrees with its earlier answers (a clock was stepped, or API servers behind one address disagree); estimating afresh, and the blast-radius cap counts its window as full for a window"
                )
            }
            Observed::Agrees => {}
        }
        self.publish(at, local);
    }

    /// Sets the offset metric and logs when the offset crosses [`WARN_BEYOND`].
    fn publish(&self, at: Instant, local: DateTime<Utc>) {
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
        assert_eq!(estimator.observe(stepped), Observed::Contradicts);
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
                prop_assert_ne!(estimator.observe(sample), Observed::Contradicts);
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
