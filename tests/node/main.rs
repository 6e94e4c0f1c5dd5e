//! The node lane: a real kubelet, kube-scheduler and containerd beside the control plane
//! (`scripts/control-plane up --node`). It needs root and minutes, so it runs only when asked
//! (`CONTROL_PLANE_NODE=1`, as scripts/test sets as root); otherwise each test says it was
//! skipped. One node per host: every test takes its turn ([`testkit::node_turn`]) on a control
//! plane and node of its own.
//!
//! - `installed`: the product as users install it: the image, and the Deployment of
//!   `manifests/base` and of the Helm chart as real pods;
//! - `builds`: a real Tekton build's pod on the node, its claim really mounted, and the daemon
//!   keeping it while the step runs and deleting it after.

mod builds;
mod installed;
