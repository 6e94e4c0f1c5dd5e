//! The admission guard: a ValidatingAdmissionPolicy and its binding that make the API server
//! itself refuse what workspace-gc must never do, whatever its code or its token does. RBAC
//! cannot say "delete only labelled claims"; a policy sees `oldObject` and `request.options`
//! on a DELETE, so it can.
//!
//! It guards PersistentVolumes too: the daemon may delete only a `Released` volume carrying the
//! UID of the claim it deleted (`deletion.released_volume_ttl`), and may change a volume only
//! by writing or removing that mark, equal to the volume's claimRef UID.
//!
//! The one change it lets the daemon make to a claim is a new value of its revocation
//! annotation ([`REVOKED`], or [`REVOKED_UNDER_PREFIX`] as versions before wrote it): writing
//! it gives the claim a new resourceVersion, so a DELETE that got no answer fails its
//! precondition whenever it arrives. A write of the value already there would store nothing.
//!
//! With leader election, a second policy, the fence, takes the daemon's Lease as its parameter
//! and lets a claim or volume DELETE through only from the pod the Lease names: a
//! ServiceAccount token bound to a pod carries the pod's name in the user's extra, and the
//! daemon's Lease holder identity is its pod name (`POD_NAME`, from the downward API). So a
//! DELETE that a paused ex-leader sent, or that a proxy held, is refused once the API server
//! has seen the new holder's Lease (docs/security.md states the window).
//!
//! A third policy, the label guard, on by default, refuses adding the build-workspace label to
//! an existing claim by anyone but the identities listed in `provenance.label_writers` (none by
//! default: the operator and `workspace-gc create` label a claim in the write that makes it): a
//! claim is a build workspace when it is made one. It applies to every user, not only the
//! daemon, and it is the boundary: the provenance rule (docs/policy.md#provenance) reads
//! `managedFields`, which anyone who may write the claim may rewrite. Where it is not installed
//! the daemon says so (`src/cluster/label_guard.rs`).
//!
//! Rendered from the same configuration as the daemon (`workspace-gc admission-policy`), so
//! the two agree by construction; the shipped copy in `manifests/components/admission-guard`
//! is checked against the shipped `config.toml` by tests/cluster/admission.rs.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ParamKind, ParamRef,
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec, Validation, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::api::ObjectMeta;

use crate::config::labels::{cel_list, cel_string};
use crate::config::{LeaderElectionConfig, SelectorConfig};
use crate::contract::annotations::{DELETED_CLAIM_UID, REVOKED, REVOKED_UNDER_PREFIX};
use crate::contract::labels::BUILD_WORKSPACE;

/// The name of the policy and of its binding.
pub const NAME: &str = "workspace-gc-guard";

/// The name of the fence's policy and of its binding.
pub const FENCE_NAME: &str = "workspace-gc-fence";

/// The name of the label guard's policy and of its binding.
pub const LABEL_GUARD_NAME: &str = crate::contract::LABEL_GUARD;

/// Where the API server puts the name of the pod a ServiceAccount token is bound to.
const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";

/// The Lease the fence reads: the daemon's, where its leader election keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub name: String,
    pub namespace: String,
}

impl Lease {
    /// The Lease of a daemon with `leader_election` running as `service_account`
    /// (`NAMESPACE:NAME`): its pods run in the account's namespace, which is the Lease's when
    /// `lease_namespace` is empty. `None` with leader election off: there is no Lease, and the
    /// only replica must not be fenced out.
    pub fn of(leader_election: &LeaderElectionConfig, service_account: &str) -> Option<Lease> {
        let pod_namespace = service_account
            .split_once(':')
            .map(|(namespace, _)| namespace);
        leader_election.enabled.then(|| Lease {
            name: leader_election.lease_name.clone(),
            namespace: leader_election.lease_namespace(pod_namespace).to_owned(),
        })
    }
}

