{{/*
Chart name, truncated to the 63 characters Kubernetes names allow.
*/}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's objects. Release "sluice" gives "sluice" (the Service name the
Envoy and Istio examples use); any other release name gets "<release>-sluice".
*/}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ include "sluice.chart" . }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sluice
{{- end }}

{{/*
Selector labels: never change them in an upgrade (a Deployment's selector is immutable).
*/}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sluice.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}

{{/*
The backend, checked: "memory" or "redis".
*/}}
{{- define "sluice.backend" -}}
{{- $backend := lower (toString .Values.backend) }}
{{- if not (has $backend (list "memory" "redis")) }}
{{- fail (printf "backend must be memory or redis, not %q" (toString .Values.backend)) }}
{{- end }}
{{- $backend }}
{{- end }}

{{/*
Replica count: replicaCount when set, else 1 for memory and 2 for redis.
*/}}
{{- define "sluice.replicas" -}}
{{- if or (kindIs "invalid" .Values.replicaCount) (eq (toString .Values.replicaCount) "") }}
{{- if eq (include "sluice.backend" .) "redis" }}2{{ else }}1{{ end }}
{{- else }}
{{- int .Values.replicaCount }}
{{- end }}
{{- end }}

{{/*
DEGRADED_REPLICAS with failurePolicy local_share on Redis: localShare.replicas when set (0:
learnt), else the Deployment's replica count, or "" (not set: learnt from Redis) when an
autoscaler moves that count.
*/}}
{{- define "sluice.degradedReplicas" -}}
{{- $set := (.Values.localShare | default dict).replicas }}
{{- if and (eq (toString .Values.failurePolicy) "local_share") (eq (include "sluice.backend" .) "redis") }}
{{- if not (or (kindIs "invalid" $set) (eq (toString $set) "")) }}
{{- int64 $set }}
{{- else if not .Values.autoscaling.enabled }}
{{- include "sluice.replicas" . }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Whether more than one pod can run at once (several replicas or autoscaling): "true" or "".
*/}}
{{- define "sluice.multiplePods" -}}
{{- if or .Values.autoscaling.enabled (gt (int (include "sluice.replicas" .)) 1) }}true{{ end }}
{{- end }}

