//! The daemon's wiring: the [`controller`] feeds watch events into the cache and reconciles the
//! claims they affect, the [`scheduler`] runs each claim's reconcile now or at its recheck
//! instant, and the [`limiter`] paces deletes and holds the blast-radius cap, counted in the
//! [`cap_ledger`]. Both are pure: the caller passes the instant.

pub mod cap_ledger;
pub mod controller;
pub mod limiter;
pub mod proof;
pub mod scheduler;
