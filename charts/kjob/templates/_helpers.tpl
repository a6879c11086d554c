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

{{/* A kjob image: (list . "kjob-queue"), with "@<digest>" when image.digests names one. */}}
{{- define "kjob.image" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- $ref := printf "%s/%s:%s" $root.Values.image.registry $name ($root.Values.image.tag | default $root.Chart.AppVersion) -}}
{{- $digest := index ($root.Values.image.digests | default dict) $name | default "" -}}
{{- if $digest -}}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" $digest) -}}
{{- fail (printf "image.digests.%s must be sha256:<64 hex digits>, not %q" $name $digest) -}}
{{- end -}}
{{- $ref = printf "%s@%s" $ref $digest -}}
{{- end -}}
{{- $ref -}}
{{- end }}

{{/* Redis URL kjob-queue dials: the bundled StatefulSet's Service, or redis.url. */}}
{{- define "kjob.redisUrl" -}}
{{- if .Values.redis.bundled -}}
{{ if .Values.redis.tls.enabled }}rediss{{ else }}redis{{ end }}://kjob-redis.{{ .Release.Namespace }}.svc:6379
{{- else -}}
{{- required "redis.url is required when redis.bundled is false" .Values.redis.url -}}
{{- end -}}
{{- end }}
