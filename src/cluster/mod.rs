//! The cluster edge: everything that talks to the API server. API objects are converted into
//! the core's facts ([`resources`]), watched into the cache ([`watches`], [`cache`]) and read
//! live before a delete ([`live`]), or proven fresh by the small reads of [`progress`]. The
//! owner kinds are read at the version discovery says is served ([`served`]).
//! [`writer`] is the only module that changes claims, volumes and events, and only while
//! [`leader`] holds the Lease, which [`leader`] writes and which also carries the blast-radius
//! count ([`crate::daemon::cap_ledger`]). The code map in ARCHITECTURE.md names every file
//! that changes the cluster.
//! [`in_flight`] is the registry of the DELETEs that may still land, which the Lease names.
//! [`server_clock`] tells the API server's time from its answers: deadlines are judged by it.
//! [`label_guard`] tells whether the API server holds the label guard.

pub mod adapter;
pub mod cache;
pub mod in_flight;
pub mod label_guard;
pub mod leader;
pub mod live;
pub mod ports;
pub mod progress;
pub mod resources;
pub mod served;
pub mod server_clock;
pub mod watches;
pub mod writer;
