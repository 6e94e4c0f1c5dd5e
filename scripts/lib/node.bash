# The node of `scripts/control-plane up --node`: containerd, the CNI bridge, a kubelet and
# kube-scheduler, so that pods really run. Sourced by scripts/control-plane; not a command.
#
# Everything the node makes lives under the control plane's DIR (containerd's root and state, the
# kubelet's root, pod logs, network namespaces, local volumes) or is named after it (the iptables
# rules carry a comment with DIR), so `down` removes exactly what this node made: no other
# control plane's processes, mounts or rules. One node per host: two kubelets would share the
# kubepods cgroups and the bridge.
#
# Quirks of the machines this runs on (docs/testing.md, The node): cgroup v1, so the kubelet
# needs failCgroupV1: false; no CAP_SYS_RESOURCE, so containerd runs with
# restrict_oom_score_adj; no registry, so the pause and busybox images are built here
# (pause.c from the pinned kubernetes module, busybox from Debian's busybox-static).

NODE_MODULE_DIR="$ROOT/hack/kubelet"
NODE_BINARIES=(kubelet kube-scheduler pause)
NODE_NAME=workspace-gc-node
# The bridge, its pods' subnet and the `kubernetes` Service's IP (the first of
# --service-cluster-ip-range, which the API server gives that Service).
NODE_BRIDGE=wgc0
NODE_POD_CIDR=10.244.0.0/24
NODE_GATEWAY=10.244.0.1
KUBERNETES_SERVICE_IP=10.0.0.1
NODE_LOCK=/run/workspace-gc-node.dir
# What the kubelet's sandboxes and the test images are called in containerd.
PAUSE_IMAGE=localhost/pause:workspace-gc
BUSYBOX_IMAGE=localhost/busybox:workspace-gc
CNI_BIN_DIR=/usr/lib/cni
# Static `local` volumes `up --node` creates, each a directory under DIR/volumes.
NODE_VOLUMES=${CONTROL_PLANE_NODE_VOLUMES:-8}

node_k8s_version() {
    awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3; exit }' "$NODE_MODULE_DIR/go.mod"
}

node_bin_dir() { echo "$CACHE_ROOT/node-$(node_k8s_version)/bin"; }

# Debian's packages the node needs, installed with apt when missing (CI runs as root on Debian).
node_packages() {
    local -a missing=()
    command -v buildah >/dev/null || missing+=(buildah)
    command -v containerd >/dev/null || missing+=(containerd)
    [[ -x "$CNI_BIN_DIR/bridge" ]] || missing+=(containernetworking-plugins)
    # The static one: the image has no libc for Debian's other busybox.
    dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
    command -v iptables >/dev/null || missing+=(iptables)
    command -v runc >/dev/null || missing+=(runc)
    apt_install "${missing[@]}" || die "the node needs Debian's ${missing[*]}; install them and rerun"
}

go_build_node() {
    local out=$1 version ldflags source
    version=$(node_k8s_version)
    ldflags=$(k8s_ldflags "$version")
    log "(one-time; see hack/kubelet/BUILD-TIME.md)"
    go build -ldflags "$ldflags" -o "$out/" k8s.io/kubernetes/cmd/kubelet \
        k8s.io/kubernetes/cmd/kube-scheduler || return
    # The sandbox's process, from the same release (its image is built at `up`).
    source=$(go list -m -f '{{.Dir}}' k8s.io/kubernetes) || return
    gcc -static -Os -Wall -Werror -DVERSION="$version" -o "$out/pause" \
        "$source/build/pause/linux/pause.c" || return
    strip "$out/pause"
}

