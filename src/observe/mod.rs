//! What the daemon tells the people who run it: Prometheus [`metrics`], the [`http`] endpoint
//! that serves them with the probes, and structured logs ([`telemetry`]). It sits below the
//! cluster edge, because the edge and the daemon both report to it. The HTTPS `/metrics` asks
//! the API server who may read it ([`access`]).

pub mod access;
pub mod http;
pub mod metrics;
pub mod telemetry;
