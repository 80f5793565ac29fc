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
