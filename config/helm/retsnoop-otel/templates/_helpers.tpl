{{- define "retsnoop-otel.name" -}}retsnoop-otel{{- end }}

{{- define "retsnoop-otel.fullname" -}}
{{- if contains "retsnoop-otel" .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-retsnoop-otel" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end }}

{{- define "retsnoop-otel.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* the recommended labels, on every object (the kustomize base carries the same, managed-by aside) */}}
{{- define "retsnoop-otel.labels" -}}
app.kubernetes.io/name: {{ include "retsnoop-otel.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: agent
app.kubernetes.io/part-of: retsnoop-otel
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* the selector: the name alone, as in the kustomize base (a selector cannot change on upgrade) */}}
{{- define "retsnoop-otel.selectorLabels" -}}
app.kubernetes.io/name: {{ include "retsnoop-otel.name" . }}
{{- end }}

{{- define "retsnoop-otel.headersSecret" -}}
{{- .Values.exporter.existingSecret | default (printf "%s-otlp" (include "retsnoop-otel.fullname" .)) -}}
{{- end }}

{{/* the agent's config file: probeSets (each without its own sampling given the chart's), config merged over */}}
{{- define "retsnoop-otel.agentConfig" -}}
{{- $sets := list -}}
{{- range .Values.probeSets -}}
{{- $ps := deepCopy . -}}
{{- if and $.Values.sampling (not (hasKey $ps "sampling")) }}{{- $_ := set $ps "sampling" (deepCopy $.Values.sampling) -}}{{- end -}}
{{- $sets = append $sets $ps -}}
{{- end -}}
{{- $cfg := dict "probe_sets" $sets -}}
{{- $cfg = mustMergeOverwrite $cfg (deepCopy .Values.config) -}}
{{- toYaml $cfg -}}
{{- end }}