/// The identity whose requests the guard checks, as `NAMESPACE:NAME` of a ServiceAccount.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "workspace-gc:workspace-gc";

/// Every message starts with this, then the rule's name: a refusal names the rule broken.
const PREFIX: &str = "workspace-gc admission guard";

/// The annotation on the guard's policy that says what it was printed for: the selector's
/// `label_selector`, `namespaces` and `exclude_namespaces`, and the `service_account`, as a
/// JSON object; on the label guard's, its `label_writers`. The chart checks a guard against
/// its configuration by this key, so the rules' messages can be reworded freely.
pub const PRINTED_FOR: &str = "admission.workspace-gc.mlops.dev/printed-for";

/// [`PRINTED_FOR`]'s value. Its keys are sorted (serde_json's map), as Helm's `toJson` writes
/// a dict's: the chart writes its release namespace's ServiceAccount into the shipped copy, and
/// what it writes is then what the binary prints for that ServiceAccount.
fn printed_for(selector: &SelectorConfig, service_account: &str) -> String {
    serde_json::json!({
        "label_selector": selector.label_selector.to_string(),
        "namespaces": selector.namespaces,
        "exclude_namespaces": selector.exclude_namespaces,
        "service_account": service_account,
    })
    .to_string()
}

/// The match condition that limits a policy to the daemon's ServiceAccount.
fn only_the_daemon(service_account: &str) -> MatchCondition {
    let username = format!("system:serviceaccount:{service_account}");
    MatchCondition {
        name: "workspace-gc-service-account".into(),
        expression: format!("request.userInfo.username == {}", cel_string(&username)),
    }
}

/// A validation named `name`: a refusal says the rule broken and why.
fn rule(name: &str, expression: String, why: String) -> Validation {
    Validation {
        expression,
        message: Some(format!("{PREFIX}: rule {name}: {why}")),
        // 403, as RBAC's refusals: the request is not allowed, not malformed.
        reason: Some("Forbidden".into()),
        ..Validation::default()
    }
}

/// `operations` on claims and volumes (`subresources` too, or not).
fn claims_and_volumes(operations: &[&str], subresources: bool) -> MatchResources {
    let resources: &[&str] = if subresources {
        &[
            "persistentvolumeclaims",
            "persistentvolumeclaims/*",
            "persistentvolumes",
            "persistentvolumes/*",
        ]
    } else {
        &["persistentvolumeclaims", "persistentvolumes"]
    };
    MatchResources {
        resource_rules: Some(vec![NamedRuleWithOperations {
            api_groups: Some(vec![String::new()]),
            api_versions: Some(vec!["*".into()]),
            resources: Some(resources.iter().map(|&r| r.to_owned()).collect()),
            operations: Some(operations.iter().map(|&o| o.to_owned()).collect()),
            ..NamedRuleWithOperations::default()
        }]),
        ..MatchResources::default()
    }
}

fn metadata(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..ObjectMeta::default()
    }
}

