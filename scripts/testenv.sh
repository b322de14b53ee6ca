#!/usr/bin/env bash
# The test environment: a real Apache Kafka broker (KRaft), etcd, kube-apiserver and
# kube-controller-manager, and Helm, provisioned from package registries only (Maven Central
# and the Go module proxy) and run on free loopback ports. No Docker, no kubelet.
#
#   scripts/testenv.sh install   fetch and build everything (idempotent, cached by version)
#   scripts/testenv.sh up        start everything, write the env file and a kubeconfig
#   scripts/testenv.sh down      stop everything started by `up`
#   scripts/testenv.sh status    show what runs where
#   scripts/testenv.sh env       print the env file's path (source it to use the services)
#
# Cache: ${TOPK_CACHE:-$HOME/.cache/topk}. Runtime state: $TOPK_CACHE/testenv/run.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${TOPK_CACHE:-$HOME/.cache/topk}"
KUBE_VERSION="$(cat "$ROOT/tools/k8s/VERSION")"
HELM_VERSION="$(cat "$ROOT/tools/helm/VERSION")"
KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$ROOT/tools/kafka/pom.xml")"
BIN="$CACHE/testenv/bin"
KUBE_BIN="$BIN/kubernetes-$KUBE_VERSION"
HELM_BIN="$BIN/helm-$HELM_VERSION"
KAFKA_LIBS="$CACHE/testenv/kafka-$KAFKA_VERSION"
RUN="${TOPK_TESTENV_DIR:-$CACHE/testenv/run}"
ENV_FILE="$RUN/env"

# Build with the Go on this machine; never fetch another toolchain.
export GOTOOLCHAIN=local

log() { printf 'testenv: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 is required ($2)"
}

install_kafka() {
  if [[ -f "$KAFKA_LIBS/.complete" ]]; then return; fi
  need mvn "Maven fetches the Kafka broker from Maven Central"
  need java "Kafka $KAFKA_VERSION needs Java 17+"
  log "fetching Apache Kafka $KAFKA_VERSION from Maven Central"
  rm -rf "$KAFKA_LIBS"
  mvn -q -B -f "$ROOT/tools/kafka/pom.xml" dependency:copy-dependencies \
    -DoutputDirectory="$KAFKA_LIBS" -Dmdep.includeScope=runtime
  touch "$KAFKA_LIBS/.complete"
}

