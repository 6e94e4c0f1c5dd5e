//! The admission guard: a ValidatingAdmissionPolicy and its binding that make the API server
//! itself refuse what workspace-gc must never do, whatever its code or its token does. RBAC
//! cannot say "delete only labelled claims"; a policy sees `oldObject` and `request.options`
//! on a DELETE, so it can.
//!
//! It guards PersistentVolumes too: the daemon may delete only a `Released` volume carrying the
//! UID of the claim it deleted (`deletion.released_volume_ttl`), and may change a volume only
//! by writing or removing that mark, equal to the volume's claimRef UID.
//!
//! Rendered from the same configuration as the daemon (`workspace-gc admission-policy`), so
//! the two agree by construction; the shipped copy in `manifests/components/admission-guard`
//! is checked against the shipped `config.toml` by tests/admission.rs.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation, Variable,
};
use kube::api::ObjectMeta;

use crate::config::SelectorConfig;
use crate::config::labels::{cel_list, cel_string};
use crate::contract::annotations::DELETED_CLAIM_UID;

/// The name of the policy and of its binding.
pub const NAME: &str = "workspace-gc-guard";

/// The identity whose requests the guard checks, as `NAMESPACE:NAME` of a ServiceAccount.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "workspace-gc:workspace-gc";

/// Every message starts with this, then the rule's name: a refusal names the rule broken.
const PREFIX: &str = "workspace-gc admission guard";

/// The policy and its binding for the daemon's `selector` configuration and ServiceAccount.
pub fn guard(
    selector: &SelectorConfig,
    service_account: &str,
) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let username = format!("system:serviceaccount:{service_account}");
    let delete = |condition: String| format!("request.operation != 'DELETE' || ({condition})");
    // Each rule is about claims or about volumes; the UID precondition about both.
    let of = |resource: &str, condition: String| {
        format!("request.resource.resource != '{resource}' || ({condition})")
    };
    let claims = |condition: String| of("persistentvolumeclaims", condition);
    let volumes = |condition: String| of("persistentvolumes", condition);
    let mark = cel_string(DELETED_CLAIM_UID);
    let rule = |name: &str, expression: String, why: String| Validation {
        expression,
        message: Some(format!("{PREFIX}: rule {name}: {why}")),
        // 403, as RBAC's refusals: the request is not allowed, not malformed.
        reason: Some("Forbidden".into()),
        ..Validation::default()
    };
    let mut validations = vec![
        rule(
            "no-update",
            claims("request.operation != 'UPDATE'".into()),
            "workspace-gc never updates or patches a claim".into(),
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

    let policy = ValidatingAdmissionPolicy {
        metadata: ObjectMeta {
            name: Some(NAME.into()),
            ..ObjectMeta::default()
        },
        spec: Some(ValidatingAdmissionPolicySpec {
            // A policy that cannot be evaluated refuses: when in doubt, keep the claim.
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec![String::new()]),
                    api_versions: Some(vec!["*".into()]),
                    // Subresources too: workspace-gc changes no claim's or volume's status.
                    resources: Some(vec![
                        "persistentvolumeclaims".into(),
                        "persistentvolumeclaims/*".into(),
                        "persistentvolumes".into(),
                        "persistentvolumes/*".into(),
                    ]),
                    // CREATE is not matched: the creator creates claims under its own identity.
                    operations: Some(vec!["DELETE".into(), "UPDATE".into()]),
                    ..NamedRuleWithOperations::default()
                }]),
                ..MatchResources::default()
            }),
            match_conditions: Some(vec![MatchCondition {
                name: "workspace-gc-service-account".into(),
                expression: format!("request.userInfo.username == {}", cel_string(&username)),
            }]),
            variables: Some(vec![
                Variable {
                    name: "labels".into(),
                    expression: "has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}"
                        .into(),
                },
                Variable {
                    name: "annotations".into(),
                    expression: "has(oldObject.metadata.annotations) \
                                 ? oldObject.metadata.annotations : {}"
                        .into(),
                },
                // Only read on an UPDATE, where `object` is the volume as it would be.
                Variable {
                    name: "newAnnotations".into(),
                    expression: "has(object.metadata.annotations) \
                                 ? object.metadata.annotations : {}"
                        .into(),
                },
            ]),
            validations: Some(validations),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata: ObjectMeta {
            name: Some(NAME.into()),
            ..ObjectMeta::default()
        },
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: NAME.into(),
            validation_actions: vec!["Deny".into()],
            ..ValidatingAdmissionPolicyBindingSpec::default()
        },
    };
    (policy, binding)
}

/// The guard as the YAML `workspace-gc admission-policy` prints and the component ships.
pub fn render(selector: &SelectorConfig, service_account: &str) -> Result<String, String> {
    let (policy, binding) = guard(selector, service_account);
    Ok(format!(
        "# Generated by `workspace-gc admission-policy` from the configuration; do not edit.\n\
         # For ServiceAccount {service_account}, the API server refuses every claim delete the\n\
         # daemon must never make, and every update or patch of a claim; every volume delete\n\
         # but of a Released one its mark names, and every volume change but that mark.\n\
         {}---\n{}",
        serde_saphyr::to_string(&policy).map_err(|e| e.to_string())?,
        serde_saphyr::to_string(&binding).map_err(|e| e.to_string())?
    ))
}
