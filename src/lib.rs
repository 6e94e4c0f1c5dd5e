//! workspace-gc: garbage-collects the per-build workspace PersistentVolumeClaims that the
//! jupyter-notebook-validator-operator creates for every Tekton build and never deletes.
//!
//! One module per concern; the policy decides from facts without I/O, the writer is the only
//! module that mutates the cluster.

pub mod annotations;
pub mod cli;
pub mod config;
pub mod facts;
pub mod labels;
pub mod policy;
pub mod quantity;
