#!/usr/bin/env bash
# The test environment: a real Apache Kafka broker (KRaft), etcd, kube-apiserver and
# kube-controller-manager, and Helm, provisioned from package registries only (Maven Central,
# the Go module proxy and Debian) and run on free ports; and, as root, a real node (containerd,
# kubelet, scheduler, kube-proxy, CoreDNS, volumes) that runs pods. No Docker.
#
#   scripts/testenv.sh install      fetch and build everything (idempotent, cached by version)
#   scripts/testenv.sh up           start the services, write the env file and a kubeconfig
#   scripts/testenv.sh node up      start the node next to them (root)
#   scripts/testenv.sh node image BIN_DIR TAG
#                                   build the topk image from BIN_DIR and import it into the node
#   scripts/testenv.sh node down    stop the node and remove what it made
#   scripts/testenv.sh down         stop everything started by `up` (and the node)
#   scripts/testenv.sh status       show what runs where
#   scripts/testenv.sh env          print the env file's path (source it to use the services)
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
# The Prometheus operator's CRDs (ServiceMonitor, PodMonitor, PrometheusRule), for the chart's
# monitoring objects to be checked against the real schemas.
PROMETHEUS_OPERATOR_VERSION="$(cat "$ROOT/tools/prometheus-operator/VERSION")"
MONITORING_CRDS="$BIN/monitoring-crds-$PROMETHEUS_OPERATOR_VERSION"
COREDNS_VERSION="$(cat "$ROOT/tools/coredns/VERSION")"
COREDNS_BIN="$BIN/coredns-$COREDNS_VERSION"
# The provisioner is the repo's own: its build is named by its source's hash.
PROVISIONER_BIN="$BIN/provisioner-$(cat "$ROOT/tools/provisioner/"{main.go,go.sum} | sha256sum | cut -c1-12)"
# Named by the pom too: a dependency added there is fetched, not taken from an older download.
KAFKA_LIBS="$CACHE/testenv/kafka-$KAFKA_VERSION-$(sha256sum "$ROOT/tools/kafka/pom.xml" | cut -c1-12)"
RUN="${TOPK_TESTENV_DIR:-$CACHE/testenv/run}"
ENV_FILE="$RUN/env"
# The OAUTHBEARER listeners' authorization server: who it issues tokens to and for, and their
# lifetime, short so that every test longer than a minute sees tokens renewed.
OAUTH_CLIENT_ID=topk
OAUTH_ISSUER=topk-testenv-idp
OAUTH_AUDIENCE=topk-testenv-kafka
OAUTH_KID=topk-testenv-1
OAUTH_LIFETIME=60

# Build with the Go on this machine; never fetch another toolchain.
export GOTOOLCHAIN=local

log() { printf 'testenv: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 is required ($2)"
}

# shellcheck source=scripts/testenv-node.sh
source "$ROOT/scripts/testenv-node.sh"

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
  local want=(kube-apiserver kube-controller-manager etcd kube-scheduler kubelet kube-proxy kubectl) missing=0 b
  for b in "${want[@]}"; do [[ -x "$KUBE_BIN/$b" ]] || missing=1; done
  if ((missing == 0)); then return; fi
  need go "Kubernetes is built from the published Go modules"
  log "building etcd and Kubernetes $KUBE_VERSION (control plane, kubelet, scheduler, kube-proxy, kubectl; several minutes)"
  local minor ld
  minor="$(echo "$KUBE_VERSION" | cut -d. -f2)"
  ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  mkdir -p "$KUBE_BIN.tmp"
  (cd "$ROOT/tools/k8s" && go build -trimpath -ldflags "$ld" -o "$KUBE_BIN.tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy \
    k8s.io/kubernetes/cmd/kubectl)
  (cd "$ROOT/tools/k8s" && go build -trimpath -ldflags "-s -w" -o "$KUBE_BIN.tmp/etcd" go.etcd.io/etcd/server/v3)
  rm -rf "$KUBE_BIN" && mv "$KUBE_BIN.tmp" "$KUBE_BIN"
}

