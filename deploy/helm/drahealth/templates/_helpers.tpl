{{/* Names, labels and the image, shared by every template. */}}

{{- define "drahealth.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "drahealth.fullname" -}}
{{- if eq .Release.Name .Chart.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "drahealth.labels" -}}
app.kubernetes.io/name: {{ include "drahealth.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component: include "drahealth.selector" (list . "driver") */}}
{{- define "drahealth.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "drahealth.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "drahealth.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "drahealth.deviceClassName" -}}
{{- .Values.deviceClass.name | default .Values.driver.name -}}
{{- end -}}

{{/* liveness /healthz (process alive) and readiness /readyz on the metrics port */}}
{{- define "drahealth.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  {{- toYaml .Values.probes.liveness | nindent 2 }}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  {{- toYaml .Values.probes.readiness | nindent 2 }}
{{- end -}}
