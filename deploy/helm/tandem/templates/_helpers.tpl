{{- define "tandem.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tandem.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tandem.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tandem.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "tandem.kvstoreAddress" -}}
{{ include "tandem.fullname" . }}-kvstore:{{ .Values.kvstore.port }}
{{- end -}}

{{/*
The KV-store's local socket (kvstore.localSocket): its path, the same on the
node and in every container that mounts the node's directory; the store
advertises it, and a worker on the same node connects to it.
*/}}
{{- define "tandem.kvstoreSocketDir" -}}
{{ trimSuffix "/" .Values.kvstore.localSocket.hostPath }}
{{- end -}}

{{- define "tandem.kvstoreSocket" -}}
{{ include "tandem.kvstoreSocketDir" . }}/{{ include "tandem.fullname" . }}-kvstore.sock
{{- end -}}

{{- define "tandem.kvstoreSocketMount" -}}
{{- if and .Values.kvstore.enabled .Values.kvstore.localSocket.enabled }}
- {name: kvstore-socket, mountPath: {{ include "tandem.kvstoreSocketDir" . }}}
{{- end }}
{{- end -}}

{{- define "tandem.kvstoreSocketVolume" -}}
{{- if and .Values.kvstore.enabled .Values.kvstore.localSocket.enabled }}
- name: kvstore-socket
  hostPath: {path: {{ include "tandem.kvstoreSocketDir" . }}, type: DirectoryOrCreate}
{{- end }}
{{- end -}}

{{- define "tandem.servedModelName" -}}
{{ .Values.model.servedModelName | default (base .Values.model.path) }}
{{- end -}}

{{/*
The pod-level fields every pod of the chart shares. Call with
(dict "root" $ "pod" <replica or kvstore values> "component" <name>).
*/}}
{{- define "tandem.podSpec" -}}
{{- $root := .root -}}
{{- $pod := .pod -}}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.podSecurityContext }}
securityContext: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $pod.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $pod.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with $pod.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $pod.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $pod.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $pod.topologySpreadConstraints }}
{{- $list := list }}
{{- range . }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}
{{- $sel := include "tandem.selector" $root | fromYaml }}
{{- $_ := set $sel "app.kubernetes.io/component" $.component }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" $sel) }}
{{- end }}
{{- $list = append $list $c }}
{{- end }}
topologySpreadConstraints: {{- toYaml $list | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Pod metadata: selector labels, the component, extra labels and annotations. */}}
{{- define "tandem.podMetadata" -}}
labels:
  {{- include "tandem.selector" .root | nindent 2 }}
  app.kubernetes.io/component: {{ .component }}
  {{- with .pod.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .pod.podAnnotations }}
annotations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "tandem.tmpVolume" -}}
{{- $e := dict }}
{{- with .Values.tmpVolume.medium }}{{ $_ := set $e "medium" . }}{{ end }}
{{- with .Values.tmpVolume.sizeLimit }}{{ $_ := set $e "sizeLimit" . }}{{ end }}
- name: tmp
  {{- if $e }}
  emptyDir: {{- toYaml $e | nindent 4 }}
  {{- else }}
  emptyDir: {}
  {{- end }}
{{- end -}}

{{/*
TLS (values tls). The Secret holding a part's certificate; call with
(dict "root" $ "part" "kvstore|scheduler|worker|frontend").
*/}}
{{- define "tandem.tlsSecret" -}}
{{- get .root.Values.tls.secrets .part | default (printf "%s-%s-tls" (include "tandem.fullname" .root) .part) -}}
{{- end -}}

{{/* The --tls-* flags of a container whose certificate is mounted at /etc/tandem/tls. */}}
{{- define "tandem.tlsArgs" -}}
{{- if .Values.tls.enabled }}
- --tls-cert=/etc/tandem/tls/tls.crt
- --tls-key=/etc/tandem/tls/tls.key
- --tls-ca=/etc/tandem/tls/ca.crt
- --tls-reload-interval-s={{ .Values.tls.reloadIntervalSeconds }}
- --tls-trust-domain={{ .Values.tls.trustDomain }}
{{- end }}
{{- end -}}

