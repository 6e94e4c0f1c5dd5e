//! The integration suites that need a real API server but no node: one test binary, so the
//! test kit, the daemon's library and the suites link once rather than once per suite. Each
//! module is one suite; `cargo test --test cluster -- MODULE::` runs one (scripts/test runs the
//! API-contract modules this way on each older Kubernetes release).
//!
//! Their tests share one control plane ([`testkit::ControlPlane::shared`]), each in namespaces
//! of its own; a test that changes cluster-wide state, or needs a controller the shared one does
//! not run, starts a dedicated one. Cluster-scoped objects a test creates on the shared one
//! carry names of their own (the admission guard's policies, ClusterRoles and bindings), and
//! every daemon a test runs watches only that test's namespaces.
//!
//! - `control_plane`: the test control plane itself; if it fails, the rest says little;
//! - `safety`, `collector`, `retention`, `quota`, `creator`: what the daemon deletes and keeps;
//! - `provenance`: which labelled claims are build workspaces, by their `managedFields`;
//! - `graphs_cluster`: generated object graphs, the binary's audit against the oracle;
//! - `faults`, `fault_tools`, `clock`, `leadership`, `lease_tamper`: faults, the fault tools,
//!   clocks, leader election and the blast-radius cap;
//! - `share`: the blast-radius cap's share of the candidates;
//! - `delete_protocol`: the delete protocol's liveness and cost under the answers of a real API
//!   server and the hops before it, as the shipped identity;
//! - `unused_condition`: Kubernetes 1.37's `Unused` claim condition and a late DELETE (skipped
//!   before 1.37);
//! - `served_versions`, `identity`: what the daemon asks the server, and as whom;
//! - `admission`, `metrics_https`, `helm`: the admission guard, the HTTPS metrics, the chart.

mod admission;
mod clock;
mod collector;
mod control_plane;
mod creator;
mod delete_protocol;
mod fault_tools;
mod faults;
mod graphs_cluster;
mod ha;
mod helm;
mod identity;
mod leadership;
mod lease_tamper;
mod metrics_https;
mod provenance;
mod provenance_record;
mod quota;
mod retention;
mod safety;
mod served_versions;
mod share;
mod unused_condition;
mod upgrade;
