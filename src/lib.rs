//! workspace-gc: garbage-collects the per-build workspace PersistentVolumeClaims that the
//! jupyter-notebook-validator-operator creates for every Tekton build and never deletes.
//!
//! One module per concern; the policy decides from facts without I/O, the writer is the only
//! module that mutates the cluster.

pub mod annotations;
pub mod audit;
pub mod cache;
pub mod cap_ledger;
pub mod cli;
pub mod commands;
pub mod config;
pub mod controller;
pub mod creator;
pub mod facts;
pub mod http;
pub mod labels;
pub mod leader;
pub mod limiter;
pub mod linking;
pub mod live;
pub mod metrics;
pub mod policy;
pub mod quantity;
pub mod quota;
pub mod resources;
pub mod scheduler;
pub mod telemetry;
pub mod watches;
pub mod writer;
