//! Deletion pacing and the blast-radius cap: at most `per_second` deletions a second, and at
//! most `max_per_window` in any rolling `window`, so that a wrong selector cannot wipe a cluster.
//! Pure: the caller passes the instant.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The answer to a request for a deletion slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Send the delete at this instant (now, or later to keep the pace).
    At(Instant),
    /// The cap is reached: nothing may be deleted before this instant.
    Capped { until: Instant },
}

#[derive(Debug)]
pub struct Limiter {
    interval: Duration,
    max_per_window: usize,
    window: Duration,
    next_slot: Option<Instant>,
    /// Slots granted within the last window, oldest first.
    granted: VecDeque<Instant>,
}

impl Limiter {
    pub fn new(per_second: f64, max_per_window: u32, window: Duration) -> Self {
        // Configuration validation guarantees a finite positive rate; clamp anyway so no input
        // can panic here.
        let interval = Duration::try_from_secs_f64(1.0 / per_second).unwrap_or(Duration::ZERO);
        Self {
            interval,
            max_per_window: usize::try_from(max_per_window).unwrap_or(usize::MAX),
            window,
            next_slot: None,
            granted: VecDeque::new(),
        }
    }

    /// Reserves a deletion slot, or says until when the cap holds.
    pub fn reserve(&mut self, now: Instant) -> Admission {
        self.forget_before(now);
        if self.granted.len() >= self.max_per_window {
            let oldest = self.granted.front().copied().unwrap_or(now);
            return Admission::Capped {
                until: oldest + self.window,
            };
        }
        let slot = self.next_slot.map_or(now, |next| next.max(now));
        self.next_slot = Some(slot + self.interval);
        self.granted.push_back(slot);
        Admission::At(slot)
    }

    /// Returns a slot that was not used (the live re-check kept the claim), so it does not
    /// count against the cap.
    pub fn release(&mut self, slot: Instant) {
        if let Some(position) = self.granted.iter().rposition(|&s| s == slot) {
            self.granted.remove(position);
        }
    }

    /// Whether the cap is reached right now.
    pub fn capped(&mut self, now: Instant) -> bool {
        self.forget_before(now);
        self.granted.len() >= self.max_per_window
    }

    fn forget_before(&mut self, now: Instant) {
        while let Some(&oldest) = self.granted.front() {
            if oldest + self.window <= now {
                self.granted.pop_front();
            } else {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paces_deletions() {
        let now = Instant::now();
        let mut limiter = Limiter::new(4.0, 100, Duration::from_secs(600));
        assert_eq!(limiter.reserve(now), Admission::At(now));
        assert_eq!(
            limiter.reserve(now),
            Admission::At(now + Duration::from_millis(250))
        );
        assert_eq!(
            limiter.reserve(now + Duration::from_secs(5)),
            Admission::At(now + Duration::from_secs(5))
        );
    }

    #[test]
    fn caps_within_the_window_and_resumes_after_it() {
        let now = Instant::now();
        let window = Duration::from_secs(60);
        let mut limiter = Limiter::new(1000.0, 3, window);
        for _ in 0..3 {
            assert!(matches!(limiter.reserve(now), Admission::At(_)));
        }
        assert!(limiter.capped(now));
        assert_eq!(
            limiter.reserve(now + Duration::from_secs(30)),
            Admission::Capped {
                until: now + window
            }
        );
        assert!(matches!(limiter.reserve(now + window), Admission::At(_)));
    }

    #[test]
    fn released_slots_do_not_count() {
        let now = Instant::now();
        let mut limiter = Limiter::new(1000.0, 1, Duration::from_secs(60));
        let Admission::At(slot) = limiter.reserve(now) else {
            panic!("first reservation must be admitted")
        };
        limiter.release(slot);
        assert!(!limiter.capped(now));
        assert!(matches!(limiter.reserve(now), Admission::At(_)));
    }
}