/// The policy and its binding for the daemon's `selector` configuration and ServiceAccount.
pub fn guard(
    selector: &SelectorConfig,
    service_account: &str,
) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let delete = |condition: String| format!("request.operation != 'DELETE' || ({condition})");
    // Each rule is about claims or about volumes; the UID precondition about both.
    let of = |resource: &str, condition: String| {
        format!("request.resource.resource != '{resource}' || ({condition})")
    };
    let claims = |condition: String| of("persistentvolumeclaims", condition);
    let volumes = |condition: String| of("persistentvolumes", condition);
    let mark = cel_string(DELETED_CLAIM_UID);
    // The revocation as this version writes it, and as versions before wrote it under the
    // prefix: a rolling upgrade runs both. Only a write that changes the value: one that writes
    // the value already there (anyone who may annotate the claim can pre-set it) stores
    // nothing, and the DELETE it was to revoke can still land.
    let (revoked, before) = (cel_string(REVOKED), cel_string(REVOKED_UNDER_PREFIX));
    let revocation = |key: &str| {
        format!(
            "({key} in variables.newAnnotations && variables.newAnnotations[{key}] != '' \
             && !({key} in variables.annotations \
             && variables.annotations[{key}] == variables.newAnnotations[{key}]))"
        )
    };
    let (writes_revoked, writes_before) = (revocation(&revoked), revocation(&before));
    let mut validations = vec![
        // The revocation only gives the claim a new resourceVersion. It is not limited to the
        // claims the selector matches: a claim whose label was taken off while a DELETE of it
        // was unanswered must still be revoked.
        rule(
            "revocation-only",
            claims(format!(
                "request.operation != 'UPDATE' || ((!has(request.subResource) \
                 || request.subResource == '') \
                 && object.spec == oldObject.spec \
                 && variables.newLabels == variables.labels \
                 && variables.newFinalizers == variables.finalizers \
                 && variables.newOwners == variables.owners \
                 && ({writes_revoked} || {writes_before}) \
                 && variables.newAnnotations.all(k, k == {revoked} || k == {before} \
                 || (k in variables.annotations \
                 && variables.annotations[k] == variables.newAnnotations[k])) \
                 && variables.annotations.all(k, k == {revoked} || k == {before} \
                 || k in variables.newAnnotations))"
            )),
            format!(
                "workspace-gc changes a claim only to write a new value of its revocation \
                 annotation {REVOKED}: nothing else in its spec, labels, annotations, finalizers \
                 or owners"
            ),
        ),
        // A DeleteCollection is admitted item by item as a DELETE with the collection's
        // options, which carry no UID: this rule refuses every item.
        rule(
            "uid-precondition",
            delete(
                "has(request.options.preconditions) && has(request.options.preconditions.uid) \
                 && request.options.preconditions.uid != ''"
                    .into(),
            ),
            "a delete must carry a UID precondition (preconditions.uid)".into(),
        ),
        rule(
            "volume-marked",
            volumes(delete(format!(
                "{mark} in variables.annotations && has(oldObject.spec.claimRef) \
                 && has(oldObject.spec.claimRef.uid) \
                 && oldObject.spec.claimRef.uid == variables.annotations[{mark}]"
            ))),
            format!(
                "a volume is deleted only when its claimRef UID is the claim workspace-gc \
                 deleted ({DELETED_CLAIM_UID})"
            ),
        ),
        rule(
            "volume-released",
            volumes(delete(
                "has(oldObject.status) && has(oldObject.status.phase) \
                 && oldObject.status.phase == 'Released'"
                    .into(),
            )),
            "a volume is deleted only when Released, bound to nothing".into(),
        ),
        rule(
            "volume-mark-only",
            volumes(format!(
                "request.operation != 'UPDATE' || ((!has(request.subResource) \
                 || request.subResource == '') \
                 && object.spec == oldObject.spec \
                 && (!({mark} in variables.newAnnotations) \
                 || (has(oldObject.spec.claimRef) && has(oldObject.spec.claimRef.uid) \
                 && variables.newAnnotations[{mark}] == oldObject.spec.claimRef.uid)))"
            )),
            format!(
                "workspace-gc changes a volume only to write or remove {DELETED_CLAIM_UID}, \
                 equal to its claimRef UID"
            ),
        ),
    ];
    if !selector.namespaces.is_empty() {
        validations.push(rule(
            "watched-namespace",
            claims(delete(format!(
                "request.namespace in {}",
                cel_list(&selector.namespaces)
            ))),
            format!(
                "claims are deleted only in the watched namespaces {} (selector.namespaces)",
                selector.namespaces.join(", ")
            ),
        ));
    }
    if !selector.exclude_namespaces.is_empty() {
        validations.push(rule(
            "excluded-namespace",
            claims(delete(format!(
                "!(request.namespace in {})",
                cel_list(&selector.exclude_namespaces)
            ))),
            format!(
                "no claim is deleted in the excluded namespaces {} (selector.exclude_namespaces)",
                selector.exclude_namespaces.join(", ")
            ),
        ));
    }
    let label_selector = &selector.label_selector;
    validations.push(rule(
        "label-selector",
        claims(delete(label_selector.to_cel("variables.labels"))),
        format!(
            "only claims matching the label selector {label_selector} are deleted \
             (selector.label_selector)"
        ),
    ));

    // Read only on an UPDATE, where `object` is the claim or volume as it would be.
    let of_object = |name: &str, field: &str, empty: &str| Variable {
        name: name.into(),
        expression: format!("has(object.metadata.{field}) ? object.metadata.{field} : {empty}"),
    };
    let of_old = |name: &str, field: &str, empty: &str| Variable {
        name: name.into(),
        expression: format!(
            "has(oldObject.metadata.{field}) ? oldObject.metadata.{field} : {empty}"
        ),
    };
    let policy = ValidatingAdmissionPolicy {
        metadata: ObjectMeta {
            annotations: Some(
                [(
                    PRINTED_FOR.to_owned(),
                    printed_for(selector, service_account),
                )]
                .into(),
            ),
            ..metadata(NAME)
        },
        spec: Some(ValidatingAdmissionPolicySpec {
            // A policy that cannot be evaluated refuses: when in doubt, keep the claim.
            failure_policy: Some("Fail".into()),
            // Subresources too: workspace-gc changes no claim's or volume's status. CREATE is
            // not matched: the creator creates claims under its own identity.
            match_constraints: Some(claims_and_volumes(&["DELETE", "UPDATE"], true)),
            match_conditions: Some(vec![only_the_daemon(service_account)]),
            variables: Some(vec![
                of_old("labels", "labels", "{}"),
                of_old("annotations", "annotations", "{}"),
                of_object("newAnnotations", "annotations", "{}"),
                of_object("newLabels", "labels", "{}"),
                of_old("finalizers", "finalizers", "[]"),
                of_object("newFinalizers", "finalizers", "[]"),
                of_old("owners", "ownerReferences", "[]"),
                of_object("newOwners", "ownerReferences", "[]"),
            ]),
            validations: Some(validations),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata: metadata(NAME),
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: NAME.into(),
            validation_actions: vec!["Deny".into()],
            ..ValidatingAdmissionPolicyBindingSpec::default()
        },
    };
    (policy, binding)
}

