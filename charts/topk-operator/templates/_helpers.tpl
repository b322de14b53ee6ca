{{- define "topk.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "topk.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "topk.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "topk.serviceAccountName" -}}
{{- default (include "topk.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "topk.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* What the operator does, and no more, in a ClusterRole or in a Role per watched namespace.
It also holds every permission it grants to a metric's data-plane Role (Kubernetes refuses to
let it grant more than it has). */}}
{{- define "topk.operatorRules" -}}
rules:
  - apiGroups: [topk.io]
    resources: [topkmetrics]
    verbs: [get, list, watch, patch, update]
  - apiGroups: [topk.io]
    resources: [topkmetrics/status]
    verbs: [get, patch, update]
  - apiGroups: [topk.io]
    resources: [topkmetrics/finalizers]
    verbs: [update]
  - apiGroups: [""]
    resources: [configmaps, services, serviceaccounts]
    verbs: [get, list, watch, create, patch, update, delete]
  - apiGroups: [apps]
    resources: [statefulsets, deployments]
    verbs: [get, list, watch, create, patch, update, delete]
  - apiGroups: [policy]
    resources: [poddisruptionbudgets]
    verbs: [get, list, watch, create, patch, update, delete]
  - apiGroups: [rbac.authorization.k8s.io]
    resources: [roles, rolebindings]
    verbs: [get, list, watch, create, patch, update, delete]
  - apiGroups: [batch]
    resources: [jobs]
    verbs: [get, list, watch, create, patch, delete]
  # Recount Jobs' termination messages.
  - apiGroups: [""]
    resources: [pods]
    verbs: [get, list]
  # The Kafka credentials a metric references (spec.source.kafka): the operator's own admin
  # client connects with them; pods get them as mounted files.
  - apiGroups: [""]
    resources: [secrets]
    verbs: [get]
  - apiGroups: [events.k8s.io]
    resources: [events]
    verbs: [create, patch]
{{- end -}}


{{/* Egress every topk pod needs: DNS, the Kafka brokers, the API server (.Values.networkPolicy). */}}
{{- define "topk.egress" -}}
- ports:
    - {protocol: UDP, port: 53}
    - {protocol: TCP, port: 53}
- ports:
    {{- range .kafka.ports }}
    - {protocol: TCP, port: {{ . }}}
    {{- end }}
  {{- with .kafka.to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
- ports:
    {{- range .apiServer.ports }}
    - {protocol: TCP, port: {{ . }}}
    {{- end }}
  {{- with .apiServer.to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