{{/* A container's mount of its part's certificate; (dict "root" $ "part" ...). */}}
{{- define "tandem.tlsMount" -}}
{{- if .root.Values.tls.enabled }}
- {name: tls-{{ .part }}, mountPath: /etc/tandem/tls, readOnly: true}
{{- end }}
{{- end -}}

{{/* The pod volume of a part's certificate; (dict "root" $ "part" ...). */}}
{{- define "tandem.tlsVolume" -}}
{{- if .root.Values.tls.enabled }}
- name: tls-{{ .part }}
  secret: {secretName: {{ include "tandem.tlsSecret" . }}}
{{- end }}
{{- end -}}

{{/*
A probe's handler on a gRPC health name: the kubelet's gRPC probe, or under
TLS (which that probe cannot speak) `tandem health` in the container, with
the container's own certificate. (dict "root" $ "port" N "service" NAME)
*/}}
{{- define "tandem.healthProbe" -}}
{{- if .root.Values.tls.enabled -}}
exec:
  command: [tandem, health, --server=127.0.0.1:{{ .port }}, --service={{ .service }}, --tls-cert=/etc/tandem/tls/tls.crt, --tls-key=/etc/tandem/tls/tls.key, --tls-ca=/etc/tandem/tls/ca.crt]
timeoutSeconds: 5
{{- else -}}
grpc: {port: {{ .port }}, service: {{ .service }}}
{{- end -}}
{{- end -}}

{{/*
The model volume: model.volume, or the emptyDir model.download fills.
*/}}
{{- define "tandem.modelVolume" -}}
- name: model
  {{- if .Values.model.download.enabled }}
  {{- with .Values.model.download.sizeLimit }}
  emptyDir: {sizeLimit: {{ . }}}
  {{- else }}
  emptyDir: {}
  {{- end }}
  {{- else }}
  {{- toYaml .Values.model.volume | nindent 2 }}
  {{- end }}
{{- end -}}

{{/*
The init container that downloads the model (model.download); call with
(dict "root" $ "tokenizerOnly" bool). Empty when downloads are off.
*/}}
{{- define "tandem.modelDownload" -}}
{{- $d := .root.Values.model.download -}}
{{- if $d.enabled }}
{{- if not $d.repo }}{{ fail "model.download.enabled needs model.download.repo" }}{{ end }}
{{- if not (hasPrefix (printf "%s/" (trimSuffix "/" .root.Values.model.mountPath)) .root.Values.model.path) }}
{{- fail "model.download: model.path must lie under model.mountPath" }}
{{- end }}
- name: download-model
  image: {{ $d.image }}
  imagePullPolicy: IfNotPresent
  command: [sh, -c]
  args:
    - >-
      python -c 'import huggingface_hub' 2>/dev/null ||
      pip install --no-cache-dir --quiet --target /tmp/hf huggingface_hub &&
      PYTHONPATH=/tmp/hf python -c 'import os; from huggingface_hub import snapshot_download;
      a = os.environ["HF_ALLOW_PATTERNS"];
      snapshot_download(repo_id=os.environ["HF_REPO"], revision=os.environ["HF_REVISION"],
      local_dir=os.environ["MODEL_PATH"], allow_patterns=a.split(",") if a else None)'
  env:
    - {name: HF_REPO, value: {{ $d.repo | quote }}}
    - {name: HF_REVISION, value: {{ $d.revision | quote }}}
    - {name: MODEL_PATH, value: {{ .root.Values.model.path | quote }}}
    - {name: HF_ALLOW_PATTERNS, value: {{ ternary "*.json,*.model,*.jinja,*.txt" "" .tokenizerOnly | quote }}}
    - {name: HOME, value: /tmp}
    - {name: HF_HOME, value: /tmp/hf-home}
    {{- if $d.tokenSecret.name }}
    - name: HF_TOKEN
      valueFrom:
        secretKeyRef: {name: {{ $d.tokenSecret.name }}, key: {{ $d.tokenSecret.key }}}
    {{- end }}
  {{- with .root.Values.securityContext }}
  securityContext: {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - {name: tmp, mountPath: /tmp}
    - {name: model, mountPath: {{ .root.Values.model.mountPath }}}
{{- end }}
{{- end -}}
