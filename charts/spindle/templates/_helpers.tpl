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

{{/* nodeStateDir, without a trailing slash. */}}
{{- define "spindle.stateDir" -}}{{ trimSuffix "/" .Values.nodeStateDir }}{{- end -}}

{{- define "spindle.attachDaemonSocket" -}}
{{- printf "%s/attachd/attachd.sock" (include "spindle.stateDir" .) -}}
{{- end -}}

{{/* true when the node plugin has mounted path itself (node.extraVolumeMounts):
the chart then leaves that mount to it. Pass (list $ "/etc/iscsi"). */}}
{{- define "spindle.userMounts" -}}
{{- $ := index . 0 -}}
{{- $path := index . 1 -}}
{{- range $.Values.node.extraVolumeMounts -}}
{{- if eq (trimSuffix "/" .mountPath) $path -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* The host directories the node plugin and the attach daemon both mount
at the same path, with Bidirectional propagation (the mounts the daemons
make, FUSE exports and rbd-fuse mounts, must reach the host and from it
the other pod, and outlive either): the state directory, and any rbd
fuseDir or iSCSI stateDir of the config outside it. One "name=path" per
line. */}}
{{- define "spindle.sharedDirs" -}}
{{- $state := include "spindle.stateDir" . -}}
{{- $seen := dict $state true -}}
host-state={{ $state }}
{{- range .Values.config.backends -}}
{{- $dir := "" -}}
{{- /* The driver's defaults: DefaultFuseDir, iscsi.DefaultStateDir. */ -}}
{{- if and (eq .type "rbd") .rbd -}}{{- if eq (default "" .rbd.mounter) "rbd-fuse" -}}{{- $dir = default "/run/spindle/rbd-fuse" .rbd.fuseDir -}}{{- end -}}{{- end -}}
{{- if and (eq .type "iscsi") .iscsi -}}{{- $dir = default "/run/spindle/iscsi" .iscsi.stateDir -}}{{- end -}}
{{- $dir = trimSuffix "/" $dir -}}
{{- if and $dir (not (hasKey $seen $dir)) (not (hasPrefix (printf "%s/" $state) $dir)) }}
host-state-{{ len $seen }}={{ $dir }}
{{- $_ := set $seen $dir true }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* true when some iSCSI instance logs in with the kernel's initiator
(attachMode kernel, the default). */}}
{{- define "spindle.kernelISCSI" -}}
{{- range .Values.config.backends -}}
{{- if and (eq .type "iscsi") .iscsi -}}{{- if ne (default "kernel" .iscsi.attachMode) "userspace" -}}true{{- end -}}{{- end -}}
{{- end -}}
{{- end -}}

{{/* What the kernel attach paths need from the host, as "name=hostPath=mountPath=readOnly"
lines: the host's modules (modprobe of rbd, nbd, iscsi_tcp), and for the
kernel iSCSI initiator iscsiadm's node database (/etc/iscsi, whose
initiatorname.iscsi iscsid also reads) and its lock directory. A path the
values mount themselves (node.extraVolumeMounts) is left to them. */}}
{{- define "spindle.hostDirs" -}}
{{- $dirs := list (list "host-lib-modules" "/lib/modules" "true") -}}
{{- if include "spindle.kernelISCSI" . -}}
{{- $dirs = append $dirs (list "host-etc-iscsi" "/etc/iscsi" "false") -}}
{{- $dirs = append $dirs (list "host-iscsi-lock" "/run/lock/iscsi" "false") -}}
{{- end -}}
{{- range $dirs }}
{{- if not (include "spindle.userMounts" (list $ (index . 1))) }}
{{ index . 0 }}={{ index . 1 }}={{ index . 2 }}
{{- end }}
{{- end }}
{{- end -}}

{{/* volumeMounts of the shared and host directories, for the node plugin
and the attach daemon. */}}
{{- define "spindle.hostMounts" -}}
{{- range (include "spindle.sharedDirs" . | trim | splitList "\n") }}
{{- if . }}
{{- $kv := splitn "=" 2 . }}
- name: {{ $kv._0 }}
  mountPath: {{ $kv._1 }}
  mountPropagation: Bidirectional
{{- end }}
{{- end }}
{{- range (include "spindle.hostDirs" . | trim | splitList "\n") }}
{{- if . }}
{{- $f := splitList "=" . }}
- name: {{ index $f 0 }}
  mountPath: {{ index $f 1 }}
  {{- if eq (index $f 2) "true" }}
  readOnly: true
  {{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "spindle.hostVolumes" -}}
{{- range (include "spindle.sharedDirs" . | trim | splitList "\n") }}
{{- if . }}
{{- $kv := splitn "=" 2 . }}
- name: {{ $kv._0 }}
  hostPath:
    path: {{ $kv._1 }}
    type: DirectoryOrCreate
{{- end }}
{{- end }}
{{- range (include "spindle.hostDirs" . | trim | splitList "\n") }}
{{- if . }}
{{- $f := splitList "=" . }}
- name: {{ index $f 0 }}
  hostPath:
    path: {{ index $f 1 }}
    type: DirectoryOrCreate
{{- end }}
{{- end }}
{{- end -}}

{{- define "spindle.attachDaemonImage" -}}
{{- $i := .Values.attachDaemon.image -}}
{{- printf "%s:%s" (default .Values.driver.image.repository $i.repository) (default (default .Chart.AppVersion .Values.driver.image.tag) $i.tag) -}}
{{- end -}}
