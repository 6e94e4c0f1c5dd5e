//! What the daemon tells the people who run it: Prometheus [`metrics`], the [`http`] endpoint
//! that serves them with the probes, and structured logs ([`telemetry`]). It sits below the
//! cluster edge, because the edge and the daemon both report to it.

pub mod http;
pub mod metrics;
pub mod telemetry;
