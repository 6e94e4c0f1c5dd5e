{{/*
Object names are fixed, as in manifests/: the configuration (lease name), the admission guard
(ServiceAccount) and the ServiceMonitor (TLS server name) refer to them.
*/}}

{{/* Helm's own labels, on every object; the parity test (tests/cluster/helm.rs) removes only these. */}}
{{- define "workspace-gc.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- with .Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The labels manifests/base puts on each of its objects, and Helm's. */}}
{{- define "workspace-gc.labels" -}}
app.kubernetes.io/name: workspace-gc
app.kubernetes.io/part-of: workspace-gc
{{ include "workspace-gc.helmLabels" . }}
{{- end }}

{{/* metadata.annotations from .Values.annotations and EXTRA (a dict), or nothing. */}}
{{- define "workspace-gc.annotations" -}}
{{- $all := merge (deepCopy (.extra | default dict)) (deepCopy .root.Values.annotations) -}}
{{- with $all }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The text of config.toml: configToml (or the chart's copy of the repository's config.toml),
with the keys of .Values.config merged over it. Unchanged defaults keep the commented file.
*/}}
{{- define "workspace-gc.configText" -}}
{{- $text := .Values.configToml | default (.Files.Get "files/config.toml") -}}
{{- if .Values.config -}}
{{- $base := fromToml $text -}}
{{- if hasKey $base "Error" -}}
{{- fail (printf "configToml is not valid TOML: %s" $base.Error) -}}
{{- end -}}
{{- toToml (mergeOverwrite $base (deepCopy .Values.config)) -}}
{{- else -}}
{{- $text -}}
{{- end -}}
{{- end }}

{{/*
The effective configuration as JSON: the file's keys over the built-in defaults (which
files/config.toml lists), as the daemon reads it.
*/}}
{{- define "workspace-gc.config" -}}
{{- $config := fromToml (include "workspace-gc.configText" .) -}}
{{- if hasKey $config "Error" -}}
{{- fail (printf "the configuration is not valid TOML: %s" $config.Error) -}}
{{- end -}}
{{- toJson (mergeOverwrite (fromToml (.Files.Get "files/config.toml")) $config) -}}
{{- end }}

{{/* The Lease's namespace: leader_election.lease_namespace, or the pod's (the release's). */}}
{{- define "workspace-gc.leaseNamespace" -}}
{{- $config := include "workspace-gc.config" . | fromJson -}}
{{- (($config.leader_election | default dict).lease_namespace) | default .Release.Namespace -}}
{{- end }}
