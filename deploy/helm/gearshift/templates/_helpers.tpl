{{/* Names: <release>-gearshift-<component>, cut to DNS label length. */}}
{{- define "gearshift.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gearshift.name" -}}
{{- printf "%s-%s" (include "gearshift.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gearshift.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gearshift.labels" -}}
{{ include "gearshift.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "gearshift.image" -}}
{{ printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end -}}

{{- define "gearshift.serviceAccountName" -}}
{{- if .root.Values.serviceAccount.create -}}
{{ include "gearshift.name" . }}
{{- else -}}
default
{{- end -}}
{{- end -}}

{{/* The trial StatefulSets run only where no URL and no Secret names a server. */}}
{{- define "gearshift.trialDatabase" -}}
{{- if and (not .Values.database.url) (not .Values.database.existingSecret) -}}true{{- end -}}
{{- end -}}
{{- define "gearshift.trialRedis" -}}
{{- if and (not .Values.redis.url) (not .Values.redis.existingSecret) -}}true{{- end -}}
{{- end -}}

{{- define "gearshift.databaseSecret" -}}
{{- if .Values.database.existingSecret -}}
name: {{ .Values.database.existingSecret }}
key: {{ .Values.database.existingSecretKey }}
{{- else -}}
name: {{ include "gearshift.name" (dict "root" . "component" "database") }}
key: url
{{- end -}}
{{- end -}}
{{- define "gearshift.redisSecret" -}}
{{- if .Values.redis.existingSecret -}}
name: {{ .Values.redis.existingSecret }}
key: {{ .Values.redis.existingSecretKey }}
{{- else -}}
name: {{ include "gearshift.name" (dict "root" . "component" "redis") }}
key: url
{{- end -}}
{{- end -}}

{{/* The scheduler's database URL where the values show it (an existing Secret's is unseen). */}}
{{- define "gearshift.schedulerDatabaseUrl" -}}
{{- $url := .Values.database.url -}}
{{- range .Values.scheduler.extraEnv -}}
{{- if eq .name "GEARSHIFT_DATABASE_URL" }}{{ $url = .value | default "" }}{{ end -}}
{{- end -}}
{{- $url -}}
{{- end -}}

{{/*
A disruption budget for a daemon whose replicas are interchangeable (the Brain, the shard
manager): a drain takes one at a time. None for the scheduler: only its leader is ready, so a
budget would count the standby as down and block evicting the leader for good.
*/}}
{{- define "gearshift.disruptionBudget" -}}
{{- if gt (int .replicas) 1 }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "gearshift.name" .c }}
  labels: {{- include "gearshift.labels" .c | nindent 4 }}
spec:
  maxUnavailable: 1
  selector:
    matchLabels: {{- include "gearshift.selectorLabels" .c | nindent 6 }}
{{- end }}
{{- end -}}

{{- define "gearshift.checkSecrets" -}}
{{- if and .Values.auth.enabled (not .Values.auth.existingSecret) -}}
{{- fail "auth.enabled needs auth.existingSecret: a Secret with the keys tokens, job.key and service-token" -}}
{{- end -}}
{{- if and .Values.auth.enabled .Values.worker.enabled (not .Values.auth.workerTokensSecret) -}}
{{- fail "auth.enabled with workers needs auth.workerTokensSecret: a Secret with one key per GPU node name holding that worker's token" -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) -}}
{{- fail "tls.enabled needs tls.secretName: a Secret with tls.crt, tls.key and ca.crt" -}}
{{- end -}}
{{- if and .Values.database.url .Values.database.existingSecret -}}
{{- fail "database: give url or existingSecret, not both" -}}
{{- end -}}
{{- if and .Values.redis.url .Values.redis.existingSecret -}}
{{- fail "redis: give url or existingSecret, not both" -}}
{{- end -}}
{{- if and (gt (int .Values.scheduler.replicas) 1) (hasPrefix "sqlite" (include "gearshift.schedulerDatabaseUrl" .)) -}}
{{- fail (printf "scheduler.replicas %d on SQLite: SQLite has no leader lock, so every scheduler would lead; set scheduler.replicas to 1, or use PostgreSQL" (int .Values.scheduler.replicas)) -}}
{{- end -}}
{{- end -}}

{{/* Restricted Pod Security: non-root, no privilege escalation, no capabilities. */}}
{{- define "gearshift.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podSecurity.runAsUser }}
runAsGroup: {{ .Values.podSecurity.runAsUser }}
fsGroup: {{ .Values.podSecurity.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}
{{- define "gearshift.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* Settings every daemon shares: logs, metrics, TLS. */}}
{{- define "gearshift.commonEnv" -}}
- name: GEARSHIFT_LOG_FORMAT
  value: json
- name: GEARSHIFT_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: GEARSHIFT_METRICS_LISTEN
  value: {{ printf "0.0.0.0:%d" (int .Values.metricsPort) | quote }}
- name: HOME
  value: /tmp
{{- if .Values.tls.enabled }}
{{ include "gearshift.tlsClientEnv" . }}
{{- if .Values.tls.mutual }}
- name: GEARSHIFT_TLS_CLIENT_CA
  value: /etc/gearshift/tls/ca.crt
{{- end }}
{{- end }}
{{- end -}}

{{/* With tls.enabled (the callers check it): the certificate every pod presents and the CA
it trusts, in the tls Secret's mount: what a daemon serves and what any client calls with. */}}
{{- define "gearshift.tlsClientEnv" -}}
- name: GEARSHIFT_TLS_CERT
  value: /etc/gearshift/tls/tls.crt
- name: GEARSHIFT_TLS_KEY
  value: /etc/gearshift/tls/tls.key
- name: GEARSHIFT_TLS_CA
  value: /etc/gearshift/tls/ca.crt
{{- end -}}

{{- define "gearshift.tlsMount" -}}
- name: tls
  mountPath: /etc/gearshift/tls
  readOnly: true
{{- end -}}

{{- define "gearshift.tlsVolume" -}}
- name: tls
  secret:
    secretName: {{ .Values.tls.secretName }}
    defaultMode: 0440
{{- end -}}

{{/* The control plane's tokens: the tokens file, the job key and its own service token. */}}
{{- define "gearshift.controlPlaneAuthEnv" -}}
{{- if .Values.auth.enabled }}
- name: GEARSHIFT_TOKENS_FILE
  value: /etc/gearshift/auth/tokens
- name: GEARSHIFT_JOB_KEY_FILE
  value: /etc/gearshift/auth/job.key
- name: GEARSHIFT_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .Values.auth.existingSecret }}
      key: service-token
{{- end }}
{{- end -}}

{{- define "gearshift.commonMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.tls.enabled }}
{{ include "gearshift.tlsMount" . }}
{{- end }}
{{- if .Values.auth.enabled }}
- name: auth
  mountPath: /etc/gearshift/auth
  readOnly: true
{{- end }}
{{- end -}}

{{/* The tokens file and, but on workers, the job key: a worker never gets the key. */}}
{{- define "gearshift.commonVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ if .worker }}10Gi{{ else }}1Gi{{ end }}
{{- if .root.Values.tls.enabled }}
{{ include "gearshift.tlsVolume" .root }}
{{- end }}
{{- if .root.Values.auth.enabled }}
- name: auth
  secret:
    secretName: {{ .root.Values.auth.existingSecret }}
    defaultMode: 0440
    {{- if .worker }}
    items:
      - key: tokens
        path: tokens
    {{- end }}
{{- end }}
{{- end -}}

{{/*
Probes: the kubelet's gRPC probe calls grpc.health.v1 in plaintext only, so with TLS the probe
is `gearshift health` in the container (over TLS, trusting ca.crt; the certificate names
localhost). `readyService` (optional) is the health name the readiness probe asks for, and
`readyEvery` its period in seconds (at least 5 with TLS: each check starts a Python
process). The scheduler's readiness asks for the leader's name, often, so that a standby
that takes over joins the Service soon.
*/}}
{{- define "gearshift.probes" -}}
{{- $port := int .port -}}
{{- $ready := .readyService | default "" -}}
{{- if .root.Values.tls.enabled }}
{{- $check := list "gearshift" "health" (printf "localhost:%d" $port) "--timeout" "5" }}
startupProbe:
  exec:
    command: {{ toJson $check }}
  periodSeconds: 10
  timeoutSeconds: 10
  failureThreshold: 30
readinessProbe:
  exec:
    command: {{ toJson (concat $check (ternary (list "--service" $ready) list (ne $ready ""))) }}
  periodSeconds: {{ max 5 (.readyEvery | default 20) }}
  timeoutSeconds: 10
  failureThreshold: 3
livenessProbe:
  exec:
    command: {{ toJson $check }}
  periodSeconds: 30
  timeoutSeconds: 10
  failureThreshold: 4
{{- else }}
startupProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: 5
  failureThreshold: 60
readinessProbe:
  grpc:
    port: {{ $port }}
    {{- with $ready }}
    service: {{ . }}
    {{- end }}
  periodSeconds: {{ .readyEvery | default 10 }}
  failureThreshold: 3
livenessProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 4
{{- end }}
{{- end -}}