cmd_build_node() {
    [[ $# -eq 0 ]] || usage
    [[ "$(node_k8s_version)" == "$(k8s_version_of_newest)" ]] ||
        die "hack/kubelet pins $(node_k8s_version), the newest plane is $(k8s_version_of_newest); regenerate hack/kubelet"
    command -v gcc >/dev/null || die "gcc is needed to build the pause image"
    node_packages
    cached_build "$(node_bin_dir)" "$NODE_MODULE_DIR" "${NODE_BINARIES[*]}" go_build_node
}

k8s_version_of_newest() {
    awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v[0-9]/ { print $2; exit }' \
        "$K8S_MODULES/$(k8s_minors | tail -n 1)/go.mod"
}

# --- images --------------------------------------------------------------------------------------

# buildah with its storage under DIR (vfs: no overlay mounts to leave behind), so a node's
# images go with it.
node_buildah() {
    buildah --root "$DIR/node/buildah/root" --runroot "$DIR/node/buildah/run" \
        --storage-driver vfs "$@"
}

# node_image NAME ROOTFS ARGV...: an image FROM scratch holding ROOTFS, whose entrypoint is
# ARGV, imported into containerd's k8s.io namespace.
node_image() {
    local name=$1 rootfs=$2 container
    shift 2
    container=$(node_buildah from scratch)
    node_buildah copy "$container" "$rootfs" / >/dev/null
    local entrypoint
    entrypoint=$(printf '"%s",' "$@")
    node_buildah config --entrypoint "[${entrypoint%,}]" "$container"
    node_buildah commit --quiet "$container" "$name" >/dev/null
    node_buildah rm "$container" >/dev/null
    node_import "$name"
}

# Copies image NAME from buildah's storage under DIR into containerd.
node_import() {
    local name=$1 archive="$DIR/node/image.tar"
    node_buildah push --quiet "$name" "docker-archive:$archive:$name" >/dev/null
    node_ctr images import "$archive" >/dev/null
    rm -f "$archive"
}

# The name Tekton's image NAME (entrypoint, nop, ...) of release VERSION has in containerd: a
# tag, not latest, so the kubelet finds it there (Tekton leaves imagePullPolicy unset, which is
# IfNotPresent for a tag).
tekton_image() { echo "localhost/tekton/$1:$2"; }

# Tekton's images of release VERSION, FROM scratch, each holding its static binary from BIN where
# the release's ko images have it (/ko-app/NAME, which Tekton's pods name as their command).
node_tekton_images() {
    local bin=$1 version=$2 name rootfs="$DIR/node/rootfs/tekton" start=$SECONDS
    for name in "${TEKTON_IMAGE_BINARIES[@]}"; do
        mkdir -p "$rootfs/$name/ko-app"
        cp "$bin/$name" "$rootfs/$name/ko-app/$name"
        node_image "$(tekton_image "$name" "$version")" "$rootfs/$name" "/ko-app/$name"
    done
    rm -rf "$rootfs"
    log "Tekton's images imported after $((SECONDS - start)) s"
}

cmd_load_image() {
    local file=${1:-}
    [[ -f "$file" ]] || usage
    shift
    parse_dir_arg "$@"
    [[ -S "$DIR/node/containerd/containerd.sock" ]] || die "no node runs in $DIR (up --node)"
    node_ctr images import "$file" >&2
}

# Lets the node pull from HOST:PORT over plain HTTP (a local test registry, tests/release.rs):
# containerd reads the registry's hosts.toml from its config_path at each pull.
cmd_trust_registry() {
    local host=${1:-}
    [[ "$host" =~ ^[A-Za-z0-9.-]+(:[0-9]+)?$ ]] || usage
    shift
    parse_dir_arg "$@"
    [[ -S "$DIR/node/containerd/containerd.sock" ]] || die "no node runs in $DIR (up --node)"
    mkdir -p "$DIR/node/containerd/certs.d/$host"
    cat >"$DIR/node/containerd/certs.d/$host/hosts.toml" <<EOF
server = "http://$host"
[host."http://$host"]
  capabilities = ["pull", "resolve"]
EOF
}

node_ctr() { ctr --address "$DIR/node/containerd/containerd.sock" --namespace k8s.io "$@"; }

# --- containerd and the network ------------------------------------------------------------------

node_write_containerd_config() {
    local conf="$DIR/node/containerd/config.toml"
    mkdir -p "$DIR/node/containerd" "$DIR/node/cni/net.d"
    cat >"$conf" <<EOF
version = 2
root = "$DIR/node/containerd/root"
state = "$DIR/node/containerd/state"
[grpc]
  address = "$DIR/node/containerd/containerd.sock"
[ttrpc]
  address = "$DIR/node/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # No CAP_SYS_RESOURCE on these machines: containerd may only raise a container's OOM score.
  restrict_oom_score_adj = true
  # The pods' network namespaces under DIR, so that down finds and removes them.
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  # One hosts.toml per registry the node may pull from (trust-registry: a plain-HTTP one).
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$DIR/node/containerd/certs.d"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$DIR/node/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
EOF
    cat >"$DIR/node/cni/net.d/10-workspace-gc.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "workspace-gc",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$NODE_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": "$DIR/node/cni/ipam",
        "ranges": [[{"subnet": "$NODE_POD_CIDR", "gateway": "$NODE_GATEWAY"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "loopback"}
  ]
}
EOF
}

# The iptables rules of this node carry this comment, so down deletes them and no other.
node_rule_comment() { echo "workspace-gc-node $DIR"; }

# The bridge exists before the first pod, so that pods may reach the API server at the
# `kubernetes` Service's IP: a DNAT to the loopback address it listens on, which the kernel routes
# for packets from the bridge only with route_localnet.
node_network_up() {
    local api_port=$1
    ip link add "$NODE_BRIDGE" type bridge
    ip addr add "$NODE_GATEWAY/${NODE_POD_CIDR#*/}" dev "$NODE_BRIDGE"
    ip link set "$NODE_BRIDGE" up
    sysctl -qw "net.ipv4.conf.$NODE_BRIDGE.route_localnet=1"
    # The kubelet's probes and pods' replies cross the bridge; a host with br_netfilter must not
    # send bridged traffic through iptables' FORWARD policy.
    iptables -w -t nat -A PREROUTING -i "$NODE_BRIDGE" -d "$KUBERNETES_SERVICE_IP/32" -p tcp \
        --dport 443 -m comment --comment "$(node_rule_comment)" \
        -j DNAT --to-destination "127.0.0.1:$api_port"
}

# Deletes every iptables rule that carries this node's comment, and the bridge.
node_network_down() {
    local table rule comment
    comment=$(node_rule_comment)
    for table in nat filter mangle; do
        while read -r rule; do
            [[ -n "$rule" ]] || continue
            eval "iptables -w -t $table ${rule/#-A/-D}" 2>/dev/null || true
        done < <(iptables -w -t "$table" -S 2>/dev/null | grep -F -- "--comment \"$comment\"" || true)
    done
    # The kubelet's own chains (its canary, the hint for kube-proxy, the localnet firewall and
    # their jumps): no other process on these machines makes KUBE- chains.
    if [[ -e "$DIR/node/kubelet.started" ]]; then
        local cmd chain
        for cmd in iptables ip6tables; do
            command -v "$cmd" >/dev/null || continue
            for chain in INPUT OUTPUT; do
                while "$cmd" -w -t filter -D "$chain" -j KUBE-FIREWALL 2>/dev/null; do :; done
            done
            for table in nat filter mangle; do
                for chain in KUBE-KUBELET-CANARY KUBE-FIREWALL KUBE-IPTABLES-HINT; do
                    "$cmd" -w -t "$table" -F "$chain" 2>/dev/null || true
                    "$cmd" -w -t "$table" -X "$chain" 2>/dev/null || true
                done
            done
        done
    fi
    if [[ -e "/sys/class/net/$NODE_BRIDGE" && "$(cat "$DIR/node/bridge" 2>/dev/null)" == "$DIR" ]]; then
        ip link delete "$NODE_BRIDGE" 2>/dev/null || true
    fi
}

# --- the kubelet and the scheduler ---------------------------------------------------------------

node_write_kubelet_config() {
    local kubelet_port=$1 healthz_port=$2
    mkdir -p "$DIR/node/kubelet" "$DIR/node/pod-logs"
    # No cluster DNS runs: pods get the host's resolver configuration.
    cat >"$DIR/node/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_GATEWAY
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz_port
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$DIR/pki/ca.crt"}
authorization: {mode: Webhook}
containerRuntimeEndpoint: "unix://$DIR/node/containerd/containerd.sock"
cgroupDriver: cgroupfs
# These machines have cgroup v1 (hybrid); the kubelet refuses it unless told.
failCgroupV1: false
failSwapOn: false
podLogsDir: "$DIR/node/pod-logs"
resolvConf: /etc/resolv.conf
registerNode: true
syncFrequency: 5s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 2s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%"}
serializeImagePulls: false
EOF
}

# One node per host: the first `up --node` owns the lock until its down. Checked before anything
# starts, and again by node_up. A test binary's shared node is taken down by its watchdog just
# after the binary exits, as the next one starts: up to NODE_LOCK_WAIT seconds are given to that.
NODE_LOCK_WAIT=${CONTROL_PLANE_NODE_LOCK_WAIT:-30}
node_host_free() {
    local other deadline=$((SECONDS + NODE_LOCK_WAIT))
    while other=$(cat "$NODE_LOCK" 2>/dev/null) && [[ -d "$other" ]]; do
        ((SECONDS < deadline)) || die "a node already runs for $other; run: $SELF down --dir $other"
        sleep 0.5
    done
    [[ ! -e "/sys/class/net/$NODE_BRIDGE" ]] ||
        die "interface $NODE_BRIDGE exists: another node, or a leftover (ip link delete $NODE_BRIDGE)"
}

# Starts containerd, the images, the kubelet and the scheduler. The control plane is up.
node_up() {
    local node_bin=$1 api_url=$2 api_port=${2##*:} start=$SECONDS
    local kubelet_port healthz_port scheduler_port
    read -r kubelet_port healthz_port scheduler_port <<<"$(free_ports 3)"
    node_host_free
    mkdir -p "$DIR/node"
    echo "$DIR" >"$NODE_LOCK"
    echo "$DIR" >"$DIR/node/bridge"
    node_network_up "$api_port"
    node_write_containerd_config
    start_daemon "$DIR" containerd containerd --config "$DIR/node/containerd/config.toml"
    wait_for "$DIR" containerd 30 node_ctr version

    # The sandbox image and busybox for test pods.
    local rootfs="$DIR/node/rootfs"
    mkdir -p "$rootfs/pause" "$rootfs/busybox/bin" "$rootfs/busybox/tmp"
    cp "$node_bin/pause" "$rootfs/pause/pause"
    node_image "$PAUSE_IMAGE" "$rootfs/pause" /pause
    cp /bin/busybox "$rootfs/busybox/bin/busybox"
    local applet
    for applet in sh ls cat echo sleep touch test mkdir rm id stat df wc grep true false nc wget; do
        ln -s busybox "$rootfs/busybox/bin/$applet"
    done
    node_image "$BUSYBOX_IMAGE" "$rootfs/busybox" /bin/sh
    rm -rf "$rootfs"

    write_kubeconfig "$DIR/kubelet.kubeconfig" "$api_url" "$DIR/pki" kubelet
    node_write_kubelet_config "$kubelet_port" "$healthz_port"
    touch "$DIR/node/kubelet.started"
    start_daemon "$DIR" kubelet "$node_bin/kubelet" \
        --config="$DIR/node/kubelet/config.yaml" \
        --kubeconfig="$DIR/kubelet.kubeconfig" \
        --root-dir="$DIR/node/kubelet" \
        --cert-dir="$DIR/node/kubelet/pki" \
        --hostname-override="$NODE_NAME" \
        --node-ip="$NODE_GATEWAY"
    write_kubeconfig "$DIR/scheduler.kubeconfig" "$api_url" "$DIR/pki" scheduler
    start_daemon "$DIR" kube-scheduler "$node_bin/kube-scheduler" \
        --kubeconfig="$DIR/scheduler.kubeconfig" \
        --authentication-kubeconfig="$DIR/scheduler.kubeconfig" \
        --authorization-kubeconfig="$DIR/scheduler.kubeconfig" \
        --bind-address=127.0.0.1 \
        --secure-port="$scheduler_port" \
        --leader-elect=false
    wait_for "$DIR" kube-scheduler 60 insecure_https_ok "https://127.0.0.1:$scheduler_port/healthz"
    wait_for "$DIR" kubelet 120 node_ready
    node_volumes
    log "node $NODE_NAME ready after $((SECONDS - start)) s"
}

# Ready, and without the not-ready taint (the node-lifecycle controller lifts it).
node_ready() {
    "${kubectl[@]}" get node "$NODE_NAME" \
        -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.spec.taints}' |
        grep -qx 'True '
}

# A StorageClass `local` (no provisioner; a claim binds when its first pod is scheduled) and
# NODE_VOLUMES static `local` volumes on this node, each a directory under DIR/volumes.
node_volumes() {
    local i
    {
        cat <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: local}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
EOF
        for ((i = 0; i < NODE_VOLUMES; i++)); do
            mkdir -p "$DIR/volumes/local-$i"
            cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: local-$i}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: local
  local: {path: "$DIR/volumes/local-$i"}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions:
            - {key: kubernetes.io/hostname, operator: In, values: [$NODE_NAME]}
EOF
        done
    } | "${kubectl[@]}" apply -f - >&2
}

