{{/* Names and labels. */}}
{{- define "kafka-admission-proxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kafka-admission-proxy.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "kafka-admission-proxy.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "kafka-admission-proxy.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "kafka-admission-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kafka-admission-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kafka-admission-proxy.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "kafka-admission-proxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "kafka-admission-proxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kafka-admission-proxy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kafka-admission-proxy.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The proxy's config file: values.config with mode set from the chart's mode and workers
from the CPU limit unless config.workers is given; strings may be templates. */}}
{{- define "kafka-admission-proxy.configFile" -}}
{{- $mode := ternary "sidecar" "cluster" (eq .Values.mode "sidecar") }}
{{- $workers := include "kafka-admission-proxy.workers" . }}
{{- $workers = ternary $workers (atoi $workers) (eq $workers "auto") }}
{{- tpl (toYaml (merge (dict "mode" $mode) (deepCopy .Values.config) (dict "workers" $workers))) . }}
{{- end }}

{{/*
config.workers as the proxy will run it: config.workers when set (a number or auto), else
the container's CPU limit, resources.limits.cpu, rounded up ("1500m" and 1.5 are 2 workers:
a worker is one process on one core), at least 1; 1 with no CPU limit.
*/}}
{{- define "kafka-admission-proxy.workers" -}}
{{- $set := (.Values.config | default dict).workers }}
{{- $cpu := toString ((.Values.resources | default dict).limits | default dict).cpu }}
{{- if $set }}{{ $set }}
{{- else if or (eq $cpu "") (eq $cpu "<nil>") }}1
{{- else if hasSuffix "m" $cpu }}{{ max 1 (div (add (atoi (trimSuffix "m" $cpu)) 999) 1000) }}
{{- else }}{{ max 1 (int (ceil (float64 $cpu))) }}
{{- end }}
{{- end }}

{{- define "kafka-admission-proxy.port" -}}
{{- regexFind "[0-9]+$" . }}
{{- end }}

{{/*
Container ports: every listener's bootstrap port, in standalone mode the port of
each broker in brokerNodeIds (node_port_base + id), and the admin port.
Returns a YAML list of {name, containerPort}.
*/}}
{{- define "kafka-admission-proxy.ports" -}}
{{- range $index, $listener := .Values.config.listeners }}
- name: {{ printf "kafka-%d" $index }}
  containerPort: {{ include "kafka-admission-proxy.port" $listener.bind }}
{{- if eq $.Values.mode "standalone" }}
{{- range $id := $.Values.brokerNodeIds }}
- name: {{ printf "l%d-b%d" $index (int $id) }}
  containerPort: {{ add (default 29100 $listener.node_port_base) $id }}
{{- end }}
{{- end }}
{{- end }}
- name: admin
  containerPort: {{ include "kafka-admission-proxy.port" (default "127.0.0.1:9464" (.Values.config.admin | default dict).bind) }}
{{- end }}

{{- define "kafka-admission-proxy.configDir" -}}/etc/kafka-admission-proxy{{- end }}
{{- define "kafka-admission-proxy.metricsDir" -}}/run/kafka-admission-proxy/metrics{{- end }}