/// The fence: a policy whose parameter is the daemon's `lease`, and its binding. A claim or
/// volume DELETE by the daemon's ServiceAccount passes only with a token bound to the pod the
/// Lease names as its holder; a token bound to no pod, and a Lease with no holder, refuse.
///
/// A missing Lease opens the fence (`parameterNotFoundAction: Allow`): the API server looks the
/// parameter up before it evaluates the match condition on the user, so `Deny` would refuse
/// every claim and volume DELETE in the cluster, from anyone, until the Lease exists. The
/// daemon's own fence still holds then. A separate policy, because a binding whose parameter
/// is missing skips every rule of its policy: the guard's must not depend on the Lease.
pub fn fence(
    lease: &Lease,
    service_account: &str,
) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let pod = cel_string(POD_NAME_EXTRA);
    let policy = ValidatingAdmissionPolicy {
        metadata: metadata(FENCE_NAME),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            param_kind: Some(ParamKind {
                api_version: Some("coordination.k8s.io/v1".into()),
                kind: Some("Lease".into()),
            }),
            // Only deletes: a revocation from any replica is harmless (it only makes a DELETE
            // fail its precondition), and must pass from one that has lost the Lease.
            match_constraints: Some(claims_and_volumes(&["DELETE"], false)),
            match_conditions: Some(vec![only_the_daemon(service_account)]),
            variables: Some(vec![Variable {
                name: "pod".into(),
                expression: format!(
                    "has(request.userInfo.extra) && {pod} in request.userInfo.extra \
                     ? request.userInfo.extra[{pod}] : []"
                ),
            }]),
            validations: Some(vec![rule(
                "lease-holder",
                "has(params.spec) && has(params.spec.holderIdentity) \
                 && params.spec.holderIdentity != '' \
                 && variables.pod == [params.spec.holderIdentity]"
                    .into(),
                "a claim or volume is deleted only by the pod that holds the Lease \
                 (leader_election), with a token bound to that pod"
                    .into(),
            )]),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata: metadata(FENCE_NAME),
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: FENCE_NAME.into(),
            param_ref: Some(ParamRef {
                name: Some(lease.name.clone()),
                namespace: Some(lease.namespace.clone()),
                parameter_not_found_action: Some("Allow".into()),
                selector: None,
            }),
            validation_actions: vec!["Deny".into()],
            ..ValidatingAdmissionPolicyBindingSpec::default()
        },
    };
    (policy, binding)
}