# CoreDNS (the node's cluster DNS) and the node's volume provisioner, each from its Go module.
install_node_tools() {
  if [[ -x "$COREDNS_BIN/coredns" && -x "$PROVISIONER_BIN/provisioner" ]]; then return; fi
  need go "CoreDNS and the volume provisioner are built from Go modules"
  log "building CoreDNS $COREDNS_VERSION and the node's volume provisioner"
  mkdir -p "$COREDNS_BIN.tmp" "$PROVISIONER_BIN.tmp"
  (cd "$ROOT/tools/coredns" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$COREDNS_BIN.tmp/coredns" .)
  (cd "$ROOT/tools/provisioner" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$PROVISIONER_BIN.tmp/provisioner" .)
  rm -rf "$COREDNS_BIN" "$PROVISIONER_BIN"
  mv "$COREDNS_BIN.tmp" "$COREDNS_BIN" && mv "$PROVISIONER_BIN.tmp" "$PROVISIONER_BIN"
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

install_monitoring_crds() {
  if [[ -f "$MONITORING_CRDS/monitoring.coreos.com_prometheusrules.yaml" ]]; then return; fi
  need go "the Prometheus operator's CRDs come from its Go module"
  log "fetching the Prometheus operator's CRDs ($PROMETHEUS_OPERATOR_VERSION)"
  local module dir
  module="github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION"
  mkdir -p "$BIN"
  dir="$(cd "$BIN" && go mod download -json "$module" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  mkdir -p "$MONITORING_CRDS.tmp"
  for kind in servicemonitors podmonitors prometheusrules; do
    cp "$dir/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$MONITORING_CRDS.tmp/"
  done
  rm -rf "$MONITORING_CRDS" && mv "$MONITORING_CRDS.tmp" "$MONITORING_CRDS"
}

cmd_install() {
  install_node_packages
  install_kafka
  install_kube
  install_helm
  install_monitoring_crds
  install_node_tools
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
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.0.0.1,IP:%s\n' "$NODE_IP" >"$d/san.ext"
  openssl x509 -req -in "$d/apiserver.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -days 3650 -extfile "$d/san.ext" -out "$d/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
  openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
  openssl rand -hex 24 >"$d/admin.token"
  printf '%s,admin,admin-uid,system:masters\n' "$(cat "$d/admin.token")" >"$d/tokens.csv"
}

write_kubeconfig() {
  local port="$1" out="$2" host="$3"
  cat >"$out" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: https://$host:$port
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
    "https://$2:$1/readyz" | grep -q ok
}

# TLS material of the broker's secured listeners, under $RUN/kafka-tls: a CA of its own
# (ca.crt), the broker's key and certificate for 127.0.0.1 and the node's address (broker.pem,
# PKCS#8 key then certificate, as Kafka's PEM keystore reads it), a client certificate signed
# by the same CA for mutual TLS (client.crt, client.key) and the SASL user's password. For
# OAUTHBEARER: the token endpoint's certificate (idp.crt, idp.key, same CA), the key it signs
# tokens with (oauth-signing.key), its JWKS for the broker (jwks.json) and the OAuth client's
# secret (oauth-client-secret). $1: the node address or empty.
make_kafka_tls() {
  local host="$1" d="$RUN/kafka-tls" san="IP:127.0.0.1,DNS:localhost" who
  [[ -n "$host" ]] && san+=",IP:$host"
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=topk-testenv-kafka-ca" \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
  openssl genrsa -out "$d/oauth-signing.key" 2048 2>/dev/null
  python3 "$ROOT/scripts/oauth-token-server.py" jwks "$d/oauth-signing.key" "$OAUTH_KID" >"$d/jwks.json"
  openssl rand -hex 16 >"$d/oauth-client-secret"
  for who in broker client idp; do
    openssl req -newkey rsa:2048 -nodes -subj "/CN=topk-testenv-$who" \
      -keyout "$d/$who.key" -out "$d/$who.csr" 2>/dev/null
    printf 'subjectAltName=%s\n' "$san" >"$d/$who.ext"
    openssl x509 -req -in "$d/$who.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
      -days 3650 -extfile "$d/$who.ext" -out "$d/$who.crt" 2>/dev/null
  done
  cat "$d/broker.key" "$d/broker.crt" >"$d/broker.pem"
  openssl rand -hex 16 >"$d/sasl-password"
}

# Kafka on 127.0.0.1 for the host's tests and, with the node, on HOST_IP for pods ($1: the
# host address or empty). Besides PLAINTEXT it listens with TLS (SSL; a client certificate is
# its CA is required) and with SASL_SSL (SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN for
# user `topk`; OAUTHBEARER with tokens from the test environment's token endpoint); pods get a plaintext and a SASL_SSL listener. Prints the plaintext, pod, TLS,
# SASL_SSL and pod SASL_SSL ports.
start_kafka() {
  local host="$1" port controller pod_port tls_port sasl_port pod_sasl_port cluster_id listeners advertised
  port="$(free_port)"
  controller="$(free_port)"
  pod_port="$(free_port)"
  tls_port="$(free_port)"
  sasl_port="$(free_port)"
  pod_sasl_port="$(free_port)"
  listeners="PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller"
  listeners+=",SSL://127.0.0.1:$tls_port,SASL_SSL://127.0.0.1:$sasl_port"
  advertised="PLAINTEXT://127.0.0.1:$port,SSL://127.0.0.1:$tls_port,SASL_SSL://127.0.0.1:$sasl_port"
  if [[ -n "$host" ]]; then
    listeners+=",PODS://$host:$pod_port,PODS_SASL://$host:$pod_sasl_port"
    advertised+=",PODS://$host:$pod_port,PODS_SASL://$host:$pod_sasl_port"
  fi
  make_kafka_tls "$host"
  local tls="$RUN/kafka-tls" password scram plain listener
  password="$(cat "$tls/sasl-password")"
  scram='org.apache.kafka.common.security.scram.ScramLoginModule required;'
  plain="org.apache.kafka.common.security.plain.PlainLoginModule required user_topk=\"$password\";"
  local oauth='org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;'
  local oauth_validator=org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler
  mkdir -p "$RUN/kafka"
  cat >"$RUN/kafka/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller
listeners=$listeners
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,PODS:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL,PODS_SASL:SASL_SSL
ssl.keystore.type=PEM
ssl.keystore.location=$tls/broker.pem
ssl.truststore.type=PEM
ssl.truststore.location=$tls/ca.crt
listener.name.ssl.ssl.client.auth=required
sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN,OAUTHBEARER
sasl.oauthbearer.jwks.endpoint.url=file://$tls/jwks.json
sasl.oauthbearer.expected.issuer=$OAUTH_ISSUER
sasl.oauthbearer.expected.audience=$OAUTH_AUDIENCE
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
  for listener in sasl_ssl pods_sasl; do
    {
      echo "listener.name.$listener.scram-sha-512.sasl.jaas.config=$scram"
      echo "listener.name.$listener.scram-sha-256.sasl.jaas.config=$scram"
      echo "listener.name.$listener.plain.sasl.jaas.config=$plain"
      echo "listener.name.$listener.oauthbearer.sasl.jaas.config=$oauth"
      echo "listener.name.$listener.oauthbearer.sasl.server.callback.handler.class=$oauth_validator"
      # Sessions end with their token: clients must fetch new tokens and re-authenticate.
      echo "listener.name.$listener.oauthbearer.connections.max.reauth.ms=$((OAUTH_LIFETIME * 1000))"
    } >>"$RUN/kafka/server.properties"
  done
  cat >"$RUN/kafka/log4j2.properties" <<'EOF'
status = error
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
EOF
  # Kafka 4 reads an OAuth URL (here the JWKS file) only when it is allowed explicitly.
  local java=(java -Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true
    "-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=file://$tls/jwks.json"
    "-Dlog4j2.configurationFile=$RUN/kafka/log4j2.properties" -cp "$KAFKA_LIBS/*")
  cluster_id="$("${java[@]}" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)"
  # SCRAM credentials live in the cluster metadata: added when the storage is formatted.
  "${java[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$RUN/kafka/server.properties" \
    --add-scram "SCRAM-SHA-512=[name=topk,password=$password]" \
    --add-scram "SCRAM-SHA-256=[name=topk,password=$password]" >"$RUN/kafka-format.log" 2>&1 \
    || { cat "$RUN/kafka-format.log" >&2; die "formatting Kafka storage failed"; }
  start kafka "${java[@]}" kafka.Kafka "$RUN/kafka/server.properties"
  echo "$port $pod_port $tls_port $sasl_port $pod_sasl_port"
}

cmd_up() {
  cmd_install
  # Always start afresh: state left by a killed session is not trusted.
  cmd_down >/dev/null 2>&1 || true
  rm -rf "$RUN"
  mkdir -p "$RUN"
  make_certs

  # With root, the control plane and Kafka also listen on the node's address, which pods can
  # route to; `node up` can then add the node. Without, everything stays on 127.0.0.1.
  local host="127.0.0.1" node_ip="" why
  why="$(node_unsupported)"
  if [[ -z "$why" ]]; then
    node_network_up
    node_certs
    host="$NODE_IP"
    node_ip="$NODE_IP"
  else
    log "no node on this machine ($why): the control plane and Kafka stay on 127.0.0.1"
  fi

  local kafka_port kafka_pod_port kafka_tls_port kafka_sasl_port kafka_pod_sasl_port
  local etcd_port etcd_peer api_port cm_port
  read -r kafka_port kafka_pod_port kafka_tls_port kafka_sasl_port kafka_pod_sasl_port \
    <<<"$(start_kafka "$node_ip")"

  etcd_port="$(free_port)"
  etcd_peer="$(free_port)"
  start etcd "$KUBE_BIN/etcd" --name testenv --data-dir "$RUN/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "testenv=http://127.0.0.1:$etcd_peer" --unsafe-no-fsync --log-level warn
  wait_for etcd 60 "$RUN/etcd.log" curl -sf "http://127.0.0.1:$etcd_port/health"

  api_port="$(free_port)"
  local kubelet_client=()
  if [[ -n "$node_ip" ]]; then
    kubelet_client=(--kubelet-client-certificate "$RUN/pki/kubelet-client.crt"
      --kubelet-client-key "$RUN/pki/kubelet-client.key" --kubelet-preferred-address-types InternalIP)
  fi
  # The ServiceAccount admission plugin mounts each pod's token (the operator's pod needs
  # it); `TestEnv::namespace` waits for a namespace's default ServiceAccount for that.
  start kube-apiserver "$KUBE_BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address "$host" --advertise-address "$host" --secure-port "$api_port" \
    --cert-dir "$RUN/pki" --tls-cert-file "$RUN/pki/apiserver.crt" --tls-private-key-file "$RUN/pki/apiserver.key" \
    --client-ca-file "$RUN/pki/ca.crt" --token-auth-file "$RUN/pki/tokens.csv" \
    --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$RUN/pki/sa.pub" --service-account-signing-key-file "$RUN/pki/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --allow-privileged=true \
    "${kubelet_client[@]}"
  wait_for kube-apiserver 120 "$RUN/kube-apiserver.log" apiserver_ready "$api_port" "$host"

  write_kubeconfig "$api_port" "$RUN/kubeconfig" "$host"
  cm_port="$(free_port)"
  start kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
    --kubeconfig "$RUN/kubeconfig" --authentication-skip-lookup=true \
    --authentication-kubeconfig "$RUN/kubeconfig" --authorization-kubeconfig "$RUN/kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$cm_port" --leader-elect=false \
    --service-account-private-key-file "$RUN/pki/sa.key" --root-ca-file "$RUN/pki/ca.crt" \
    --use-service-account-credentials=false --concurrent-gc-syncs 5
  wait_for kube-controller-manager 60 "$RUN/kube-controller-manager.log" tcp_open "$cm_port"

  wait_for kafka 120 "$RUN/kafka.log" tcp_open "$kafka_port"

  # The OAuth token endpoint of the OAUTHBEARER listeners, for the host and for pods.
  local oauth_port tls="$RUN/kafka-tls" listen=(--listen 127.0.0.1)
  oauth_port="$(free_port)"
  [[ -n "$node_ip" ]] && listen+=(--listen "$node_ip")
  start oauth-token-server python3 "$ROOT/scripts/oauth-token-server.py" serve \
    --signing-key "$tls/oauth-signing.key" --kid "$OAUTH_KID" --cert "$tls/idp.crt" --key "$tls/idp.key" \
    --client-id "$OAUTH_CLIENT_ID" --client-secret-file "$tls/oauth-client-secret" \
    --issuer "$OAUTH_ISSUER" --audience "$OAUTH_AUDIENCE" --lifetime "$OAUTH_LIFETIME" \
    --port "$oauth_port" "${listen[@]}"
  wait_for oauth-token-server 30 "$RUN/oauth-token-server.log" tcp_open "$oauth_port"

  cat >"$ENV_FILE" <<EOF
# Written by scripts/testenv.sh up; source it to reach the test environment.
export TOPK_TESTENV_ENV_FILE=$ENV_FILE
export TOPK_KAFKA_BOOTSTRAP=127.0.0.1:$kafka_port
export TOPK_KAFKA_LIBS=$KAFKA_LIBS
export TOPK_KAFKA_TLS_BOOTSTRAP=127.0.0.1:$kafka_tls_port
export TOPK_KAFKA_SASL_BOOTSTRAP=127.0.0.1:$kafka_sasl_port
export TOPK_KAFKA_TLS_DIR=$RUN/kafka-tls
export TOPK_KAFKA_SASL_USER=topk
export TOPK_KAFKA_OAUTH_CLIENT_ID=$OAUTH_CLIENT_ID
export TOPK_KAFKA_OAUTH_TOKEN_URL=https://127.0.0.1:$oauth_port/token
export TOPK_KUBECONFIG=$RUN/kubeconfig
export TOPK_KUBE_VERSION=$KUBE_VERSION
export TOPK_HELM=$HELM_BIN/helm
export TOPK_MONITORING_CRDS=$MONITORING_CRDS
export TOPK_ETCD=http://127.0.0.1:$etcd_port
EOF
  if [[ -n "$node_ip" ]]; then
    cat >>"$ENV_FILE" <<EOF
export TOPK_TESTENV_NODE_IP=$node_ip
export TOPK_KAFKA_POD_BOOTSTRAP=$node_ip:$kafka_pod_port
export TOPK_KAFKA_POD_SASL_BOOTSTRAP=$node_ip:$kafka_pod_sasl_port
export TOPK_KAFKA_POD_OAUTH_TOKEN_URL=https://$node_ip:$oauth_port/token
EOF
  fi
  log "up: kafka 127.0.0.1:$kafka_port, kube-apiserver https://$host:$api_port ($KUBE_VERSION), helm $HELM_VERSION"
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

# Stops the process `up` started as NAME, if it still runs.
stop_ours() {
  local name="$1" pid
  if pid="$(our_pid "$name")" && kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$RUN/$name.pid"
}

cmd_down() {
  cmd_node_down
  local name
  for name in kube-controller-manager kube-apiserver etcd kafka oauth-token-server; do
    stop_ours "$name"
  done
  node_network_down
  rm -f "$ENV_FILE"
  log "stopped"
}

# One line per process `up` started as NAME...; fails when one is not running.
show_processes() {
  local ok=0 name pid
  for name in "$@"; do
    if pid="$(our_pid "$name")"; then
      printf '%-24s running (pid %s)\n' "$name" "$pid"
    else
      printf '%-24s not running\n' "$name"
      ok=1
    fi
  done
  return "$ok"
}

cmd_status() {
  local ok=0
  show_processes kafka oauth-token-server etcd kube-apiserver kube-controller-manager || ok=1
  [[ -f "$ENV_FILE" ]] && cat "$ENV_FILE"
  return "$ok"
}

case "${1:-}" in
  install) cmd_install ;;
  node)
    case "${2:-}" in
      up) cmd_node_up ;;
      down) cmd_node_down && log "node stopped" ;;
      status) cmd_node_status ;;
      image-archive) echo "$NODE/images/topk/image.tar" ;;
      image) [[ $# == 4 ]] || die "usage: $0 node image BIN_DIR TAG"; build_topk_image "$3" "$4" ;;
      *) sed -n '2,20p' "$0" >&2; exit 2 ;;
    esac ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) echo "$ENV_FILE" ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