{{/*
The proxy container. Used as is by the standalone Deployment and, in a broker's pod
template, as the sidecar: {{ include "kafka-admission-proxy.container" . }} under
`containers:` (with this chart's root context), or under `initContainers:` with nativeSidecar.
*/}}
{{- define "kafka-admission-proxy.container" -}}
- name: kafka-admission-proxy
  {{- if and (eq .Values.mode "sidecar") .Values.nativeSidecar }}
  # A native sidecar (Kubernetes 1.29+): an init container that keeps running.
  restartPolicy: Always
  {{- end }}
  image: {{ include "kafka-admission-proxy.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["kafka-admission-proxy"]
  args:
    - run
    - --config
    - {{ include "kafka-admission-proxy.configDir" . }}/config.yaml
    - --drain-timeout
    - {{ .Values.drainTimeoutSeconds | quote }}
    - --log-format
    - {{ .Values.logFormat }}
    - --log-level
    - {{ .Values.logLevel }}
  env:
    {{- include "kafka-admission-proxy.env" . | nindent 4 }}
  ports:
    {{- range (include "kafka-admission-proxy.ports" . | fromYamlArray) }}
    - name: {{ .name }}
      containerPort: {{ .containerPort }}
      protocol: TCP
    {{- end }}
  {{- /* Liveness and readiness wait for the first /healthz answer: a slow start is not restarted in a loop. */}}
  startupProbe:
    httpGet:
      path: /healthz
      port: admin
    {{- toYaml .Values.startupProbe | nindent 4 }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: admin
    {{- toYaml .Values.livenessProbe | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: admin
    {{- toYaml .Values.readinessProbe | nindent 4 }}
  lifecycle:
    preStop:
      exec:
        command: ["sleep", {{ .Values.preStopSleepSeconds | quote }}]
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: kafka-admission-proxy-config
      mountPath: {{ include "kafka-admission-proxy.configDir" . }}
      readOnly: true
    {{- range .Values.tlsSecrets }}
    - name: {{ printf "kafka-admission-proxy-tls-%s" .name }}
      mountPath: {{ printf "/etc/kafka-admission-proxy-tls/%s" .name }}
      readOnly: true
    {{- end }}
    {{- if .Values.auditVolume.enabled }}
    - name: kafka-admission-proxy-audit
      mountPath: /var/log/kafka-admission-proxy
    {{- end }}
    {{- if ne (include "kafka-admission-proxy.workers" .) "1" }}
    - name: kafka-admission-proxy-metrics
      mountPath: {{ include "kafka-admission-proxy.metricsDir" . }}
    {{- end }}
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/*
The proxy container's environment (both modes): POD_NAME from the downward API, always, for
per-pod values in the config ("/certs/${POD_NAME}.crt", expanded by the proxy at load);
secretEnv as secretKeyRefs (e.g. the password key_password_env names); then extraEnv.
Rendering fails when the config names a variable (key_password_env, or a ${NAME} reference)
that none of these sets: the proxy would refuse that config at start.
*/}}
{{- define "kafka-admission-proxy.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- if ne (include "kafka-admission-proxy.workers" .) "1" }}
# The workers' metric files (prometheus-client's multiprocess mode), on a memory volume: the root fs is read-only.
- name: PROMETHEUS_MULTIPROC_DIR
  value: {{ include "kafka-admission-proxy.metricsDir" . }}
{{- end }}
{{- range .Values.secretEnv }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .key }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- $set := list "POD_NAME" }}
{{- range (concat .Values.secretEnv .Values.extraEnv) }}{{ $set = append $set .name }}{{ end }}
{{- $config := include "kafka-admission-proxy.configFile" . | fromYaml }}
{{- $named := list }}
{{- range $i, $listener := $config.listeners }}
{{- with (($listener.tls | default dict).key_password_env) }}{{ $named = append $named (list (printf "config.listeners[%d].tls.key_password_env" $i) .) }}{{ end }}
{{- end }}
{{- with ((($config.upstream | default dict).tls | default dict).key_password_env) }}{{ $named = append $named (list "config.upstream.tls.key_password_env" .) }}{{ end }}
{{- range (regexFindAll "(^|[^$])[$][{][A-Za-z_][A-Za-z0-9_]*[}]" (include "kafka-admission-proxy.configFile" .) -1) }}
{{- $named = append $named (list "config, a ${NAME} reference" (regexFind "[A-Za-z_][A-Za-z0-9_]*[}]$" . | trimSuffix "}")) }}
{{- end }}
{{- range $named }}
{{- if not (has (index . 1) $set) }}
{{- fail (printf "%s: environment variable %s is not set in the proxy container; add it to secretEnv or extraEnv" (index . 0) (index . 1)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The proxy's volumes, for the pod's `volumes:` (standalone Deployment or a broker pod). */}}
{{- define "kafka-admission-proxy.volumes" -}}
- name: kafka-admission-proxy-config
  configMap:
    name: {{ include "kafka-admission-proxy.fullname" . }}
{{- range .Values.tlsSecrets }}
- name: {{ printf "kafka-admission-proxy-tls-%s" .name }}
  secret:
    secretName: {{ .secretName }}
    defaultMode: 0440
    {{- /* Kubernetes' default, written out: podman 4.3's kube play dereferences it unchecked. */}}
    optional: false
{{- end }}
{{- if .Values.auditVolume.enabled }}
- name: kafka-admission-proxy-audit
  emptyDir:
    sizeLimit: {{ .Values.auditVolume.sizeLimit }}
{{- end }}
{{- if ne (include "kafka-admission-proxy.workers" .) "1" }}
{{- /* A few sparse files per process, pages touched only for the series written. */}}
- name: kafka-admission-proxy-metrics
  emptyDir:
    medium: Memory
    sizeLimit: 64Mi
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Pod annotations: configReload=checksum rolls the pods when the config changes. */}}
{{- define "kafka-admission-proxy.podAnnotations" -}}
{{- if eq .Values.configReload "checksum" }}
checksum/kafka-admission-proxy-config: {{ include "kafka-admission-proxy.configFile" . | sha256sum }}
{{- end }}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
preStop sleep + drain + margin: the kubelet's SIGKILL never cuts the drain short.
sidecar mode adds the broker's controlled shutdown before them (values.yaml: brokerShutdownSeconds).
*/}}
{{- define "kafka-admission-proxy.terminationGracePeriodSeconds" -}}
{{- $broker := ternary .Values.brokerShutdownSeconds 0 (eq .Values.mode "sidecar") }}
{{- add $broker .Values.preStopSleepSeconds .Values.drainTimeoutSeconds .Values.terminationMarginSeconds }}
{{- end }}

{{/* The scrape job the alert rules select `up` and process_* by (deploy/prometheus). */}}
{{- define "kafka-admission-proxy.scrapeJob" -}}
relabelings:
  - action: replace
    targetLabel: job
    replacement: kafka-admission-proxy
{{- end }}

{{/* A monitor needs the admin endpoint on the pod's address: fail on a loopback admin.bind. */}}
{{- define "kafka-admission-proxy.adminScrapable" -}}
{{- $root := index . 0 }}
{{- $bind := default "127.0.0.1:9464" ($root.Values.config.admin | default dict).bind }}
{{- if regexMatch "^(127\\.|localhost:|\\[::1\\]:)" $bind }}
{{- fail (printf "%s: config.admin.bind is %s, which Prometheus cannot reach from outside the pod; bind 0.0.0.0:<port>" (index . 1) $bind) }}
{{- end }}
{{- end }}

{{/* A pod's labels: the chart's standard labels (selector labels among them, which podLabels cannot override), then podLabels. */}}
{{- define "kafka-admission-proxy.podLabels" -}}
{{- toYaml (merge (include "kafka-admission-proxy.labels" . | fromYaml) (deepCopy .Values.podLabels)) }}
{{- end }}