/// The label key every namespace carries, its name (since Kubernetes 1.22): what a binding's
/// namespace selector matches to name namespaces.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The label guard: a policy and its binding that refuse an UPDATE of a claim (a patch, an
/// apply, a replace) that adds the build-workspace label, absent or of another value before,
/// by any user but `writers` (usernames, `system:serviceaccount:NS:NAME` for a
/// ServiceAccount); with no writers, by anyone. Creating a labelled claim is not matched: the
/// operator and the creator make their claims labelled. Every other update of a claim is
/// outside it, by its match condition. On by default: it is the boundary the provenance rule
/// (docs/policy.md#provenance) cannot be, since anyone who may write a claim may rewrite its
/// record.
///
/// Its binding covers the namespaces whose claims the daemon may delete (`selector`'s
/// `namespaces`, none of its `exclude_namespaces`): a label elsewhere is none of its business,
/// and a namespaced install's guard must not reach into other teams' namespaces.
pub fn label_guard(
    selector: &SelectorConfig,
    writers: &[String],
) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let (key, value) = BUILD_WORKSPACE;
    let labelled = |object: &str| {
        format!(
            "has({object}.metadata.labels) && {k} in {object}.metadata.labels \
             && {object}.metadata.labels[{k}] == {v}",
            k = cel_string(key),
            v = cel_string(value),
        )
    };
    let who = if writers.is_empty() {
        "nobody (provenance.label_writers is empty)".to_owned()
    } else {
        format!("only {} (provenance.label_writers)", writers.join(", "))
    };
    let policy = ValidatingAdmissionPolicy {
        metadata: ObjectMeta {
            // What its rule depends on, for the chart to check as it checks the guard's.
            annotations: Some(
                [(
                    PRINTED_FOR.to_owned(),
                    serde_json::json!({ "label_writers": writers }).to_string(),
                )]
                .into(),
            ),
            ..metadata(LABEL_GUARD_NAME)
        },
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec![String::new()]),
                    api_versions: Some(vec!["*".into()]),
                    resources: Some(vec!["persistentvolumeclaims".into()]),
                    operations: Some(vec!["UPDATE".into()]),
                    ..NamedRuleWithOperations::default()
                }]),
                ..MatchResources::default()
            }),
            match_conditions: Some(vec![MatchCondition {
                name: "adds-the-build-workspace-label".into(),
                expression: format!("!({}) && ({})", labelled("oldObject"), labelled("object")),
            }]),
            validations: Some(vec![rule(
                "label-only-at-creation",
                format!("request.userInfo.username in {}", cel_list(writers)),
                format!(
                    "the label {key}={value} is added to an existing claim by {who}: a claim \
                     is a build workspace when it is made one. Create the claim with the label, \
                     or list the identity that adds it in provenance.label_writers and print \
                     the guard again (workspace-gc admission-policy)"
                ),
            )]),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    };
    let expression = |operator: &str, namespaces: &[String]| LabelSelectorRequirement {
        key: NAMESPACE_NAME_LABEL.into(),
        operator: operator.into(),
        values: Some(namespaces.to_vec()),
    };
    let mut scope = Vec::new();
    if !selector.namespaces.is_empty() {
        scope.push(expression("In", &selector.namespaces));
    }
    if !selector.exclude_namespaces.is_empty() {
        scope.push(expression("NotIn", &selector.exclude_namespaces));
    }
    let binding = ValidatingAdmissionPolicyBinding {
        metadata: metadata(LABEL_GUARD_NAME),
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: LABEL_GUARD_NAME.into(),
            validation_actions: vec!["Deny".into()],
            match_resources: (!scope.is_empty()).then(|| MatchResources {
                namespace_selector: Some(LabelSelector {
                    match_expressions: Some(scope),
                    ..LabelSelector::default()
                }),
                ..MatchResources::default()
            }),
            ..ValidatingAdmissionPolicyBindingSpec::default()
        },
    };
    (policy, binding)
}