install_kube() {
  if [[ -x "$KUBE_BIN/kube-apiserver" && -x "$KUBE_BIN/kube-controller-manager" && -x "$KUBE_BIN/etcd" ]]; then return; fi
  need go "the control plane is built from the published Go modules"
  log "building etcd, kube-apiserver and kube-controller-manager $KUBE_VERSION (several minutes)"
  local minor ld
  minor="$(echo "$KUBE_VERSION" | cut -d. -f2)"
  ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  mkdir -p "$KUBE_BIN.tmp"
  (cd "$ROOT/tools/k8s" && go build -trimpath -ldflags "$ld" -o "$KUBE_BIN.tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager)
  (cd "$ROOT/tools/k8s" && go build -trimpath -ldflags "-s -w" -o "$KUBE_BIN.tmp/etcd" go.etcd.io/etcd/server/v3)
  rm -rf "$KUBE_BIN" && mv "$KUBE_BIN.tmp" "$KUBE_BIN"
}

install_helm() {
  if [[ -x "$HELM_BIN/helm" ]]; then return; fi
  need go "Helm is built from its Go module"
  log "building Helm $HELM_VERSION"
  mkdir -p "$HELM_BIN.tmp"
  (cd "$ROOT/tools/helm" && go build -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
    -o "$HELM_BIN.tmp/helm" helm.sh/helm/v3/cmd/helm)
  rm -rf "$HELM_BIN" && mv "$HELM_BIN.tmp" "$HELM_BIN"
}

cmd_install() {
  install_kafka
  install_kube
  install_helm
  log "installed: kafka $KAFKA_VERSION, kubernetes $KUBE_VERSION, helm $HELM_VERSION"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# Waits until `check` succeeds or `seconds` pass; prints the log of `name` on failure.
wait_for() {
  local name="$1" seconds="$2" logfile="$3"; shift 3
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "$name did not become ready in ${seconds}s; last lines of $logfile:"
      tail -n 30 "$logfile" >&2 || true
      return 1
    fi
    sleep 0.5
  done
}

tcp_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
  local name="$1" logfile="$RUN/$1.log"; shift
  nohup "$@" >"$logfile" 2>&1 &
  echo $! >"$RUN/$name.pid"
}

make_certs() {
  local d="$RUN/pki"
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=topk-testenv-ca" \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$d/apiserver.key" -out "$d/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.0.0.1\n' >"$d/san.ext"
  openssl x509 -req -in "$d/apiserver.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -days 3650 -extfile "$d/san.ext" -out "$d/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
  openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
  openssl rand -hex 24 >"$d/admin.token"
  printf '%s,admin,admin-uid,system:masters\n' "$(cat "$d/admin.token")" >"$d/tokens.csv"
}

write_kubeconfig() {
  local port="$1" out="$2"
  cat >"$out" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority: $RUN/pki/ca.crt
users:
- name: admin
  user:
    token: $(cat "$RUN/pki/admin.token")
contexts:
- name: testenv
  context: {cluster: testenv, user: admin, namespace: default}
current-context: testenv
EOF
}

apiserver_ready() {
  curl -sf --cacert "$RUN/pki/ca.crt" -H "Authorization: Bearer $(cat "$RUN/pki/admin.token")" \
    "https://127.0.0.1:$1/readyz" | grep -q ok
}

start_kafka() {
  local port controller cluster_id
  port="$(free_port)"
  controller="$(free_port)"
  mkdir -p "$RUN/kafka"
  cat >"$RUN/kafka/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$RUN/kafka/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.cleaner.backoff.ms=1000
auto.create.topics.enable=false
EOF
  cat >"$RUN/kafka/log4j2.properties" <<'EOF'
status = error
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
EOF
  local java=(java -Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$RUN/kafka/log4j2.properties" -cp "$KAFKA_LIBS/*")
  cluster_id="$("${java[@]}" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)"
  "${java[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$RUN/kafka/server.properties" >"$RUN/kafka-format.log" 2>&1 \
    || { cat "$RUN/kafka-format.log" >&2; die "formatting Kafka storage failed"; }
  start kafka "${java[@]}" kafka.Kafka "$RUN/kafka/server.properties"
  echo "$port"
}

cmd_up() {
  cmd_install
  # Always start afresh: state left by a killed session is not trusted.
  cmd_down >/dev/null 2>&1 || true
  rm -rf "$RUN"
  mkdir -p "$RUN"
  make_certs

  local kafka_port etcd_port etcd_peer api_port cm_port
  kafka_port="$(start_kafka)"

  etcd_port="$(free_port)"
  etcd_peer="$(free_port)"
  start etcd "$KUBE_BIN/etcd" --name testenv --data-dir "$RUN/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "testenv=http://127.0.0.1:$etcd_peer" --unsafe-no-fsync --log-level warn
  wait_for etcd 60 "$RUN/etcd.log" curl -sf "http://127.0.0.1:$etcd_port/health"

  api_port="$(free_port)"
  start kube-apiserver "$KUBE_BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --cert-dir "$RUN/pki" --tls-cert-file "$RUN/pki/apiserver.crt" --tls-private-key-file "$RUN/pki/apiserver.key" \
    --client-ca-file "$RUN/pki/ca.crt" --token-auth-file "$RUN/pki/tokens.csv" \
    --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$RUN/pki/sa.pub" --service-account-signing-key-file "$RUN/pki/sa.key" \
    --service-cluster-ip-range 10.0.0.0/24 --allow-privileged=true \
    --disable-admission-plugins ServiceAccount
  wait_for kube-apiserver 120 "$RUN/kube-apiserver.log" apiserver_ready "$api_port"

  write_kubeconfig "$api_port" "$RUN/kubeconfig"
  cm_port="$(free_port)"
  start kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
    --kubeconfig "$RUN/kubeconfig" --authentication-skip-lookup=true \
    --authentication-kubeconfig "$RUN/kubeconfig" --authorization-kubeconfig "$RUN/kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$cm_port" --leader-elect=false \
    --service-account-private-key-file "$RUN/pki/sa.key" --root-ca-file "$RUN/pki/ca.crt" \
    --use-service-account-credentials=false --concurrent-gc-syncs 5
  wait_for kube-controller-manager 60 "$RUN/kube-controller-manager.log" tcp_open "$cm_port"

  wait_for kafka 120 "$RUN/kafka.log" tcp_open "$kafka_port"

  cat >"$ENV_FILE" <<EOF
# Written by scripts/testenv.sh up; source it to reach the test environment.
export TOPK_TESTENV_ENV_FILE=$ENV_FILE
export TOPK_KAFKA_BOOTSTRAP=127.0.0.1:$kafka_port
export TOPK_KAFKA_LIBS=$KAFKA_LIBS
export TOPK_KUBECONFIG=$RUN/kubeconfig
export TOPK_KUBE_VERSION=$KUBE_VERSION
export TOPK_HELM=$HELM_BIN/helm
export TOPK_ETCD=http://127.0.0.1:$etcd_port
EOF
  log "up: kafka 127.0.0.1:$kafka_port, kube-apiserver https://127.0.0.1:$api_port ($KUBE_VERSION), helm $HELM_VERSION"
  log "env file: $ENV_FILE"
}

# The pid in $RUN/NAME.pid, if that process is still the one we started (pids get reused).
our_pid() {
  local name="$1" pidfile="$RUN/$1.pid" pid marker
  [[ -f "$pidfile" ]] || return 1
  pid="$(cat "$pidfile")"
  marker="$name"
  [[ "$name" == kafka ]] && marker="kafka.Kafka"
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$marker" || return 1
  echo "$pid"
}

cmd_down() {
  local stopped=0
  for name in kube-controller-manager kube-apiserver etcd kafka; do
    local pidfile="$RUN/$name.pid"
    local pid
    if ! pid="$(our_pid "$name")"; then
      rm -f "$pidfile"
      continue
    fi
    if kill "$pid" 2>/dev/null; then
      for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      kill -9 "$pid" 2>/dev/null || true
      stopped=$((stopped + 1))
    fi
    rm -f "$pidfile"
  done
  rm -f "$ENV_FILE"
  log "stopped $stopped process(es)"
}

cmd_status() {
  local ok=0
  for name in kafka etcd kube-apiserver kube-controller-manager; do
    local pid
    if pid="$(our_pid "$name")"; then
      printf '%-24s running (pid %s)\n' "$name" "$pid"
    else
      printf '%-24s not running\n' "$name"
      ok=1
    fi
  done
  [[ -f "$ENV_FILE" ]] && cat "$ENV_FILE"
  return "$ok"
}

case "${1:-}" in
  install) cmd_install ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) echo "$ENV_FILE" ;;
  *) sed -n '2,13p' "$0" >&2; exit 2 ;;
esac