# Kills every process in the pods' cgroups (the kubelet's kubepods hierarchy), then removes the
# cgroups.
node_kill_pods() {
    local cgroup pid round
    for round in 1 2 3 4 5 6 7 8 9 10; do
        local -a pids=()
        for cgroup in /sys/fs/cgroup/*/kubepods; do
            [[ -d "$cgroup" ]] || continue
            while read -r pid; do pids+=("$pid"); done < <(find "$cgroup" -name cgroup.procs -exec cat {} + 2>/dev/null)
        done
        ((${#pids[@]})) || break
        kill -KILL "${pids[@]}" 2>/dev/null || true
        sleep 0.2
    done
    for cgroup in /sys/fs/cgroup/*/kubepods; do
        [[ -d "$cgroup" ]] || continue
        find "$cgroup" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
}

# containerd's shims outlive containerd by design; ours name our socket.
node_kill_shims() {
    local proc
    local -a argv
    for proc in /proc/[0-9]*; do
        mapfile -d '' argv 2>/dev/null <"$proc/cmdline" || continue
        [[ "${argv[0]:-}" == *containerd-shim* ]] || continue
        if [[ " ${argv[*]} " == *" $DIR/node/containerd/containerd.sock "* ]]; then
            kill -KILL "${proc#/proc/}" 2>/dev/null || true
        fi
    done
}

# Unmounts everything mounted under DIR, deepest first (volumes, tokens, rootfs, shm, netns).
node_unmount() {
    local mount
    while read -r mount; do
        umount "$mount" 2>/dev/null || umount -l "$mount" 2>/dev/null || true
    done < <(awk -v dir="$1/" 'index($5, dir) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
}

# Everything the node made, after its kubelet, scheduler and containerd got SIGTERM.
node_down() {
    local dir=$1
    [[ -d "$dir/node" ]] || return 0
    DIR=$dir
    node_kill_pods
    node_kill_shims
    stop_daemons "$dir" containerd
    node_kill_shims
    node_unmount "$dir"
    node_network_down
    if [[ "$(cat "$NODE_LOCK" 2>/dev/null)" == "$dir" ]]; then rm -f "$NODE_LOCK"; fi
}
