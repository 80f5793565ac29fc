{{/* Names, labels and shared snippets of the Tidelog chart. */}}

{{- define "tidelog.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-tidelog, or the release name alone when it already says tidelog.
Kept short: pod names add "-broker-12" and DNS labels stop at 63. */}}
{{- define "tidelog.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels on every object. The chart version is here, never in selectors
or volumeClaimTemplates (both immutable: an upgrade would be refused). */}}
{{- define "tidelog.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: tidelog
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* Selector labels of one component: call with (dict "ctx" $ "component" "broker"). */}}
{{- define "tidelog.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tidelog.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "tidelog.componentLabels" -}}
{{ include "tidelog.labels" .ctx }}
{{ include "tidelog.selectorLabels" . }}
{{- end }}

{{/* The image of a Tidelog component: call with (dict "ctx" $ "image" .Values.broker.image). */}}
{{- define "tidelog.image" -}}
{{- $tag := default (default .ctx.Chart.AppVersion .ctx.Values.image.tag) .image.tag }}
{{- if .ctx.Values.image.registry }}
{{- printf "%s/%s:%s" .ctx.Values.image.registry .image.repository $tag }}
{{- else }}
{{- printf "%s:%s" .image.repository $tag }}
{{- end }}
{{- end }}

{{- define "tidelog.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tidelog.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tidelog.brokerHeadless" -}}
{{ include "tidelog.fullname" . }}-broker-headless
{{- end }}

{{- define "tidelog.coordinatorHeadless" -}}
{{ include "tidelog.fullname" . }}-coordinator-headless
{{- end }}

{{/* The names a certificate must cover, one per component: what peers and
clients dial (docs/deploy.md). Wildcards are checked as "health.<domain>". */}}
{{- define "tidelog.tlsName" -}}
{{- $domain := printf "%s.svc.%s" .ctx.Release.Namespace .ctx.Values.clusterDomain }}
{{- if eq .component "broker" }}
{{- printf "health.%s.%s" (include "tidelog.brokerHeadless" .ctx) $domain }}
{{- else if eq .component "coordinator" }}
{{- printf "health.%s.%s" (include "tidelog.coordinatorHeadless" .ctx) $domain }}
{{- else }}
{{- printf "%s-gateway.%s" (include "tidelog.fullname" .ctx) $domain }}
{{- end }}
{{- end }}

{{- define "tidelog.etcdHeadless" -}}
{{ include "tidelog.fullname" . }}-etcd-headless
{{- end }}

{{/* Every etcd member, comma separated: what the services' --etcd takes.
They use the first and move to the next when it dies. */}}
{{- define "tidelog.etcdEndpoints" -}}
{{- if .Values.etcd.enabled }}
{{- $fullname := include "tidelog.fullname" . }}
{{- $headless := include "tidelog.etcdHeadless" . }}
{{- $members := list }}
{{- range $i := until (int .Values.etcd.replicas) }}
{{- $members = append $members (printf "%s-etcd-%d.%s.%s.svc.%s:%d" $fullname $i $headless $.Release.Namespace $.Values.clusterDomain (int $.Values.etcd.clientPort)) }}
{{- end }}
{{- join "," $members }}
{{- else }}
{{- if not .Values.etcd.externalEndpoints }}
{{- fail "etcd.enabled is false: give etcd.externalEndpoints (host:port of each member)" }}
{{- end }}
{{- join "," .Values.etcd.externalEndpoints }}
{{- end }}
{{- end }}

{{/* Pod anti-affinity of one component: call with
(dict "ctx" $ "component" "broker" "mode" "soft" "topologyKey" "kubernetes.io/hostname"). */}}
{{- define "tidelog.antiAffinity" -}}
podAntiAffinity:
{{- if eq .mode "hard" }}
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: {{ .topologyKey }}
      labelSelector:
        matchLabels:
          {{- include "tidelog.selectorLabels" . | nindent 10 }}
{{- else }}
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: {{ .topologyKey }}
        labelSelector:
          matchLabels:
            {{- include "tidelog.selectorLabels" . | nindent 12 }}
{{- end }}
{{- end }}

{{/* Environment every Tidelog container gets: its pod's name, namespace
and IP (for advertised addresses), and a Python that writes nothing outside
its volumes (the root filesystem is read-only). */}}
{{- define "tidelog.podEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
- name: PYTHONUNBUFFERED
  value: "1"
- name: HOME
  value: /tmp
{{- end }}

{{/* Where the TLS Secret is mounted (read-only, never with subPath: a
subPath mount is not updated when the Secret is rotated). */}}
{{- define "tidelog.tlsDir" -}}
/etc/tidelog-tls
{{- end }}

{{- define "tidelog.tlsSecret" -}}
{{- if not .Values.tls.existingSecret }}
{{- fail "tls.enabled is true: give tls.existingSecret (a Secret with tls.crt, tls.key and ca.crt)" }}
{{- end }}
{{- .Values.tls.existingSecret }}
{{- end }}

{{/* Metrics and TLS options every Tidelog service takes: call with
(dict "ctx" $ "listenHost" "0.0.0.0"). */}}
{{- define "tidelog.commonArgs" -}}
{{- $v := .ctx.Values }}
{{- if $v.metrics.enabled }}
- --metrics-port={{ $v.metrics.port }}
- --metrics-host={{ .listenHost }}
{{- end }}
{{- if $v.tls.enabled }}
{{- $dir := include "tidelog.tlsDir" .ctx }}
- --tls-certfile={{ $dir }}/tls.crt
- --tls-keyfile={{ $dir }}/tls.key
- --tls-cafile={{ $dir }}/ca.crt
- --tls-client-auth={{ $v.tls.clientAuth }}
{{- end }}
{{- if $v.etcd.auth.user }}
- --etcd-user={{ $v.etcd.auth.user }}
- --etcd-password-file={{ include "tidelog.etcdAuthDir" .ctx }}/{{ $v.etcd.auth.passwordKey }}
{{- end }}
{{- end }}

{{- define "tidelog.etcdAuthDir" -}}
/etc/tidelog-etcd-auth
{{- end }}

{{/* The etcd password Secret as files (mode 0440, as the certificates). */}}
{{- define "tidelog.etcdAuthVolumeMount" -}}
{{- if .Values.etcd.auth.user }}
- name: etcd-auth
  mountPath: {{ include "tidelog.etcdAuthDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "tidelog.etcdAuthVolume" -}}
{{- if .Values.etcd.auth.user }}
{{- if not .Values.etcd.auth.existingSecret }}
{{- fail "etcd.auth.user is set: give etcd.auth.existingSecret (a Secret holding its password)" }}
{{- end }}
- name: etcd-auth
  secret:
    secretName: {{ .Values.etcd.auth.existingSecret }}
    defaultMode: 288
{{- end }}
{{- end }}

{{/* The metrics container port (nothing when metrics are off). */}}
{{- define "tidelog.metricsContainerPort" -}}
{{- if .Values.metrics.enabled }}
- name: metrics
  containerPort: {{ .Values.metrics.port }}
{{- end }}
{{- end }}

{{/* Pod annotations of a Tidelog component: Prometheus' scrape annotations
and the component's own; call with (dict "ctx" $ "extra" .Values.broker.podAnnotations). */}}
{{- define "tidelog.podAnnotations" -}}
{{- $v := .ctx.Values }}
{{- $annotations := deepCopy (.extra | default dict) }}
{{- if and $v.metrics.enabled $v.metrics.podAnnotations }}
{{- /* merge keeps the component's own values where both set a key */}}
{{- $annotations = merge $annotations (dict "prometheus.io/scrape" "true" "prometheus.io/port" (toString $v.metrics.port) "prometheus.io/path" "/metrics") }}
{{- end }}
{{- with $annotations }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/* A probe of a service's gRPC health (grpc.health.v1): call with
(dict "ctx" $ "port" 9392 "service" "" "serverName" NAME). Kubernetes' native
gRPC probe speaks no TLS: with TLS on, the image's `tidelog-health` command
asks the same question over TLS, presenting the pod's own certificate and
checking the server's for NAME, a name the component's peers dial (so a
certificate that does not cover it keeps the pod from being Ready). */}}
{{- define "tidelog.healthProbe" -}}
{{- if .ctx.Values.tls.enabled }}
{{- $dir := include "tidelog.tlsDir" .ctx }}
exec:
  command:
    - tidelog-health
    - --address=127.0.0.1:{{ .port }}
    - --service={{ .service }}
    - --timeout-s=4
    - --server-name={{ .serverName }}
    - --tls-cafile={{ $dir }}/ca.crt
    - --tls-certfile={{ $dir }}/tls.crt
    - --tls-keyfile={{ $dir }}/tls.key
{{- else }}
grpc:
  port: {{ .port }}
  service: {{ .service | quote }}
{{- end }}
{{- end }}

{{- define "tidelog.tlsVolumeMount" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: {{ include "tidelog.tlsDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/* Mode 0440 (288): readable by the pods' group (fsGroup), not by others. */}}
{{- define "tidelog.tlsVolume" -}}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "tidelog.tlsSecret" . }}
    defaultMode: 288
{{- end }}
{{- end }}

{{/* appProtocol of a Tidelog gRPC port: cleartext HTTP/2 unless TLS is on. */}}
{{- define "tidelog.appProtocol" -}}
{{- if not .Values.tls.enabled }}
appProtocol: kubernetes.io/h2c
{{- end }}
{{- end }}
