{{/* The prefix of every resource name. */}}
{{- define "spindle.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "spindle.labels" -}}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: pass (list $ "controller"). */}}
{{- define "spindle.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ default $.Chart.Name $.Values.nameOverride }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "spindle.image" -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}

{{- define "spindle.driverImage" -}}
{{- printf "%s:%s" .Values.driver.image.repository (default .Chart.AppVersion .Values.driver.image.tag) -}}
{{- end -}}

{{/* The node's CSI socket directory on the host. */}}
{{- define "spindle.nodeSocketDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubeletDir) .Values.driverName -}}
{{- end -}}

{{- define "spindle.registrationDir" -}}
{{- printf "%s/plugins_registry" (trimSuffix "/" .Values.kubeletDir) -}}
{{- end -}}

{{/* true when some loop instance is node-local. */}}
{{- define "spindle.nodeLocal" -}}
{{- range .Values.config.backends -}}
{{- if and (eq .type "loop") .loop -}}{{- if .loop.nodeLocal -}}true{{- end -}}{{- end -}}
{{- end -}}
{{- end -}}

{{/* The env every container gets: the apiserver override. */}}
{{- define "spindle.apiServerEnv" -}}
{{- if .Values.apiServer.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .Values.apiServer.host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .Values.apiServer.port | toString | quote }}
{{- end }}
{{- end -}}

{{/* The host directories of the backends' image pools, mounted at the same
path: one "name=path" per line. The controller mounts every pool (loop,
iSCSI); a node plugin only the loop pools, whose image files it binds to
loop devices. An iSCSI node reaches its volumes through the target's portal
and needs no share of the pool (docs/backends.md). Called with
(dict "Values" .Values "node" true|false), as are the two below. */}}
{{- define "spindle.poolDirs" -}}
{{- $seen := dict -}}
{{- range .Values.config.backends -}}
{{- $dir := "" -}}
{{- if and (eq .type "loop") .loop -}}{{- $dir = .loop.poolDir -}}{{- end -}}
{{- if and (eq .type "iscsi") .iscsi (not $.node) -}}{{- $dir = .iscsi.poolDir -}}{{- end -}}
{{- /* No right trim: each entry starts a line of its own. */ -}}
{{- if and $dir (not (hasKey $seen $dir)) }}
pool-{{ len $seen }}={{ $dir }}
{{- $_ := set $seen $dir true }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* volumeMounts of the pool directories (a shared filesystem must be
mounted there before the pods start: no propagation, so that a host whose
mounts are private can run them). */}}
{{- define "spindle.poolMounts" -}}
{{- range (include "spindle.poolDirs" . | trim | splitList "\n") }}
{{- if . }}
{{- $kv := splitn "=" 2 . }}
- name: {{ $kv._0 }}
  mountPath: {{ $kv._1 }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "spindle.poolVolumes" -}}
{{- range (include "spindle.poolDirs" . | trim | splitList "\n") }}
{{- if . }}
{{- $kv := splitn "=" 2 . }}
- name: {{ $kv._0 }}
  hostPath:
    path: {{ $kv._1 }}
    type: DirectoryOrCreate
{{- end }}
{{- end }}
{{- end -}}

{{/* Arguments the driver gets in every mode. */}}
{{- define "spindle.driverArgs" -}}
- --endpoint=unix:///csi/csi.sock
- --driver-name={{ .Values.driverName }}
- --config=/etc/spindle/config.yaml
{{- if .Values.kms }}
- --kms-config=/etc/spindle/kms.json
{{- end }}
- --log-level={{ .Values.driver.logLevel }}
- --log-format={{ .Values.driver.logFormat }}
{{- end -}}

{{/* A sidecar's common arguments; pass (list $ "provisioner"). */}}
{{- define "spindle.sidecarArgs" -}}
{{- $ := index . 0 -}}
- --csi-address=/csi/csi.sock
- --leader-election
- --leader-election-namespace=$(NAMESPACE)
- --timeout={{ $.Values.controller.timeout }}
- --kube-api-qps={{ $.Values.controller.kubeAPIQPS }}
- --kube-api-burst={{ $.Values.controller.kubeAPIBurst }}
{{- end -}}

{{/* The Secrets a controller sidecar reads for the driver, from the
csi.storage.k8s.io/<prefix>-secret-name parameters of the StorageClasses
(and VolumeSnapshotClasses): pass (list $ "provisioner"). A JSON list of
names; "*" when a name is a template (${pvc.name} ...), which no
resourceNames rule can name. */}}
{{- define "spindle.secretNames" -}}
{{- $ := index . 0 -}}
{{- $sidecar := index . 1 -}}
{{- $prefixes := dict "provisioner" (list "provisioner") "attacher" (list "controller-publish") "resizer" (list "controller-expand") "snapshotter" (list "snapshotter" "snapshotter-list") -}}
{{- $names := list -}}
{{- $classes := concat $.Values.storageClasses $.Values.volumeSnapshotClasses -}}
{{- range $classes -}}
{{- $params := default dict .parameters -}}
{{- range (get $prefixes $sidecar) -}}
{{- $n := get $params (printf "csi.storage.k8s.io/%s-secret-name" .) -}}
{{- if $n -}}
{{- if contains "$" (toString $n) -}}{{- $names = append $names "*" -}}{{- else -}}{{- $names = append $names (toString $n) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $names | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/* A "get secrets" rule for a sidecar that reads Secrets: pass (list $ "provisioner"). */}}
{{- define "spindle.secretsRule" -}}
{{- $names := include "spindle.secretNames" . | fromJsonArray -}}
{{- if $names }}
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: ["get"]
    {{- if not (has "*" $names) }}
    resourceNames: {{ toJson $names }}
    {{- end }}
{{- end }}
{{- end -}}