fn yaml(object: &impl serde::Serialize) -> Result<String, String> {
    serde_saphyr::to_string(object).map_err(|e| e.to_string())
}

/// The guard as the YAML `workspace-gc admission-policy` prints and the component ships: the
/// guard, then the fence on `lease` when the daemon elects a leader, then the label guard, always
/// (`label_writers` are the only identities it lets add the label to an existing claim).
pub fn render(
    selector: &SelectorConfig,
    lease: Option<&Lease>,
    service_account: &str,
    label_writers: &[String],
) -> Result<String, String> {
    let (policy, binding) = guard(selector, service_account);
    let mut text = format!(
        "# Generated by `workspace-gc admission-policy` from the configuration; do not edit.\n\
         # For ServiceAccount {service_account}, the API server refuses every claim delete the\n\
         # daemon must never make, and every change of a claim but its revocation annotation;\n\
         # every volume delete but of a Released one its mark names, and every volume change\n\
         # but that mark.{}\n{}---\n{}",
        match lease {
            Some(lease) => format!(
                "\n# The fence: a claim or volume delete only from the pod that holds the Lease\n\
                 # {}/{} (leader_election).",
                lease.namespace, lease.name
            ),
            None => "\n# No fence: leader election is off, so there is no Lease.".to_owned(),
        },
        yaml(&policy)?,
        yaml(&binding)?
    );
    if let Some(lease) = lease {
        let (policy, binding) = fence(lease, service_account);
        text.push_str(&format!("---\n{}---\n{}", yaml(&policy)?, yaml(&binding)?));
    }
    let (policy, binding) = label_guard(selector, label_writers);
    let writers = if label_writers.is_empty() {
        "nobody".to_owned()
    } else {
        label_writers.join(", ")
    };
    text.push_str(&format!(
        "---\n# The label guard: {writers} may add the build-workspace label to an existing claim\n\
         # (provenance.label_writers); creating a claim with it stays open to all.\n{}---\n{}",
        yaml(&policy)?,
        yaml(&binding)?
    ));
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn the_fence_reads_the_daemons_lease_and_none_without_leader_election() {
        let mut election = Config::default().leader_election;
        let lease = |election: &LeaderElectionConfig| Lease::of(election, "gc:workspace-gc");
        // Its pods run in the ServiceAccount's namespace, which is the Lease's by default.
        assert_eq!(
            lease(&election),
            Some(Lease {
                name: "workspace-gc".into(),
                namespace: "gc".into()
            })
        );
        election.lease_namespace = Some("leases".into());
        election.lease_name = "gc-lease".into();
        assert_eq!(
            lease(&election),
            Some(Lease {
                name: "gc-lease".into(),
                namespace: "leases".into()
            })
        );
        election.enabled = false;
        assert_eq!(lease(&election), None);
    }

    #[test]
    fn the_guard_comes_with_the_fence_only_with_leader_election() {
        let selector = Config::default().selector;
        let lease = Lease {
            name: "workspace-gc".into(),
            namespace: "gc".into(),
        };
        let fenced = render(&selector, Some(&lease), "gc:workspace-gc", &[]).unwrap();
        let unfenced = render(&selector, None, "gc:workspace-gc", &[]).unwrap();
        // The label guard's two after them, in both.
        assert_eq!(fenced.matches("\nkind: ").count(), 6, "{fenced}");
        assert_eq!(unfenced.matches("\nkind: ").count(), 4, "{unfenced}");
        assert!(fenced.contains("rule lease-holder") && !unfenced.contains("rule lease-holder"));
        assert!(
            fenced.contains("parameterNotFoundAction: Allow"),
            "{fenced}"
        );
    }

    #[test]
    fn the_guard_says_what_it_was_printed_for_with_its_keys_sorted() {
        let mut selector = Config::default().selector;
        selector.namespaces = vec!["ml-a".into(), "ml-b".into()];
        let (policy, _) = guard(&selector, "gc:workspace-gc");
        let annotations = policy.metadata.annotations.unwrap_or_default();
        let text = annotations.get(PRINTED_FOR).expect("the annotation");
        assert_eq!(
            text,
            r#"{"exclude_namespaces":[],"label_selector":"mlops.redhat.com/build-workspace=true","namespaces":["ml-a","ml-b"],"service_account":"gc:workspace-gc"}"#
        );
    }

    #[test]
    fn the_label_guard_comes_always_and_names_its_writers_or_nobody() {
        let selector = Config::default().selector;
        let writers = vec!["system:serviceaccount:op:manager".to_owned()];
        let guarded = render(&selector, None, "gc:workspace-gc", &writers).unwrap();
        assert_eq!(guarded.matches("\nkind: ").count(), 4, "{guarded}");
        assert!(guarded.contains("rule label-only-at-creation"), "{guarded}");
        assert!(
            guarded.contains("request.userInfo.username in ['system:serviceaccount:op:manager']"),
            "{guarded}"
        );
        assert!(guarded.contains(r#"{\"label_writers\":[\"system:serviceaccount:op:manager\"]}"#));
        // On by default: nobody may add the label, and the refusal says what to do.
        let plain = render(&selector, None, "gc:workspace-gc", &[]).unwrap();
        assert!(plain.contains(LABEL_GUARD_NAME), "{plain}");
        assert!(plain.contains("request.userInfo.username in []"), "{plain}");
        let (policy, binding) = label_guard(&selector, &[]);
        let spec = policy.spec.unwrap_or_default();
        let message = (spec.validations.unwrap_or_default().into_iter())
            .filter_map(|v| v.message)
            .collect::<String>();
        assert!(message.starts_with("workspace-gc admission guard: rule label-only-at-creation: "));
        assert!(message.contains("by nobody"), "{message}");
        assert!(
            message.contains("Create the claim with the label"),
            "{message}"
        );
        assert!(message.contains("provenance.label_writers"), "{message}");
        // Cluster-wide when the daemon is.
        assert_eq!(binding.spec.match_resources, None);
    }

    #[test]
    fn the_label_guard_binds_where_the_daemon_deletes() {
        let mut selector = Config::default().selector;
        selector.namespaces = vec!["team-a".into(), "team-b".into()];
        selector.exclude_namespaces = vec!["team-b".into()];
        let (_, binding) = label_guard(&selector, &[]);
        let scope = serde_json::to_value(binding.spec.match_resources).unwrap();
        assert_eq!(
            scope,
            serde_json::json!({"namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In",
                 "values": ["team-a", "team-b"]},
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                 "values": ["team-b"]},
            ]}})
        );
    }
}