{{- define "sluice.configMapName" -}}
{{- if .Values.existingConfigMap }}
{{- .Values.existingConfigMap }}
{{- else }}
{{- printf "%s-config" (include "sluice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/*
Whether REDIS_AUTH is set: "true" or "".
*/}}
{{- define "sluice.redisAuth" -}}
{{- if and (eq (include "sluice.backend" .) "redis") .Values.redis.auth.enabled }}true{{ end }}
{{- end }}

{{/*
Name of the Secret that holds REDIS_AUTH.
*/}}
{{- define "sluice.redisSecretName" -}}
{{- if .Values.redis.auth.existingSecret }}
{{- .Values.redis.auth.existingSecret }}
{{- else }}
{{- printf "%s-redis" (include "sluice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/*
Go-boolean environment value ("true"/"false") from a values flag.
*/}}
{{- define "sluice.bool" -}}
{{- if . }}true{{ else }}false{{ end }}
{{- end }}

{{/*
Checks that fail the render with a clear message instead of producing a broken release.
*/}}
{{- define "sluice.validate" -}}
{{- $backend := include "sluice.backend" . }}
{{- if and (eq $backend "memory") (include "sluice.multiplePods" .) (not .Values.memory.allowMultipleReplicas) }}
{{- fail "backend memory keeps separate counters in every pod, so several pods (replicaCount > 1 or autoscaling.enabled) multiply the limits. Use backend: redis, or set memory.allowMultipleReplicas: true to accept per-pod counting." }}
{{- end }}
{{- if eq $backend "redis" }}
{{- include "sluice.validateRedis" (dict "name" "redis" "values" .Values.redis) }}
{{- if and .Values.redis.auth.enabled (not .Values.redis.auth.existingSecret) (not .Values.redis.auth.password) }}
{{- fail "redis.auth.enabled needs redis.auth.existingSecret (preferred) or redis.auth.password" }}
{{- end }}
{{- if and .Values.redis.startupDegraded (not .Values.redis.startupMaxElapsedTime) }}
{{- fail "redis.startupDegraded needs redis.startupMaxElapsedTime (e.g. 10s): Sluice starts degraded only once that wait is over, and with no limit it waits forever" }}
{{- end }}
{{- if .Values.redis.perSecond.enabled }}
{{- include "sluice.validateRedis" (dict "name" "redis.perSecond" "values" .Values.redis.perSecond) }}
{{- end }}
{{- end }}
{{- if not (has (toString .Values.failurePolicy) (list "fail_closed" "fail_open" "local_share")) }}
{{- fail (printf "failurePolicy must be local_share, fail_closed or fail_open, not %q" (toString .Values.failurePolicy)) }}
{{- end }}
{{- $shareReplicas := (.Values.localShare | default dict).replicas }}
{{- if not (or (kindIs "invalid" $shareReplicas) (eq (toString $shareReplicas) "")) }}
{{- if not (regexMatch "^[0-9]+$" (toString $shareReplicas)) }}
{{- fail (printf "localShare.replicas must be empty (the Deployment's count), 0 (learnt from Redis) or a replica count, not %q" (toString $shareReplicas)) }}
{{- end }}
{{- end }}
{{- $rate := float64 .Values.tracing.samplingRate }}
{{- if or (lt $rate 0.0) (gt $rate 1.0) }}
{{- fail (printf "tracing.samplingRate must be between 0 and 1, not %v" .Values.tracing.samplingRate) }}
{{- end }}
{{- $near := float64 .Values.settings.nearLimitRatio }}
{{- if or (lt $near 0.0) (gt $near 1.0) }}
{{- fail (printf "settings.nearLimitRatio must be between 0 and 1, not %v" .Values.settings.nearLimitRatio) }}
{{- end }}
{{- $sleep := int .Values.lifecycle.preStopSleepSeconds }}
{{- $grace := int .Values.settings.shutdownGracePeriodSeconds }}
{{- if lt (int .Values.terminationGracePeriodSeconds) (add $sleep $grace) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be at least lifecycle.preStopSleepSeconds + settings.shutdownGracePeriodSeconds (%d)" (int .Values.terminationGracePeriodSeconds) (add $sleep $grace)) }}
{{- end }}
{{- end }}

{{/*
REDIS_TYPE of a redis block (redis, redis.perSecond): single, cluster or sentinel.
*/}}
{{- define "sluice.redisType" -}}
{{- lower (toString (default "single" .type)) }}
{{- end }}

{{/*
Checks one redis block; called with (dict "name" <values path> "values" <the block>).
*/}}
{{- define "sluice.validateRedis" -}}
{{- $type := include "sluice.redisType" .values }}
{{- if not (has $type (list "single" "cluster" "sentinel")) }}
{{- fail (printf "%s.type must be single, cluster or sentinel, not %q" .name (toString .values.type)) }}
{{- end }}
{{- if not .values.url }}
{{- fail (printf "%s.url is empty: host:port (single), node,node,... (cluster) or master,sentinel,... (sentinel)" .name) }}
{{- end }}
{{- if and (eq $type "single") (not (has (lower (toString .values.socketType)) (list "tcp" "unix"))) }}
{{- fail (printf "%s.socketType must be tcp or unix" .name) }}
{{- end }}
{{- if and (eq $type "sentinel") (lt (len (splitList "," (toString .values.url))) 2) }}
{{- fail (printf "%s.url with type sentinel is the master's name, then the sentinels: mymaster,sentinel-0:26379,..." .name) }}
{{- end }}
{{- end }}

{{/*
Whether the pods roll on a change of the chart's ConfigMap: "true" or "". Live reload applies
config changes in place, so only when asked for or when live reload is off.
*/}}
{{- define "sluice.rollOnConfigChange" -}}
{{- if or .Values.rollOnConfigChange (include "sluice.liveReloadOff" .) }}true{{ end }}
{{- end }}

{{/*
Whether settings.configReloadInterval turns live reload off (a zero duration): "true" or "".
*/}}
{{- define "sluice.liveReloadOff" -}}
{{- $interval := trim (toString .Values.settings.configReloadInterval) }}
{{- if regexMatch "^0+(\\.0*)?(ns|us|µs|ms|s|m|h)?$" $interval }}true{{ end }}
{{- end }}
