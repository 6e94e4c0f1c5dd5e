//! workspace-gc: garbage-collects the per-build workspace PersistentVolumeClaims that the
//! jupyter-notebook-validator-operator creates for every Tekton build and never deletes.
//!
//! The folders are the layers of the design, and imports point only downwards:
//!
//! ```text
//! surface  → daemon → cluster → observe → config → decide → contract
//! creator  ─────────→ cluster, config, contract
//! ```
//!
//! - [`contract`]: what the operator and Tekton promise (labels, names, kinds, annotation keys).
//! - [`decide`]: the pure core. Facts in, verdicts out; no I/O, no clock.
//! - [`config`]: the validated configuration, and the label and quantity syntax it checks.
//! - [`observe`]: metrics, the HTTP endpoint for them and the probes, and logging.
//! - [`cluster`]: the edge. API objects become facts here, and [`cluster::writer`] is the only
//!   module that changes claims, volumes and events. Which files change the cluster at all is
//!   stated once, in the code map in ARCHITECTURE.md (tests/docs.rs holds it).
//! - [`daemon`]: the wiring. Watches feed the cache, the scheduler runs reconciles, the limiter
//!   paces them. The limiter and its [`daemon::cap_ledger`] (the blast-radius count) are pure.
//!   The edge carries the ledger only as its annotation text: [`cluster::leader`] keeps it on
//!   the Lease and [`cluster::writer`] records it before a delete.
//! - [`surface`]: the command line, its commands and the audit report.
//! - [`creator`]: the library an operator calls to create a build's claim correctly.

// Bad input warns and keeps the claim; it never takes the daemon down. The compiler holds that:
// no unwrap, expect or panic outside tests, and no unsafe anywhere.
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod cluster;
pub mod config;
pub mod contract;
pub mod creator;
pub mod daemon;
pub mod decide;
pub mod observe;
pub mod surface;
