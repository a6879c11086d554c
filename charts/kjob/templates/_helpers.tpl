{{/*
Labels of every object's metadata: the ones deploy/base gives (app.kubernetes.io/part-of) and
Helm's own. Selectors and pod templates carry only app.kubernetes.io/name and component, as in
deploy/base, so an upgrade never changes an immutable selector.
*/}}
{{- define "kjob.labels" -}}
app.kubernetes.io/part-of: kjob
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* A kjob image: (list . "kjob-queue"). */}}
{{- define "kjob.image" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- printf "%s/%s:%s" $root.Values.image.registry $name ($root.Values.image.tag | default $root.Chart.AppVersion) -}}
{{- end }}

{{/* Redis URL kjob-queue dials: the bundled StatefulSet's Service, or redis.url. */}}
{{- define "kjob.redisUrl" -}}
{{- if .Values.redis.bundled -}}
{{ if .Values.redis.tls.enabled }}rediss{{ else }}redis{{ end }}://kjob-redis.{{ .Release.Namespace }}.svc:6379
{{- else -}}
{{- required "redis.url is required when redis.bundled is false" .Values.redis.url -}}
{{- end -}}
{{- end }}
