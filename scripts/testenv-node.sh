# The test environment's node (sourced by scripts/testenv.sh): containerd, runc and a CNI
# bridge of its own, kubelet, kube-scheduler, kube-proxy, CoreDNS and a volume provisioner,
# next to the control plane `up` started. Needs root (network interfaces, mounts, cgroups).
#
# Addresses: the node and the host's services for pods are on NODE_IP, on an interface of its own
# this script adds; pods get POD_CIDR on the bridge; Services SERVICE_CIDR. A guard chain
# rejects pod traffic to any other address, so nothing leaves the machine.

NODE_NAME=topk-node
NODE_IF=topk-host
NODE_IP="${TOPK_TESTENV_NODE_IP:-10.213.0.1}"
POD_CIDR="${TOPK_TESTENV_POD_CIDR:-10.214.0.0/16}"
SERVICE_CIDR=10.0.0.0/24
POD_BRIDGE=topk-cni0
GUARD_CHAIN=TOPK-TESTENV-GUARD
PAUSE_IMAGE=topk.io/testenv/pause:1
KAFKA_IMAGE="topk.io/testenv/kafka:$KAFKA_VERSION"
NODE="$RUN/node"
CONTAINERD_SOCK="$NODE/containerd/containerd.sock"

# Why this machine cannot run the node, or nothing.
node_unsupported() {
  [[ "$(id -u)" == 0 ]] || { echo "the node needs root (network interfaces, mounts, cgroups)"; return; }
  grep -qw overlay /proc/filesystems || { echo "the kernel has no overlay filesystem (containerd's snapshotter needs it)"; return; }
  [[ -d /sys/fs/cgroup/memory || -f /sys/fs/cgroup/cgroup.controllers ]] \
    || { echo "no cgroup hierarchy with the memory controller under /sys/fs/cgroup"; return; }
  local tool
  for tool in ip iptables iptables-save iptables-restore containerd runc ctr; do
    command -v "$tool" >/dev/null || { echo "$tool is missing"; return; }
  done
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] \
    || { echo "the CNI plugins are missing (/usr/lib/cni)"; return; }
}

