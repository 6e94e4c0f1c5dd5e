//! The group commit of the Lease writes that record DELETEs ([`super::Fence::record`]): a
//! DELETE is named as soon as it asks, so a write that another caller sends meanwhile may
//! carry it; one needs no write of its own when a successful write in this holding of the
//! lease named it and carried a ledger of its generation or a later one.
//!
//! A write stages what it carries (the newest ledger asked for, what is in flight); only once
//! it succeeded does this replica take that as written. A write that failed takes back the
//! DELETE it was to carry, so the next write names it no more, and leaves the ledger known and
//! the rounds staged as they stood, so the next write carries them again.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use tokio::time::Instant;

use super::FenceError;
use super::election::Elector;
use super::store::StoreError;
use crate::cluster::in_flight::{InFlight, NotNamed};
use crate::observe::metrics::Operation;

/// How long a Lease write that records a DELETE waits for others decided with it.
const GATHER: Duration = Duration::from_millis(5);

impl Elector {
    /// [`super::Fence::record`] with leader election.
    pub(super) async fn record(
        &self,
        ledger: (&str, u64),
        delete: &InFlight,
    ) -> Result<(), FenceError> {
        self.name(ledger, delete)?;
        let mut held = self.lease.lock().await;
        let written = self.carry(&mut held, ledger.1, delete).await;
        if written.is_err() {
            // Nothing is sent: this DELETE cannot land, and no later write may name it (the
            // next leader would revoke a claim nobody deleted).
            self.names.not_named(delete);
        }
        written
    }

    /// Names `delete` in flight, to be carried by the next write with `ledger` or a newer
    /// one.
    fn name(&self, (ledger, generation): (&str, u64), delete: &InFlight) -> Result<(), NotNamed> {
        self.names.name(delete)?;
        let batch = &mut self.state().batch;
        if batch
            .newest
            .as_ref()
            .is_none_or(|(newest, _)| generation >= *newest)
        {
            batch.newest = Some((generation, ledger.to_owned()));
        }
        Ok(())
    }

    /// Makes sure a successful Lease write in this holding carried `delete` and a ledger of
    /// `generation` or later: one already sent, or one written now.
    async fn carry(
        &self,
        held: &mut Option<Lease>,
        generation: u64,
        delete: &InFlight,
    ) -> Result<(), FenceError> {
        self.check()?;
        if self.state().batch.carried(generation, delete) {
            return Ok(());
        }
        // The DELETEs of one proof round are confirmed within microseconds of each other: a
        // moment's wait lets them all be named before the write that carries them.
        tokio::time::sleep(GATHER).await;
        self.check()?;
        let read = held.as_ref().ok_or(FenceError::NotLeading)?;
        // Staged: what this write carries.
        let (named, (written_generation, ledger)) = {
            let newest = self.state().batch.newest.clone();
            (self.names.on_lease(), newest.ok_or(FenceError::NotLeading)?)
        };
        let spec = json!({ "renewTime": MicroTime(Timestamp::now()) });
        let sent = Instant::now();
        // Bounded: the lock it holds also holds up the renewals.
        let write = self.write(read, spec, Some(&ledger), &named);
        match tokio::time::timeout(self.timing().renew_deadline, write).await {
            Ok(Ok(written)) => {
                *held = Some(written);
                // Only once written: a write that failed carried a delete that is not sent.
                // (One that timed out but landed then reads as changed, and is written back.)
                let mut state = self.state();
                state.renewed = Some(sent);
                state.kept.ledger = Some(ledger);
                state.batch.carried = Some((written_generation, named));
                Ok(())
            }
            Ok(Err(StoreError::Conflict(_))) => {
                self.step_down("another replica wrote the lease");
                Err(FenceError::Lost)
            }
            Ok(Err(StoreError::Api(error))) => {
                self.metrics.api_error(Operation::Lease, &error);
                Err(FenceError::Write(error))
            }
            Err(_) => Err(FenceError::TimedOut),
        }
    }
}
