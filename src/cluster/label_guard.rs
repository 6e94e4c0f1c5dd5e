//! Whether the API server holds the label guard (rendered by `src/surface/admission.rs`): the
//! boundary that keeps a claim made without the build-workspace label from being labelled later.
//! Where it is not installed, the claims' `managedFields` record is the only line, and anyone who
//! may write a claim may rewrite that record: the daemon says so in a warning, in
//! `workspace_gc_label_guard_installed` and in the audit's header.
//!
//! Told by the API server itself: the policy and its binding read by name, with the `get` the
//! shipped roles grant on those two names alone. A read that fails counts as not installed:
//! what cannot be seen cannot be vouched for.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::Client;
use kube::api::Api;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::contract::LABEL_GUARD as LABEL_GUARD_NAME;
use crate::observe::metrics::Metrics;

/// How often the daemon reads it again: an admin who installs or removes it is told within this.
const PERIOD: Duration = Duration::from_secs(60);

/// What the API server says of the label guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelGuard {
    /// Its policy, and a binding of it that denies.
    Installed,
    /// Not in force, and why (what is missing).
    Absent(String),
    /// Could not be read (no `get`, the API server unreachable), and why.
    Unreadable(String),
}

impl LabelGuard {
    /// What its absence means, in every message that tells it.
    const ONLY_LINE: &str = "a claim's managedFields record is the only line between a claim \
        labelled after it was made and its deletion, and anyone who may write the claim may \
        rewrite it (docs/security.md#the-label-guard)";

    pub fn installed(&self) -> bool {
        *self == LabelGuard::Installed
    }

    /// One sentence for a log line or the audit's header.
    pub fn describe(&self) -> String {
        match self {
            LabelGuard::Installed => format!(
                "the label guard {LABEL_GUARD_NAME} is installed: the API server refuses adding \
                 the build-workspace label to an existing claim"
            ),
            LabelGuard::Absent(why) => format!(
                "the label guard {LABEL_GUARD_NAME} is not installed ({why}): {}",
                Self::ONLY_LINE
            ),
            LabelGuard::Unreadable(why) => format!(
                "the label guard {LABEL_GUARD_NAME} cannot be read, so it is not known to be \
                 installed ({why}): {}",
                Self::ONLY_LINE
            ),
        }
    }
}

/// Whether `policy` and `binding` put the label guard in force: the binding names the policy
/// and denies. Pure, for the tests.
fn judge(
    policy: Option<&ValidatingAdmissionPolicy>,
    binding: Option<&ValidatingAdmissionPolicyBinding>,
) -> LabelGuard {
    let (Some(_), Some(binding)) = (policy, binding) else {
        return LabelGuard::Absent(
            match (policy.is_some(), binding.is_some()) {
                (false, false) => "no such policy or binding",
                (false, true) => "no such policy",
                _ => "no such binding",
            }
            .to_owned(),
        );
    };
    if binding.spec.policy_name != LABEL_GUARD_NAME {
        return LabelGuard::Absent(format!(
            "its binding names the policy {:?}",
            binding.spec.policy_name
        ));
    }
    if !binding.spec.validation_actions.iter().any(|a| a == "Deny") {
        return LabelGuard::Absent(format!(
            "its binding does not deny (validationActions {:?})",
            binding.spec.validation_actions
        ));
    }
    LabelGuard::Installed
}

/// Reads the label guard's policy and binding.
pub async fn read(client: &Client) -> LabelGuard {
    let policies = Api::<ValidatingAdmissionPolicy>::all(client.clone());
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone());
    let policy = match policies.get_opt(LABEL_GUARD_NAME).await {
        Ok(policy) => policy,
        Err(e) => return LabelGuard::Unreadable(format!("reading its policy: {e}")),
    };
    match bindings.get_opt(LABEL_GUARD_NAME).await {
        Ok(binding) => judge(policy.as_ref(), binding.as_ref()),
        Err(e) => LabelGuard::Unreadable(format!("reading its binding: {e}")),
    }
}

/// Reads it now and every [`PERIOD`] until `stop`: the gauge follows each read, and the log tells
/// the first and every change, a warning while it is not installed.
pub async fn watch(client: Client, metrics: std::sync::Arc<Metrics>, stop: CancellationToken) {
    let mut told: Option<LabelGuard> = None;
    loop {
        let now = read(&client).await;
        metrics.set_label_guard_installed(now.installed());
        if told.as_ref() != Some(&now) {
            if now.installed() {
                info!("{}", now.describe());
            } else {
                warn!("{}", now.describe());
            }
            told = Some(now);
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(PERIOD) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBindingSpec;
    use kube::api::ObjectMeta;

    use super::*;

    #[test]
    fn installed_only_with_its_policy_and_a_binding_that_denies() {
        let policy = ValidatingAdmissionPolicy {
            metadata: ObjectMeta {
                name: Some(LABEL_GUARD_NAME.into()),
                ..ObjectMeta::default()
            },
            ..ValidatingAdmissionPolicy::default()
        };
        let binding = ValidatingAdmissionPolicyBinding {
            metadata: policy.metadata.clone(),
            spec: ValidatingAdmissionPolicyBindingSpec {
                policy_name: LABEL_GUARD_NAME.into(),
                validation_actions: vec!["Deny".into()],
                ..ValidatingAdmissionPolicyBindingSpec::default()
            },
        };
        assert_eq!(judge(Some(&policy), Some(&binding)), LabelGuard::Installed);
        assert!(matches!(judge(None, Some(&binding)), LabelGuard::Absent(_)));
        assert!(matches!(judge(Some(&policy), None), LabelGuard::Absent(_)));
        let mut warns = binding.clone();
        warns.spec.validation_actions = vec!["Warn".into()];
        assert!(matches!(
            judge(Some(&policy), Some(&warns)),
            LabelGuard::Absent(why) if why.contains("does not deny")
        ));
        let mut other = binding;
        other.spec.policy_name = "something-else".into();
        assert!(matches!(
            judge(Some(&policy), Some(&other)),
            LabelGuard::Absent(_)
        ));
        let unread = LabelGuard::Unreadable("forbidden".into()).describe();
        assert!(unread.contains("not known") && unread.contains("the only line"));
        let absent = LabelGuard::Absent("no such policy".into()).describe();
        assert!(absent.contains("not installed") && absent.contains("the only line"));
    }
}