# Debian's containerd, runc, CNI plugins and the tools the node uses, when missing.
install_node_packages() {
  [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null || return 0
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
  [[ -x /bin/busybox ]] && /bin/busybox --list 2>/dev/null | grep -qx wget || missing+=(busybox-static)
  command -v gcc >/dev/null || missing+=(gcc libc6-dev)
  ((${#missing[@]} == 0)) && return 0
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q "${missing[@]}" >/dev/null; }
}

node_ctr() { ctr --address "$CONTAINERD_SOCK" --namespace k8s.io "$@"; }
node_kubectl() { "$KUBE_BIN/kubectl" --kubeconfig "$RUN/kubeconfig" "$@"; }

# The host side of the node's network: NODE_IP on an interface of its own (the address the
# control plane, Kafka's pod listener and CoreDNS bind), forwarding on, the guard chain. The
# interface is a bridge with no ports: this kernel has no dummy interfaces, and a portless
# bridge takes local traffic the same way.
node_network_up() {
  ip link show "$NODE_IF" >/dev/null 2>&1 || ip link add "$NODE_IF" type bridge
  ip addr replace "$NODE_IP/32" dev "$NODE_IF"
  ip link set "$NODE_IF" up
  cat /proc/sys/net/ipv4/ip_forward >"$RUN/ip_forward.saved"
  echo 1 >/proc/sys/net/ipv4/ip_forward
  if [[ -f /proc/sys/net/bridge/bridge-nf-call-iptables ]]; then
    cat /proc/sys/net/bridge/bridge-nf-call-iptables >"$RUN/bridge-nf-call-iptables.saved"
    echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
  fi
  iptables -N "$GUARD_CHAIN" 2>/dev/null || iptables -F "$GUARD_CHAIN"
  iptables -A "$GUARD_CHAIN" -s "$POD_CIDR" -d "$POD_CIDR" -j RETURN
  iptables -A "$GUARD_CHAIN" -s "$POD_CIDR" -j REJECT
  iptables -C FORWARD -j "$GUARD_CHAIN" 2>/dev/null || iptables -I FORWARD 1 -j "$GUARD_CHAIN"
}

node_certs() {
  local d="$RUN/pki"
  openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" \
    -keyout "$d/kubelet-client.key" -out "$d/kubelet-client.csr" 2>/dev/null
  openssl x509 -req -in "$d/kubelet-client.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -days 3650 -out "$d/kubelet-client.crt" 2>/dev/null
}

start_containerd() {
  mkdir -p "$NODE/containerd" "$NODE/cni/net.d" "$NODE/cni/ipam" "$NODE/registry/_default"
  # No registry is reachable from here, and none may be tried: every pull goes to a closed
  # local port and fails at once. Images are imported with `ctr images import`.
  cat >"$NODE/registry/_default/hosts.toml" <<EOF
server = "http://127.0.0.1:9"
[host."http://127.0.0.1:9"]
  capabilities = ["pull", "resolve"]
EOF
  cat >"$NODE/containerd/config.toml" <<EOF
version = 2
root = "$NODE/containerd/root"
state = "$NODE/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$NODE/containerd/containerd.sock.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # This VM lacks CAP_SYS_RESOURCE: a negative OOM score (containerd's default for the
  # sandbox) makes every pod fail to start.
  restrict_oom_score_adj = true
  enable_unprivileged_ports = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$NODE/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$NODE/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$NODE/registry"
EOF
  cat >"$NODE/cni/net.d/10-topk.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "topk-testenv",
  "plugins": [
    {"type": "bridge", "bridge": "$POD_BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
              "dataDir": "$NODE/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  # Network namespaces that exist before the node's, so `down` removes only its own.
  ls /var/run/netns 2>/dev/null >"$NODE/netns.before" || true
  start containerd containerd --config "$NODE/containerd/config.toml"
  wait_for containerd 60 "$RUN/containerd.log" node_ctr version
}

# The sandbox image: a static pause binary, nothing else.
import_pause_image() {
  local dir="$NODE/images/pause"
  mkdir -p "$dir/rootfs"
  gcc -static -O2 -o "$dir/rootfs/pause" "$ROOT/tools/node/pause.c"
  python3 "$ROOT/tools/node/image.py" pack "$dir/rootfs" "$dir/image.tar" "$PAUSE_IMAGE" \
    '{"Entrypoint": ["/pause"], "User": "65535:65535"}'
  node_ctr images import "$dir/image.tar" >/dev/null
}

start_kubelet() {
  local port healthz
  port="$(free_port)"
  healthz="$(free_port)"
  mkdir -p "$NODE/kubelet"
  # Pods resolve through the cluster's DNS only; no host resolver is handed to them.
  printf 'nameserver %s\n' "$NODE_IP" >"$NODE/resolv.conf"
  cat >"$NODE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
clusterDomain: cluster.local
clusterDNS: [$NODE_IP]
resolvConf: $NODE/resolv.conf
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $RUN/pki/ca.crt}
authorization: {mode: Webhook}
# Imported images have no registry to come back from: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%, nodefs.inodesFree: 2%}
serializeImagePulls: false
maxPods: 110
EOF
  start kubelet "$KUBE_BIN/kubelet" --config "$NODE/kubelet.yaml" --kubeconfig "$RUN/kubeconfig" \
    --root-dir "$NODE/kubelet" --cert-dir "$NODE/kubelet/pki" \
    --node-ip "$NODE_IP" --hostname-override "$NODE_NAME" --v=1
  echo "$healthz" >"$NODE/kubelet.healthz"
}

start_kube_proxy() {
  cat >"$NODE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE_NAME
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:$(free_port)
metricsBindAddress: 127.0.0.1:$(free_port)
nodePortAddresses: [$NODE_IP/32]
oomScoreAdj: 0
# Leave the host's conntrack settings as they are.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
clientConnection: {kubeconfig: $RUN/kubeconfig}
EOF
  start kube-proxy "$KUBE_BIN/kube-proxy" --config "$NODE/kube-proxy.yaml"
}

start_scheduler() {
  local port
  port="$(free_port)"
  start kube-scheduler "$KUBE_BIN/kube-scheduler" --kubeconfig "$RUN/kubeconfig" \
    --authentication-kubeconfig "$RUN/kubeconfig" --authorization-kubeconfig "$RUN/kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$port" --leader-elect=false
  wait_for kube-scheduler 60 "$RUN/kube-scheduler.log" tcp_open "$port"
}

# CoreDNS on the host, on NODE_IP:53 (the kubelet's clusterDNS): Service and pod names of
# cluster.local; every other name is refused, nothing is forwarded.
start_coredns() {
  local health ready
  health="$(free_port)"
  ready="$(free_port)"
  cat >"$NODE/Corefile" <<EOF
cluster.local:53 in-addr.arpa:53 {
  bind $NODE_IP
  errors
  health 127.0.0.1:$health
  ready 127.0.0.1:$ready
  kubernetes cluster.local in-addr.arpa {
    kubeconfig $RUN/kubeconfig testenv
    pods insecure
  }
  cache 5
  loadbalance
}
EOF
  start coredns "$COREDNS_BIN/coredns" -conf "$NODE/Corefile"
  wait_for coredns 60 "$RUN/coredns.log" curl -sf "http://127.0.0.1:$ready/ready"
}

start_provisioner() {
  start provisioner "$PROVISIONER_BIN/provisioner" --kubeconfig "$RUN/kubeconfig" --root "$NODE/volumes"
  node_kubectl apply -f - >/dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: topk.io/testenv-hostpath
reclaimPolicy: Delete
volumeBindingMode: Immediate
EOF
}

node_ready() {
  node_kubectl get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True \
    && node_kubectl -n default get serviceaccount default
}

# The dev Kafka image for the chart's `kafka.dev` StatefulSet: Debian's JRE of this machine,
# the broker jars of the test environment, busybox for the scripts, and the entrypoint and
# tools paths of the upstream image (`/etc/kafka/docker/run`, `/opt/kafka/bin/*.sh`).
build_kafka_image() {
  local dir="$NODE/images/kafka" java_home
  java_home="$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")"
  rm -rf "$dir" && mkdir -p "$dir/rootfs"
  local r="$dir/rootfs"
  mkdir -p "$r/opt/kafka/libs" "$r/opt/kafka/bin" "$r/opt/kafka/config" "$r/etc/kafka/docker" "$r/bin" \
    "$r/tmp" "$r/etc" "$r/var/lib/kafka/data" "$r/usr/lib/jvm"
  chmod 1777 "$r/tmp"
  cp "$KAFKA_LIBS"/*.jar "$r/opt/kafka/libs/"
  # The JRE with its links into /etc resolved (a dangling one, such as the JDK's src.zip,
  # makes cp fail: what matters is checked below); the JDK's jmods and docs are not needed.
  cp -rL "$java_home" "$r/usr/lib/jvm/java" 2>/dev/null || true
  rm -rf "$r/usr/lib/jvm/java/"{jmods,docs,man,include,demo}
  [[ -x "$r/usr/lib/jvm/java/bin/java" && -f "$r/usr/lib/jvm/java/lib/modules" ]] \
    || die "copying the JRE from $java_home failed"
  python3 "$ROOT/tools/node/image.py" libs "$r" "$r/usr/lib/jvm/java/bin/java" \
    $(find "$r/usr/lib/jvm/java/lib" -name '*.so')
  cp /bin/busybox "$r/bin/busybox"
  local applet
  for applet in $(/bin/busybox --list); do
    [[ -e "$r/bin/$applet" ]] || ln -s busybox "$r/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nappuser:x:1000:1000:kafka:/home/appuser:/bin/sh\n' >"$r/etc/passwd"
  printf 'root:x:0:\nappuser:x:1000:\n' >"$r/etc/group"
  cp "$RUN/kafka/log4j2.properties" "$r/opt/kafka/config/log4j2.properties"
  cat >"$r/opt/kafka/bin/kafka-run-class.sh" <<'EOF'
#!/bin/sh
exec java ${KAFKA_HEAP_OPTS:--Xmx256m} -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties \
  -cp '/opt/kafka/libs/*' "$@"
EOF
  printf '#!/bin/sh\nexec /opt/kafka/bin/kafka-run-class.sh org.apache.kafka.tools.TopicCommand "$@"\n' \
    >"$r/opt/kafka/bin/kafka-topics.sh"
  # A producer that knows nothing of topk (no keys), as the upstream image has it.
  printf '#!/bin/sh\nexec /opt/kafka/bin/kafka-run-class.sh org.apache.kafka.tools.ConsoleProducer "$@"\n' \
    >"$r/opt/kafka/bin/kafka-console-producer.sh"
  # KAFKA_FOO_BAR=v becomes foo.bar=v (a double underscore is a dash, a triple one an
  # underscore), as the upstream image does; then format the storage once and run.
  cat >"$r/etc/kafka/docker/run" <<'EOF'
#!/bin/sh
set -eu
props=/tmp/server.properties
: >"$props"
env | while IFS='=' read -r name value; do
  case "$name" in
    KAFKA_HEAP_OPTS|KAFKA_OPTS|KAFKA_JVM_PERFORMANCE_OPTS|KAFKA_LOG4J_OPTS) ;;
    KAFKA_*)
      key="$(echo "${name#KAFKA_}" | tr 'A-Z' 'a-z' | sed -e 's/___/\x01/g' -e 's/__/-/g' -e 's/_/./g' -e 's/\x01/_/g')"
      echo "$key=$value" >>"$props" ;;
  esac
done
cluster_id="${CLUSTER_ID:-$(/opt/kafka/bin/kafka-run-class.sh kafka.tools.StorageTool random-uuid | tail -n 1)}"
/opt/kafka/bin/kafka-run-class.sh kafka.tools.StorageTool format --ignore-formatted -t "$cluster_id" -c "$props"
KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xmx512m}" exec /opt/kafka/bin/kafka-run-class.sh kafka.Kafka "$props"
EOF
  chmod 755 "$r/opt/kafka/bin/"*.sh "$r/etc/kafka/docker/run"
  python3 "$ROOT/tools/node/image.py" pack "$r" "$dir/image.tar" "$KAFKA_IMAGE" \
    '{"Entrypoint": ["/etc/kafka/docker/run"], "User": "1000:1000", "WorkingDir": "/opt/kafka", "Env": ["PATH=/usr/lib/jvm/java/bin:/opt/kafka/bin:/bin", "JAVA_HOME=/usr/lib/jvm/java"]}'
  node_ctr images import "$dir/image.tar" >/dev/null
  rm -rf "$r"
}

# The topk image from the workspace's build: the binaries and the libraries they load, at the
# paths, user, entrypoint, environment and ports of the Dockerfile's runtime stage.
build_topk_image() {
  local bins="$1" tag="$2" dir="$NODE/images/topk" settings
  rm -rf "$dir" && mkdir -p "$dir/rootfs"
  local r="$dir/rootfs"
  settings="$(python3 "$ROOT/tools/node/image.py" dockerfile "$ROOT/Dockerfile")"
  local bin_dest lib_dest
  bin_dest="$(python3 -c 'import json,sys; c=json.load(sys.stdin)["copies"]; print(c[0]["dest"])' <<<"$settings")"
  lib_dest="$(python3 -c 'import json,sys; c=json.load(sys.stdin)["copies"]; print(c[1]["dest"])' <<<"$settings")"
  mkdir -p "$r$bin_dest" "$r$lib_dest" "$r/tmp" "$r/etc"
  chmod 1777 "$r/tmp"
  cp "$bins/topk" "$bins/topk-operator" "$r$bin_dest"
  python3 "$ROOT/tools/node/image.py" libs "$r" "$r${bin_dest}topk" "$r${bin_dest}topk-operator"
  # The Dockerfile ships libz beside the binaries (distroless lacks it); so does this image.
  cp -L "$(ldconfig -p | awk '$1 == "libz.so.1" {print $NF; exit}')" "$r$lib_dest"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$r/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$r/etc/group"
  local config
  config="$(python3 -c '
import json, sys
d = json.load(sys.stdin)
c = {"Entrypoint": d["entrypoint"], "User": d["user"],
     "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"] + [k + "=" + v for k, v in sorted(d["env"].items())]}
if d["expose"]:
    c["ExposedPorts"] = {p if "/" in p else p + "/tcp": {} for p in d["expose"]}
if d["workdir"]:
    c["WorkingDir"] = d["workdir"]
print(json.dumps(c))' <<<"$settings")"
  python3 "$ROOT/tools/node/image.py" pack "$r" "$dir/image.tar" "$tag" "$config"
  node_ctr images import "$dir/image.tar" >/dev/null
  echo "$config" >"$dir/config.json"
  rm -rf "$r"
}

cmd_node_up() {
  [[ -f "$ENV_FILE" ]] || die "the node runs next to the control plane: run \`$0 up\` first"
  local why
  why="$(node_unsupported)"
  [[ -z "$why" ]] || die "cannot start the node: $why"
  [[ "$(sed -n 's/^export TOPK_TESTENV_NODE_IP=//p' "$ENV_FILE")" == "$NODE_IP" ]] \
    || die "the control plane was started without the node's address; run \`$0 up\` as root"
  cmd_node_down >/dev/null 2>&1 || true
  mkdir -p "$NODE"
  start_containerd
  import_pause_image
  start_kube_proxy
  start_kubelet
  start_scheduler
  start_coredns
  start_provisioner
  wait_for node 120 "$RUN/kubelet.log" node_ready
  build_kafka_image
  cat >>"$ENV_FILE" <<EOF
export TOPK_NODE=$NODE_NAME
export TOPK_KUBECTL=$KUBE_BIN/kubectl
export TOPK_CONTAINERD_SOCK=$CONTAINERD_SOCK
export TOPK_NODE_KAFKA_IMAGE=$KAFKA_IMAGE
EOF
  log "node $NODE_NAME Ready at $NODE_IP (pods $POD_CIDR, DNS $NODE_IP); images: $PAUSE_IMAGE, $KAFKA_IMAGE"
}

# Stops the node and removes what it made: pods' processes, mounts, network namespaces,
# iptables chains, the pods' bridge.
cmd_node_down() {
  local name pid
  for name in provisioner coredns kube-scheduler kubelet kube-proxy; do
    stop_ours "$name"
  done
  # Every container's processes, then their shims, then containerd.
  if [[ -S "$CONTAINERD_SOCK" ]]; then
    local task
    for task in $(node_ctr tasks list -q 2>/dev/null); do
      node_ctr tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
    done
  fi
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $CONTAINERD_SOCK" 2>/dev/null); do
    kill -9 "$pid" 2>/dev/null || true
  done
  local cg
  for cg in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [[ -d "$cg" ]] || continue
    find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  done
  stop_ours containerd
  for cg in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [[ -d "$cg" ]] && find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  # Mounts under the node's directories, deepest first.
  findmnt -rn -o TARGET 2>/dev/null | { grep "^$NODE/" || true; } | sort -r | while read -r target; do
    umount -l "$target" 2>/dev/null || true
  done
  if [[ -f "$NODE/netns.before" ]]; then
    local ns
    for ns in $(ls /var/run/netns 2>/dev/null); do
      grep -qx "$ns" "$NODE/netns.before" || { umount -l "/var/run/netns/$ns" 2>/dev/null; rm -f "/var/run/netns/$ns"; }
    done
  fi
  if [[ -x "$KUBE_BIN/kube-proxy" && -f "$NODE/kube-proxy.yaml" ]]; then
    "$KUBE_BIN/kube-proxy" --cleanup --config "$NODE/kube-proxy.yaml" >/dev/null 2>&1 || true
  fi
  # What is left of the CNI plugins' and kube-proxy's chains (the guard stays with `up`).
  local save
  for save in iptables ip6tables; do
    command -v "$save-save" >/dev/null || continue
    if "$save-save" | grep -qE "CNI-|KUBE-"; then
      "$save-save" | grep -vE "CNI-|KUBE-" | "$save-restore" || true
    fi
  done
  ip link show "$POD_BRIDGE" >/dev/null 2>&1 && ip link delete "$POD_BRIDGE"
  if [[ -f "$ENV_FILE" ]]; then
    sed -i -e '/^export TOPK_NODE=/d' -e '/^export TOPK_KUBECTL=/d' -e '/^export TOPK_CONTAINERD_SOCK=/d' \
      -e '/^export TOPK_NODE_KAFKA_IMAGE=/d' "$ENV_FILE"
  fi
  return 0
}

# The host interface, the guard and the sysctls go with the control plane, which set them up
# and binds the interface's address.
node_network_down() {
  ip link show "$NODE_IF" >/dev/null 2>&1 && ip link delete "$NODE_IF"
  if iptables -S "$GUARD_CHAIN" >/dev/null 2>&1; then
    iptables -D FORWARD -j "$GUARD_CHAIN" 2>/dev/null || true
    iptables -F "$GUARD_CHAIN" && iptables -X "$GUARD_CHAIN"
  fi
  [[ -f "$RUN/ip_forward.saved" ]] && cat "$RUN/ip_forward.saved" >/proc/sys/net/ipv4/ip_forward
  [[ -f "$RUN/bridge-nf-call-iptables.saved" ]] \
    && cat "$RUN/bridge-nf-call-iptables.saved" >/proc/sys/net/bridge/bridge-nf-call-iptables
  return 0
}

cmd_node_status() {
  show_processes containerd kubelet kube-proxy kube-scheduler coredns provisioner || return 1
  node_kubectl get nodes -o wide
}
