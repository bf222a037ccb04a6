{{/* The chart name, shortened to what a label value may hold. */}}
{{- define "cursorsync.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's resources. Spark derives pod and Service names from the
application name, so it stays well under 63 characters.
*/}}
{{- define "cursorsync.fullname" -}}
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

{{- define "cursorsync.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every resource carries. */}}
{{- define "cursorsync.labels" -}}
helm.sh/chart: {{ include "cursorsync.chart" . }}
{{ include "cursorsync.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "cursorsync.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cursorsync.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The metrics Service's name; Prometheus (via the ServiceMonitor) uses it as the job label. */}}
{{- define "cursorsync.metricsService" -}}
{{- printf "%s-metrics" (include "cursorsync.fullname" .) }}
{{- end }}

{{- define "cursorsync.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cursorsync.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "cursorsync.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The state volume's claim: the existing one named, or the one the chart creates. */}}
{{- define "cursorsync.stateClaimName" -}}
{{- default (printf "%s-state" (include "cursorsync.fullname" .)) .Values.persistence.claimName }}
{{- end }}

{{/* Spark's local dir on the driver and the executors: a volume whose name starts with
spark-local-dir- is the one Spark takes as its local dir (SPARK_LOCAL_DIRS), so it
creates no other. */}}
{{- define "cursorsync.localDirMount" -}}
/var/data/spark-local-dir-1
{{- end }}

{{/*
The local path a config path names: the path itself, a file: URI's path, or "" for a URI
of another scheme (object storage).
*/}}
{{- define "cursorsync.localPath" -}}
{{- if regexMatch "^(?i)file:" . }}
{{- regexReplaceAll "^(?i)file:(//(localhost)?)?" . "" }}
{{- else if not (regexMatch "^[A-Za-z][A-Za-z0-9+.-]*://" .) }}
{{- . }}
{{- end }}
{{- end }}

{{/* The cursorsync config file, as the ConfigMap holds it. */}}
{{- define "cursorsync.configYaml" -}}
{{- toYaml .Values.config }}
{{- end }}

{{/* The metrics port of the job (config.metrics.port). */}}
{{- define "cursorsync.metricsPort" -}}
{{- .Values.config.metrics.port | int }}
{{- end }}

{{/*
Selector of the release's series in alert expressions: the labels Prometheus adds to
every target of the ServiceMonitor.
*/}}
{{- define "cursorsync.alertSelector" -}}
namespace="{{ .Release.Namespace }}", job="{{ include "cursorsync.metricsService" . }}"
{{- end }}

{{/*
How much a counter went up within a window, counting a series born in it: a labelled
counter appears at its first increment, which increase() alone does not see.
Arguments: (list <metric with selector> <window>).
*/}}
{{- define "cursorsync.counterIncrease" -}}
{{- $series := index . 0 }}{{ $window := index . 1 -}}
(increase({{ $series }}[{{ $window }}]) > 0 or ({{ $series }} unless {{ $series }} offset {{ $window }}))
{{- end }}

{{/*
Checks the values cannot express in the schema; each fails rendering with the reason.
*/}}
{{- define "cursorsync.validate" -}}
{{- $cfg := .Values.config }}
{{- $p := .Values.persistence }}
{{- $mounts := list }}
{{- range .Values.secrets.tokens }}{{ $mounts = append $mounts .mountPath }}{{ end }}
{{- if .Values.secrets.tls.secretName }}{{ $mounts = append $mounts .Values.secrets.tls.mountPath }}{{ end }}
{{- if $p.enabled }}{{ $mounts = append $mounts $p.mountPath }}{{ end }}
{{- range .Values.extraVolumeMounts }}{{ $mounts = append $mounts .mountPath }}{{ end }}
{{- range $mounts }}
{{- if or (eq (clean .) "/etc/cursorsync") (hasPrefix "/etc/cursorsync/" (clean .)) }}
{{- fail (printf "mount path %s is inside /etc/cursorsync, where the config is mounted (read-only): choose another path" .) }}
{{- end }}
{{- end }}
{{- $own := list "config" "tls" "state" "tmp" "spark-local-dir-1" "work-dir" }}
{{- range $i, $_ := .Values.secrets.tokens }}{{ $own = append $own (printf "token-%d" $i) }}{{ end }}
{{- range .Values.extraVolumes }}
{{- if has .name $own }}
{{- fail (printf "extraVolumes: the name %s is one the chart gives its own volumes (%s): choose another" .name (join ", " $own)) }}
{{- end }}
{{- end }}
{{- $volume := trimSuffix "/" $p.mountPath }}
{{- $ckpt := $cfg.spark.checkpoint_dir }}
{{- if not (include "cursorsync.localPath" $ckpt) }}
{{- fail (printf "config.spark.checkpoint_dir is %q, not a local path: the job keeps its mapping builder's state and the cursor polls it replays there as files, beside Spark's checkpoints. Use a path under persistence.mountPath (%s); object storage is for config.tables.path" $ckpt $p.mountPath) }}
{{- end }}
{{- $tables := include "cursorsync.localPath" $cfg.tables.path }}
{{- $tablesOnVolume := and $p.enabled $tables (hasPrefix (printf "%s/" $volume) (clean $tables)) }}
{{- if and (eq (default "delta-rs" $cfg.tables.backend) "delta-spark") $tablesOnVolume (not $p.executors) }}
{{- fail (printf "config.tables.path %q is on the state volume and the backend is delta-spark, whose executors write the table files: set persistence.executors true (with a ReadWriteMany claim), or use backend delta-rs, which writes from the driver alone" $cfg.tables.path) }}
{{- end }}
{{- if and $p.enabled $p.executors (not $p.claimName) (not (has "ReadWriteMany" $p.accessModes)) }}
{{- fail (printf "persistence.executors mounts the state volume on every executor, on other nodes than the driver: persistence.accessModes (%s) must include ReadWriteMany" (join ", " $p.accessModes)) }}
{{- end }}
{{- if .Values.validation.requireDurableState }}
{{- $paths := dict "config.spark.checkpoint_dir" $ckpt "config.tables.path" $cfg.tables.path }}
{{- range $key, $path := $paths }}
{{- $local := include "cursorsync.localPath" $path }}
{{- $onVolume := and $p.enabled (hasPrefix (printf "%s/" $volume) (clean $local)) }}
{{- if and $local (not $onVolume) }}
{{- fail (printf "%s is %q, a local path that no volume holds: the state would go with the pod. Use a path under persistence.mountPath (%s) with persistence.enabled, or set validation.requireDurableState false" $key $path $p.mountPath) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
What the driver and the executors share: resources, labels, the mounts (config, tokens,
TLS, scratch, extra volumes, and the state volume where it is wanted), environment,
scheduling and security. The executors run the data sources and, with executor emission,
the acks, so they need the same files as the driver.
Arguments: dict root, role (.Values.driver or .Values.executor), checksum, state (mount
the state volume).
*/}}
{{- define "cursorsync.podSpec" -}}
{{- $root := .root }}{{ $role := .role -}}
cores: {{ $role.cores }}
{{- with $role.coreLimit }}
coreLimit: {{ . | quote }}
{{- end }}
memory: {{ $role.memory | quote }}
{{- with $role.memoryOverhead }}
memoryOverhead: {{ . | quote }}
{{- end }}
labels:
  {{- include "cursorsync.labels" $root | nindent 2 }}
  {{- with $role.labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  # A config change changes the spec, and the operator submits the application again.
  checksum/config: {{ .checksum }}
  {{- with $role.annotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
volumeMounts:
  - name: config
    mountPath: /etc/cursorsync
    readOnly: true
  {{- range $i, $token := $root.Values.secrets.tokens }}
  - name: token-{{ $i }}
    mountPath: {{ $token.mountPath }}
    readOnly: true
  {{- end }}
  {{- if $root.Values.secrets.tls.secretName }}
  - name: tls
    mountPath: {{ $root.Values.secrets.tls.mountPath }}
    readOnly: true
  {{- end }}
  {{- if .state }}
  - name: state
    mountPath: {{ $root.Values.persistence.mountPath }}
  {{- end }}
  - name: tmp
    mountPath: /tmp
  - name: spark-local-dir-1
    mountPath: {{ include "cursorsync.localDirMount" $root }}
  - name: work-dir
    mountPath: /opt/spark/work-dir
  {{- with $root.Values.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- if or $root.Values.env $root.Values.secrets.env }}
env:
  {{- range $name, $value := $root.Values.env }}
  - name: {{ $name }}
    value: {{ $value | toString | quote }}
  {{- end }}
  {{- range $root.Values.secrets.env }}
  - name: {{ .name }}
    valueFrom:
      secretKeyRef:
        name: {{ .secretName }}
        key: {{ .key }}
        optional: {{ .optional | default false }}
  {{- end }}
{{- end }}
{{- with $root.Values.secrets.envFrom }}
envFrom:
  {{- range . }}
  - secretRef:
      name: {{ .secretName }}
      optional: {{ .optional | default false }}
  {{- end }}
{{- end }}
{{- with $role.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $role.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $role.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $root.Values.podSecurityContext }}
podSecurityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
