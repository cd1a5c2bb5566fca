{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "statehouse.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-statehouse unless the release name already contains the chart name.
Pods are <fullname>-<ordinal>, so keep it short enough for the ordinal suffix.
*/}}
{{- define "statehouse.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "statehouse.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "statehouse.selectorLabels" -}}
app.kubernetes.io/name: {{ include "statehouse.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "statehouse.labels" -}}
helm.sh/chart: {{ include "statehouse.chart" . }}
{{ include "statehouse.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: state-service
app.kubernetes.io/part-of: statehouse
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The headless Service that gives every replica a stable DNS name. */}}
{{- define "statehouse.headlessName" -}}
{{- printf "%s-headless" (include "statehouse.fullname" .) }}
{{- end }}

{{- define "statehouse.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "statehouse.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "statehouse.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* STATEHOUSE_CHECKPOINT_DIR: s3://bucket/prefix with S3, else the local checkpoint volume. */}}
{{- define "statehouse.checkpointDir" -}}
{{- if .Values.s3.enabled }}
{{- $bucket := required "s3.bucket is required when s3.enabled is true" .Values.s3.bucket }}
{{- $prefix := trimAll "/" .Values.s3.prefix }}
{{- if $prefix }}
{{- printf "s3://%s/%s" $bucket $prefix }}
{{- else }}
{{- printf "s3://%s" $bucket }}
{{- end }}
{{- else }}
{{- print "/checkpoints" }}
{{- end }}
{{- end }}

{{/* Name of the Secret with the AWS credentials, or "" when the pod's IAM role is used. */}}
{{- define "statehouse.s3SecretName" -}}
{{- if .Values.s3.existingSecret }}
{{- .Values.s3.existingSecret }}
{{- else if and .Values.s3.accessKeyId .Values.s3.secretAccessKey }}
{{- printf "%s-s3" (include "statehouse.fullname" .) }}
{{- end }}
{{- end }}

{{/* Name of the Secret with the API tokens. */}}
{{- define "statehouse.authSecretName" -}}
{{- if .Values.auth.existingSecret }}
{{- .Values.auth.existingSecret }}
{{- else }}
{{- printf "%s-auth" (include "statehouse.fullname" .) }}
{{- end }}
{{- end }}

{{/* Base URL of replica $i through the headless Service: call with (list $ $i). */}}
{{- define "statehouse.replicaUrl" -}}
{{- $ctx := index . 0 }}
{{- $i := index . 1 }}
{{- include "statehouse.replicaUrlTemplate" $ctx | replace "{index}" (toString (int $i)) }}
{{- end }}

{{/* Every replica's URL with {index} for the replica index (STATEHOUSE_REPLICA_URLS). */}}
{{- define "statehouse.replicaUrlTemplate" -}}
{{- printf "http://%s-{index}.%s.%s.svc.cluster.local:%d" (include "statehouse.fullname" .) (include "statehouse.headlessName" .) .Release.Namespace (int .Values.service.port) }}
{{- end }}

{{/*
Labels of the rescale hook Jobs and their pods: not the StatefulSet's selector labels, so that
neither the Services nor the PodDisruptionBudget select a hook pod.
*/}}
{{- define "statehouse.rescaleLabels" -}}
helm.sh/chart: {{ include "statehouse.chart" . }}
app.kubernetes.io/name: {{ printf "%s-rescale" (include "statehouse.name" . | trunc 55 | trimSuffix "-") }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: rescale
app.kubernetes.io/part-of: statehouse
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}
