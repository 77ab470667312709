//go:build root

package chart

import (
	"maps"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"

	// The backends register their config decoders, which config.LoadFile needs.
	_ "github.com/spindle-csi/spindle/internal/backend/all"
	"github.com/spindle-csi/spindle/internal/config"
	"github.com/spindle-csi/spindle/internal/kms"
)

// want is what a rendering must show, from its values.
type want struct {
	kubeletDir   string
	pullPolicy   corev1.PullPolicy
	apiServer    string // "host:port", or empty
	registration string // "registrar" or "driver"
	nodeMode     string
	hostNetwork  bool // the node pods'
	ctrlHostNet  bool // the controller pods'
	liveness     bool
	snapshotCtl  bool
	groupSnaps   bool // volumeGroupSnapshots: the sidecars' feature gate
	nodeLocal    bool
	capacity     bool
	poolDirs     []string
	// iscsiPools are iSCSI pools: the controller's, never a node plugin's.
	iscsiPools []string
	// attachDaemon: the attach daemon DaemonSet is rendered and the node
	// plugin starts its volumes' daemons there.
	attachDaemon bool
	// stateDir is nodeStateDir; sharedDirs the host directories both the
	// node plugin and the attach daemon mount (Bidirectional).
	stateDir   string
	sharedDirs []string
	// kernelISCSI: the node pods get the host's /etc/iscsi and /run/lock/iscsi.
	kernelISCSI bool
	// secretNames are the Secrets the controller may read (resourceNames).
	secretNames []string
	// kmsIDs are the encryptionKMSIDs the driver has (kms.json, with the
	// built-in "secrets"); nil: no --kms-config.
	kmsIDs []string
}

var defaults = want{
	kubeletDir: "/var/lib/kubelet", pullPolicy: corev1.PullIfNotPresent, registration: "registrar", nodeMode: "node",
	liveness: true, poolDirs: []string{"/var/lib/spindle/pools/default"}, hostNetwork: true,
	attachDaemon: true, stateDir: "/run/spindle", sharedDirs: []string{"/run/spindle"},
}

// renderings are the default values, every example and a few variants.
func renderings() []struct {
	name  string
	files []string
	sets  []string
	want  want
} {
	ex := func(n string) []string { return []string{filepath.Join(chartDir, "examples", n)} }
	with := func(f func(*want)) want { w := defaults; f(&w); return w }
	return []struct {
		name  string
		files []string
		sets  []string
		want  want
	}{
		{name: "defaults", want: defaults},
		{name: "local-cluster", files: ex("local-cluster.yaml"), want: with(func(w *want) {
			w.kubeletDir, w.pullPolicy, w.apiServer = "/var/tmp/spindle-local-cluster/kubelet", corev1.PullNever, "127.0.0.1:6443"
			w.registration, w.nodeMode, w.hostNetwork, w.ctrlHostNet, w.liveness, w.snapshotCtl = "driver", "node", true, true, false, true
			w.poolDirs = []string{"/var/tmp/spindle-local-cluster/pool"}
			w.groupSnaps = true
			w.stateDir, w.sharedDirs = "/var/tmp/spindle-local-cluster/node-state", []string{"/var/tmp/spindle-local-cluster/node-state"}
		})},
		{name: "node-local", files: ex("node-local.yaml"), want: with(func(w *want) {
			w.nodeLocal, w.capacity, w.poolDirs = true, true, []string{"/var/lib/spindle/pools/local"}
		})},
		{name: "rbd", files: ex("rbd.yaml"), want: with(func(w *want) {
			w.poolDirs, w.secretNames = nil, []string{"spindle-ceph-a"}
		})},
		{name: "rook", files: ex("rook.yaml"), want: with(func(w *want) { w.poolDirs = nil })},
		{name: "iscsi", files: ex("iscsi.yaml"), want: with(func(w *want) {
			w.poolDirs, w.secretNames, w.kernelISCSI = nil, []string{"spindle-iscsi-chap"}, true
			w.iscsiPools = []string{"/var/lib/spindle/iscsi/tgt-a"}
		})},
		// Every pool its own volume: they were once rendered as one
		// hostPath naming all of them.
		{name: "several pools", files: []string{filepath.Join("testdata", "pools.yaml")}, want: with(func(w *want) {
			w.poolDirs = []string{"/var/lib/spindle/pools/default", "/var/lib/spindle/pools/fast"}
			w.iscsiPools = []string{"/var/lib/spindle/iscsi/tgt-a"}
		})},
		{name: "no attach daemon, pod network", sets: []string{"attachDaemon.enabled=false", "node.hostNetwork=false"}, want: with(func(w *want) {
			w.attachDaemon, w.hostNetwork = false, false
		})},
		{name: "rbd-fuse and iSCSI userspace outside the state directory", files: []string{filepath.Join("testdata", "userspace-dirs.yaml")}, want: with(func(w *want) {
			// The iSCSI instance keeps its state at the driver's default,
			// below /run/spindle; rbd-fuse's directory is elsewhere. Its
			// pool is the controller's only.
			w.poolDirs, w.iscsiPools = nil, []string{"/var/lib/spindle/iscsi"}
			w.sharedDirs = []string{"/run/spindle", "/var/lib/spindle/fuse"}
		})},
		{name: "custom kubelet dir, driver registration, no probes", sets: []string{
			"kubeletDir=/data/kubelet/", "node.registration=driver", "sidecars.livenessProbe.enabled=false",
			"apiServer.host=10.1.2.3", "apiServer.port=8443", "imagePullPolicy=Always",
		}, want: with(func(w *want) {
			w.kubeletDir, w.registration, w.liveness, w.apiServer, w.pullPolicy = "/data/kubelet", "driver", false, "10.1.2.3:8443", corev1.PullAlways
		})},
		{name: "a Vault KMS", sets: []string{
			"kms.vault-a.encryptionKMSType=vaulttransit", "kms.vault-a.vaultAddress=https://vault.example:8200",
			"kms.vault-a.vaultTokenFile=/etc/spindle-vault/token",
		}, want: with(func(w *want) { w.kmsIDs = []string{"secrets", "vault-a"} })},
	}
}

func TestHelmLint(t *testing.T) {
	helm(t)
	cases := [][]string{nil}
	for _, f := range exampleFiles(t) {
		cases = append(cases, []string{f})
	}
	for _, files := range cases {
		name := "defaults"
		if files != nil {
			name = filepath.Base(files[0])
		}
		t.Run(name, func(t *testing.T) {
			args := []string{"lint", "--strict", chartDir, "--kube-version", kubeVersion}
			for _, f := range files {
				args = append(args, "-f", f)
			}
			if out, err := runHelm(t, args...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}

// Every example file has a case in renderings, so none goes unchecked.
func TestEveryExampleIsChecked(t *testing.T) {
	checked := map[string]bool{}
	for _, c := range renderings() {
		for _, f := range c.files {
			checked[filepath.Base(f)] = true
		}
	}
	for _, f := range exampleFiles(t) {
		if !checked[filepath.Base(f)] {
			t.Errorf("example %s has no case in renderings()", f)
		}
	}
}

func TestTemplate(t *testing.T) {
	helm(t)
	for _, c := range renderings() {
		t.Run(c.name, func(t *testing.T) {
			r := mustTemplate(t, c.files, c.sets...)
			decodeAll(t, r)
			checkCSIDriver(t, r, c.want)
			checkServiceAccounts(t, r, c.want)
			checkNode(t, r, c.want)
			checkAttachDaemon(t, r, c.want)
			checkController(t, r, c.want)
			checkRBAC(t, r, c.want)
			checkConfig(t, r, c.want)
			checkClasses(t, r)
			checkEveryContainer(t, r, c.want)
			checkMetrics(t, r)
		})
	}
}

func checkCSIDriver(t *testing.T, r *rendering, w want) {
	d := one[storagev1.CSIDriver](t, r, "CSIDriver", "spindle.csi.dev")
	s := d.Spec
	if s.AttachRequired == nil || !*s.AttachRequired || s.PodInfoOnMount == nil || !*s.PodInfoOnMount {
		t.Errorf("CSIDriver attachRequired %v podInfoOnMount %v, want both true", s.AttachRequired, s.PodInfoOnMount)
	}
	if s.FSGroupPolicy == nil || *s.FSGroupPolicy != storagev1.FileFSGroupPolicy {
		t.Errorf("CSIDriver fsGroupPolicy %v, want File", s.FSGroupPolicy)
	}
	if s.StorageCapacity == nil || *s.StorageCapacity != w.capacity {
		t.Errorf("CSIDriver storageCapacity %v, want %v", s.StorageCapacity, w.capacity)
	}
	if !slices.Equal(s.VolumeLifecycleModes, []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}) {
		t.Errorf("CSIDriver volumeLifecycleModes %v, want [Persistent]", s.VolumeLifecycleModes)
	}
}

// One ServiceAccount per component, each workload on its own.
func checkServiceAccounts(t *testing.T, r *rendering, w want) {
	sas := all[corev1.ServiceAccount](t, r, "ServiceAccount")
	var names []string
	for _, sa := range sas {
		names = append(names, sa.Name)
	}
	wantSAs := []string{"spindle-controller", "spindle-node"}
	if w.snapshotCtl {
		wantSAs = append(wantSAs, "spindle-snapshot-controller")
	}
	slices.Sort(names)
	if !slices.Equal(names, wantSAs) {
		t.Errorf("ServiceAccounts %v, want %v", names, wantSAs)
	}
	if got := one[appsv1.Deployment](t, r, "Deployment", "spindle-controller").Spec.Template.Spec.ServiceAccountName; got != "spindle-controller" {
		t.Errorf("controller runs as %q", got)
	}
	node := one[appsv1.DaemonSet](t, r, "DaemonSet", "spindle-node").Spec.Template.Spec
	if node.ServiceAccountName != "spindle-node" || node.AutomountServiceAccountToken == nil || *node.AutomountServiceAccountToken {
		t.Errorf("node runs as %q with automount %v, want spindle-node without a token", node.ServiceAccountName, node.AutomountServiceAccountToken)
	}
	if w.snapshotCtl {
		if got := one[appsv1.Deployment](t, r, "Deployment", "spindle-snapshot-controller").Spec.Template.Spec.ServiceAccountName; got != "spindle-snapshot-controller" {
			t.Errorf("snapshot-controller runs as %q", got)
		}
	} else if r.has("Deployment", "spindle-snapshot-controller") {
		t.Error("snapshot-controller rendered although disabled")
	}
}

func container(t *testing.T, spec corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

func containerNames(spec corev1.PodSpec) []string {
	var n []string
	for _, c := range spec.Containers {
		n = append(n, c.Name)
	}
	return n
}

// flag returns the value of --name=value in args, and whether it is there.
func flag(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name {
			return "", true
		}
	}
	return "", false
}

// hostPathOf resolves a path inside container c to the host path it is on,
// through c's hostPath mounts (the longest mount path wins).
func hostPathOf(spec corev1.PodSpec, c *corev1.Container, p string) (string, bool) {
	best := ""
	var host string
	for _, m := range c.VolumeMounts {
		mp := path.Clean(m.MountPath)
		if p != mp && !strings.HasPrefix(p, mp+"/") || len(mp) <= len(best) {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.HostPath != nil {
				best, host = mp, path.Join(v.HostPath.Path, strings.TrimPrefix(p, mp))
			}
		}
	}
	return host, best != ""
}

func mount(c *corev1.Container, name string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].Name == name {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

func checkNode(t *testing.T, r *rendering, w want) {
	ds := one[appsv1.DaemonSet](t, r, "DaemonSet", "spindle-node")
	spec := ds.Spec.Template.Spec
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("node priorityClassName %q", spec.PriorityClassName)
	}
	if spec.HostNetwork != w.hostNetwork {
		t.Errorf("node hostNetwork %v, want %v", spec.HostNetwork, w.hostNetwork)
	}
	if spec.HostNetwork && spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("node dnsPolicy %q with hostNetwork", spec.DNSPolicy)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool { return tl.Operator == corev1.TolerationOpExists && tl.Key == "" }) {
		t.Errorf("node tolerations %v do not tolerate every taint", spec.Tolerations)
	}
	d := container(t, spec, "spindle")
	if d == nil {
		t.Fatalf("node pod has no spindle container: %v", containerNames(spec))
	}
	if d.SecurityContext == nil || d.SecurityContext.Privileged == nil || !*d.SecurityContext.Privileged {
		t.Error("node driver container is not privileged")
	}
	if mode, _ := flag(d.Args, "mode"); mode != w.nodeMode {
		t.Errorf("node --mode=%q, want %q", mode, w.nodeMode)
	}
	if id, _ := flag(d.Args, "node-id"); id != "$(NODE_NAME)" || !slices.ContainsFunc(d.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) {
		t.Errorf("node --node-id=%q is not the node's name from the downward API", id)
	}

	// kubelet's directory: same path inside, Bidirectional, from the host.
	km := mount(d, "kubelet-dir")
	if km == nil || km.MountPath != w.kubeletDir || km.MountPropagation == nil || *km.MountPropagation != corev1.MountPropagationBidirectional {
		t.Errorf("kubelet dir mount %+v, want %s with Bidirectional propagation", km, w.kubeletDir)
	} else if host, _ := hostPathOf(spec, d, w.kubeletDir); host != w.kubeletDir {
		t.Errorf("kubelet dir %s comes from host path %q", w.kubeletDir, host)
	}
	for _, p := range []string{"/dev", "/sys"} {
		if host, ok := hostPathOf(spec, d, p); !ok || host != p {
			t.Errorf("node driver's %s is %q on the host, want the host's %s", p, host, p)
		}
	}
	for _, p := range w.poolDirs {
		if host, ok := hostPathOf(spec, d, p); !ok || host != p {
			t.Errorf("loop pool %s is not mounted from the host in the node pod (%q)", p, host)
		}
	}
	// An iSCSI node reaches its volumes through the target's portal.
	for _, p := range w.iscsiPools {
		if host, ok := hostPathOf(spec, d, p); ok {
			t.Errorf("iSCSI pool %s is mounted in the node pod (from the host's %q); a node plugin needs no share of it", p, host)
		}
	}

	// Sockets: the driver listens where kubelet is told to find it.
	sockDir := path.Join(w.kubeletDir, "plugins", "spindle.csi.dev")
	kubeletSocket := path.Join(sockDir, "csi.sock")
	endpoint, _ := flag(d.Args, "endpoint")
	sock, err := config.SocketPath(endpoint)
	if err != nil {
		t.Fatalf("node --endpoint: %v", err)
	}
	if host, _ := hostPathOf(spec, d, sock); host != kubeletSocket {
		t.Errorf("node driver listens on %s, which is %q on the host, want %s", sock, host, kubeletSocket)
	}
	// The node finds its stage records under kubelet's directory, where
	// kubelet writes them: the path inside the pod must be kubelet's own.
	if dir, _ := flag(d.Args, "kubelet-dir"); dir == "" {
		t.Error("node driver has no --kubelet-dir")
	} else if host, _ := hostPathOf(spec, d, dir); host != w.kubeletDir {
		t.Errorf("node driver --kubelet-dir=%q is %q on the host, want %s", dir, host, w.kubeletDir)
	}
	if addr, ok := flag(d.Args, "metrics-address"); !ok || !strings.HasSuffix(addr, ":9838") {
		t.Errorf("node driver --metrics-address=%q, want the node port 9838 kubectl-spindle looks for", addr)
	}
	if !spec.HostPID {
		t.Error("node pods without hostPID: the plugin finds the processes serving its volumes in /proc")
	}
	// The kernel attach paths: modprobe from the host's modules; iscsiadm
	// with the host's node database and its lock directory.
	hostDirs := []string{"/lib/modules"}
	if w.kernelISCSI {
		hostDirs = append(hostDirs, "/etc/iscsi", "/run/lock/iscsi")
	}
	for _, p := range hostDirs {
		if host, ok := hostPathOf(spec, d, p); !ok || host != p {
			t.Errorf("node driver's %s is %q on the host, want the host's %s", p, host, p)
		}
	}
	if !w.kernelISCSI {
		if _, ok := hostPathOf(spec, d, "/etc/iscsi"); ok {
			t.Error("the node pods mount /etc/iscsi, but no iSCSI instance logs in with the kernel")
		}
	}
	checkSharedDirs(t, spec, d, w, "node")
	socket, ok := flag(d.Args, "attach-daemon-socket")
	if ok != w.attachDaemon {
		t.Errorf("node driver --attach-daemon-socket=%q, want it %v", socket, w.attachDaemon)
	}
	regDir := path.Join(w.kubeletDir, "plugins_registry")
	registrar := container(t, spec, "node-driver-registrar")
	switch w.registration {
	case "driver":
		if registrar != nil {
			t.Error("node-driver-registrar runs although the driver registers itself")
		}
		if got, _ := flag(d.Args, "kubelet-registration-path"); got != kubeletSocket {
			t.Errorf("driver --kubelet-registration-path=%q, want %s", got, kubeletSocket)
		}
		dir, _ := flag(d.Args, "plugin-registration-dir")
		if host, _ := hostPathOf(spec, d, dir); dir == "" || host != regDir {
			t.Errorf("driver --plugin-registration-dir=%q is %q on the host, want %s", dir, host, regDir)
		}
	case "registrar":
		if registrar == nil {
			t.Fatalf("no node-driver-registrar: %v", containerNames(spec))
		}
		if _, ok := flag(d.Args, "plugin-registration-dir"); ok {
			t.Error("driver registers itself as well as node-driver-registrar")
		}
		if got, _ := flag(registrar.Args, "kubelet-registration-path"); got != kubeletSocket {
			t.Errorf("registrar --kubelet-registration-path=%q, want %s", got, kubeletSocket)
		}
		addr, _ := flag(registrar.Args, "csi-address")
		if host, _ := hostPathOf(spec, registrar, addr); host != kubeletSocket {
			t.Errorf("registrar --csi-address=%s is %q on the host, want %s", addr, host, kubeletSocket)
		}
		if host, _ := hostPathOf(spec, registrar, "/registration"); host != regDir {
			t.Errorf("registrar's /registration is %q on the host, want %s", host, regDir)
		}
	}
	checkLiveness(t, spec, d, w.liveness, "node")
}

// checkSharedDirs: c has every host directory the node plugin and the
// attach daemon share at its own path, with Bidirectional propagation.
func checkSharedDirs(t *testing.T, spec corev1.PodSpec, c *corev1.Container, w want, what string) {
	t.Helper()
	for _, dir := range w.sharedDirs {
		host, ok := hostPathOf(spec, c, dir)
		var m *corev1.VolumeMount
		for i := range c.VolumeMounts {
			if c.VolumeMounts[i].MountPath == dir {
				m = &c.VolumeMounts[i]
			}
		}
		if !ok || host != dir || m == nil || m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
			t.Errorf("%s: %s is %q on the host (mount %+v), want the host's, Bidirectional", what, dir, host, m)
		}
	}
}

// checkAttachDaemon: its own DaemonSet, updated only when its pods are
// deleted, on the node plugin's nodes; the node plugin's socket is its
// socket on the host, and both share the state directories.
func checkAttachDaemon(t *testing.T, r *rendering, w want) {
	if !w.attachDaemon {
		if r.has("DaemonSet", "spindle-attachd") {
			t.Error("the attach daemon is rendered although disabled")
		}
		return
	}
	ds := one[appsv1.DaemonSet](t, r, "DaemonSet", "spindle-attachd")
	if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
		t.Errorf("attach daemon updateStrategy %q, want OnDelete: its pods hold the volumes' daemons", ds.Spec.UpdateStrategy.Type)
	}
	node := one[appsv1.DaemonSet](t, r, "DaemonSet", "spindle-node").Spec.Template.Spec
	spec := ds.Spec.Template.Spec
	if !spec.HostPID || !spec.HostNetwork {
		t.Errorf("attach daemon hostPID %v hostNetwork %v, want both", spec.HostPID, spec.HostNetwork)
	}
	if !reflect.DeepEqual(spec.NodeSelector, node.NodeSelector) || !reflect.DeepEqual(spec.Tolerations, node.Tolerations) || !reflect.DeepEqual(spec.Affinity, node.Affinity) {
		t.Errorf("the attach daemon does not run on the node plugin's nodes: selector %v tolerations %v", spec.NodeSelector, spec.Tolerations)
	}
	if _, ok := ds.Spec.Template.Annotations["checksum/config"]; ok {
		t.Error("the attach daemon's pods carry the config checksum; it needs no config")
	}
	c := container(t, spec, "attachd")
	if c == nil {
		t.Fatalf("attach daemon pod has no attachd container: %v", containerNames(spec))
	}
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("the attach daemon is not privileged: it maps nbd devices and mounts FUSE")
	}
	if mode, _ := flag(c.Args, "mode"); mode != "attach-daemon" {
		t.Errorf("attach daemon --mode=%q", mode)
	}
	d := container(t, node, "spindle")
	want, _ := flag(d.Args, "attach-daemon-socket")
	got, _ := flag(c.Args, "attach-daemon-socket")
	nodeHost, _ := hostPathOf(node, d, want)
	daemonHost, _ := hostPathOf(spec, c, got)
	if got == "" || nodeHost == "" || nodeHost != daemonHost || !strings.HasPrefix(nodeHost, w.stateDir+"/") {
		t.Errorf("the node plugin asks for %s (%q on the host), the attach daemon listens on %s (%q on the host); want one socket below %s",
			want, nodeHost, got, daemonHost, w.stateDir)
	}
	if nodeImage := d.Image; c.Image != nodeImage {
		t.Errorf("attach daemon image %s, want the driver's %s", c.Image, nodeImage)
	}
	for _, p := range []string{"/dev", "/sys", "/lib/modules"} {
		if host, ok := hostPathOf(spec, c, p); !ok || host != p {
			t.Errorf("attach daemon's %s is %q on the host, want the host's", p, host)
		}
	}
	checkSharedDirs(t, spec, c, w, "attach daemon")
}

// checkLiveness: the livenessprobe sidecar talks to the driver's socket and
// the driver's probe asks it.
func checkLiveness(t *testing.T, spec corev1.PodSpec, d *corev1.Container, enabled bool, what string) {
	lp := container(t, spec, "liveness-probe")
	if !enabled {
		if lp != nil || d.LivenessProbe != nil {
			t.Errorf("%s: livenessprobe disabled, yet container %v probe %v", what, lp != nil, d.LivenessProbe)
		}
		return
	}
	if lp == nil || d.LivenessProbe == nil || d.LivenessProbe.HTTPGet == nil {
		t.Fatalf("%s: livenessprobe enabled, container %v probe %v", what, lp != nil, d.LivenessProbe)
	}
	sameSocket(t, spec, d, lp, what)
	ep, _ := flag(lp.Args, "http-endpoint")
	if want := ":" + d.LivenessProbe.HTTPGet.Port.String(); ep != want {
		t.Errorf("%s: livenessprobe --http-endpoint=%q, the driver's probe asks port %s", what, ep, want)
	}
}

// sameSocket: sidecar's --csi-address is the driver's --endpoint, through
// the same volume.
func sameSocket(t *testing.T, spec corev1.PodSpec, d, sidecar *corev1.Container, what string) {
	t.Helper()
	endpoint, _ := flag(d.Args, "endpoint")
	sock, err := config.SocketPath(endpoint)
	if err != nil {
		t.Fatalf("%s: driver --endpoint: %v", what, err)
	}
	addr, ok := flag(sidecar.Args, "csi-address")
	if !ok {
		t.Errorf("%s: %s has no --csi-address", what, sidecar.Name)
		return
	}
	vol := func(c *corev1.Container, p string) string {
		for _, m := range c.VolumeMounts {
			if path.Dir(p) == path.Clean(m.MountPath) {
				return m.Name
			}
		}
		return ""
	}
	if path.Base(addr) != path.Base(sock) || vol(sidecar, addr) == "" || vol(sidecar, addr) != vol(d, sock) {
		t.Errorf("%s: %s --csi-address=%s (volume %q) is not the driver's socket %s (volume %q)",
			what, sidecar.Name, addr, vol(sidecar, addr), sock, vol(d, sock))
	}
}

func checkController(t *testing.T, r *rendering, w want) {
	dep := one[appsv1.Deployment](t, r, "Deployment", "spindle-controller")
	spec := dep.Spec.Template.Spec
	if spec.PriorityClassName != "system-cluster-critical" {
		t.Errorf("controller priorityClassName %q", spec.PriorityClassName)
	}
	if spec.HostNetwork != w.ctrlHostNet {
		t.Errorf("controller hostNetwork %v, want %v", spec.HostNetwork, w.ctrlHostNet)
	}
	d := container(t, spec, "spindle")
	if d == nil {
		t.Fatalf("controller pod has no spindle container: %v", containerNames(spec))
	}
	if mode, _ := flag(d.Args, "mode"); mode != "controller" {
		t.Errorf("controller --mode=%q", mode)
	}
	if d.SecurityContext != nil && d.SecurityContext.Privileged != nil && *d.SecurityContext.Privileged {
		t.Error("the controller's driver container is privileged; it needs no devices")
	}
	for _, p := range append(slices.Clone(w.poolDirs), w.iscsiPools...) {
		if host, ok := hostPathOf(spec, d, p); !ok || host != p {
			t.Errorf("pool %s is not mounted from the host in the controller pod (%q)", p, host)
		}
	}
	wantSidecars := []string{"csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter"}
	for _, name := range wantSidecars {
		s := container(t, spec, name)
		if s == nil {
			t.Errorf("controller has no %s: %v", name, containerNames(spec))
			continue
		}
		sameSocket(t, spec, d, s, "controller")
		if _, ok := flag(s.Args, "leader-election"); !ok {
			t.Errorf("%s runs without --leader-election", name)
		}
		if ns, _ := flag(s.Args, "leader-election-namespace"); ns != "$(NAMESPACE)" || !slices.ContainsFunc(s.Env, func(e corev1.EnvVar) bool {
			return e.Name == "NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace"
		}) {
			t.Errorf("%s: --leader-election-namespace=%q without NAMESPACE from the downward API", name, ns)
		}
	}
	if snap := container(t, spec, "csi-snapshotter"); snap != nil {
		if fg, _ := flag(snap.Args, "feature-gates"); (fg == "CSIVolumeGroupSnapshot=true") != w.groupSnaps {
			t.Errorf("csi-snapshotter --feature-gates=%q with volumeGroupSnapshots %v", fg, w.groupSnaps)
		}
	}
	if w.snapshotCtl {
		sc := one[appsv1.Deployment](t, r, "Deployment", "spindle-snapshot-controller").Spec.Template.Spec
		if fg, _ := flag(sc.Containers[0].Args, "feature-gates"); (fg == "CSIVolumeGroupSnapshot=true") != w.groupSnaps {
			t.Errorf("snapshot-controller --feature-gates=%q with volumeGroupSnapshots %v", fg, w.groupSnaps)
		}
	}
	prov := container(t, spec, "csi-provisioner")
	if prov != nil {
		if _, ok := flag(prov.Args, "extra-create-metadata"); !ok {
			t.Error("csi-provisioner without --extra-create-metadata")
		}
		if fg, _ := flag(prov.Args, "feature-gates"); (fg == "Topology=true") != w.nodeLocal {
			t.Errorf("csi-provisioner --feature-gates=%q with a node-local pool %v", fg, w.nodeLocal)
		}
		_, capacity := flag(prov.Args, "enable-capacity")
		if capacity != w.capacity {
			t.Errorf("csi-provisioner --enable-capacity %v, want %v", capacity, w.capacity)
		}
		if capacity && !slices.ContainsFunc(prov.Env, func(e corev1.EnvVar) bool {
			return e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
		}) {
			t.Error("capacity tracking without POD_NAME from the downward API")
		}
	}
	checkLiveness(t, spec, d, w.liveness, "controller")

	pdb := one[policyv1.PodDisruptionBudget](t, r, "PodDisruptionBudget", "spindle-controller")
	if pdb.Spec.Selector == nil || !labelsMatch(pdb.Spec.Selector.MatchLabels, dep.Spec.Template.Labels) {
		t.Errorf("PodDisruptionBudget selector %v does not select the controller pods %v", pdb.Spec.Selector, dep.Spec.Template.Labels)
	}
}

func labelsMatch(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return len(selector) > 0
}

// grants collects the rules bound to a ServiceAccount: cluster-wide, and
// in the release's namespace.
func grants(t *testing.T, r *rendering, sa string) (cluster, namespaced []rbacv1.PolicyRule) {
	roles := map[string][]rbacv1.PolicyRule{}
	for _, cr := range all[rbacv1.ClusterRole](t, r, "ClusterRole") {
		roles["ClusterRole/"+cr.Name] = cr.Rules
	}
	for _, ro := range all[rbacv1.Role](t, r, "Role") {
		roles["Role/"+ro.Name] = ro.Rules
	}
	bound := func(subjects []rbacv1.Subject) bool {
		return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == namespace
		})
	}
	for _, b := range all[rbacv1.ClusterRoleBinding](t, r, "ClusterRoleBinding") {
		if bound(b.Subjects) {
			rules, ok := roles[b.RoleRef.Kind+"/"+b.RoleRef.Name]
			if !ok {
				t.Errorf("ClusterRoleBinding %s refers to %s %s, not rendered", b.Name, b.RoleRef.Kind, b.RoleRef.Name)
			}
			cluster = append(cluster, rules...)
		}
	}
	for _, b := range all[rbacv1.RoleBinding](t, r, "RoleBinding") {
		if bound(b.Subjects) {
			rules, ok := roles[b.RoleRef.Kind+"/"+b.RoleRef.Name]
			if !ok {
				t.Errorf("RoleBinding %s refers to %s %s, not rendered", b.Name, b.RoleRef.Kind, b.RoleRef.Name)
			}
			namespaced = append(namespaced, rules...)
		}
	}
	return cluster, namespaced
}

// allows reports whether rules grant verb on group/resource (any name).
func allows(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	return slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) && len(r.ResourceNames) == 0
	})
}

func checkRBAC(t *testing.T, r *rendering, w want) {
	cluster, namespaced := grants(t, r, "spindle-controller")
	type grant struct{ who, group, resource, verb string }
	required := []grant{
		{"provisioner", "", "persistentvolumes", "create"},
		{"provisioner", "", "persistentvolumes", "delete"},
		{"provisioner", "", "persistentvolumeclaims", "update"},
		{"provisioner", "storage.k8s.io", "storageclasses", "get"},
		{"provisioner", "storage.k8s.io", "csinodes", "get"},
		{"provisioner", "", "nodes", "get"},
		{"provisioner", "", "events", "create"},
		{"provisioner", "snapshot.storage.k8s.io", "volumesnapshotcontents", "get"},
		{"attacher", "storage.k8s.io", "volumeattachments", "patch"},
		{"attacher", "storage.k8s.io", "volumeattachments/status", "patch"},
		{"attacher", "", "persistentvolumes", "patch"},
		{"attacher", "storage.k8s.io", "csinodes", "get"},
		{"resizer", "", "persistentvolumeclaims/status", "patch"},
		{"resizer", "", "pods", "list"},
		{"snapshotter", "snapshot.storage.k8s.io", "volumesnapshotcontents", "update"},
		{"snapshotter", "snapshot.storage.k8s.io", "volumesnapshotcontents/status", "patch"},
		{"snapshotter", "snapshot.storage.k8s.io", "volumesnapshotclasses", "get"},
	}
	for _, g := range required {
		if !allows(cluster, g.group, g.resource, g.verb) {
			t.Errorf("the controller (%s) may not %s %s.%s", g.who, g.verb, g.resource, g.group)
		}
	}
	for _, verb := range []string{"get", "create", "update"} {
		if !allows(namespaced, "coordination.k8s.io", "leases", verb) {
			t.Errorf("the controller may not %s leases in %s (leader election)", verb, namespace)
		}
		if allows(cluster, "coordination.k8s.io", "leases", verb) {
			t.Errorf("the controller may %s leases cluster-wide; its namespace is enough", verb)
		}
	}
	if got := allows(namespaced, "storage.k8s.io", "csistoragecapacities", "create"); got != w.capacity {
		t.Errorf("the controller may create CSIStorageCapacities: %v, capacity tracking %v", got, w.capacity)
	}
	// Least privilege: no wildcards; Secrets only by name.
	for _, rule := range append(cluster, namespaced...) {
		if slices.Contains(rule.Verbs, "*") || slices.Contains(rule.Resources, "*") || slices.Contains(rule.APIGroups, "*") {
			t.Errorf("wildcard rule %+v", rule)
		}
		if slices.Contains(rule.Resources, "secrets") {
			if !slices.Equal(rule.Verbs, []string{"get"}) || len(rule.ResourceNames) == 0 {
				t.Errorf("secrets rule %+v: want get on named Secrets only", rule)
			}
			for _, n := range rule.ResourceNames {
				if !slices.Contains(w.secretNames, n) {
					t.Errorf("the controller may read Secret %s, which no class references", n)
				}
			}
		}
	}
	for _, n := range w.secretNames {
		if !slices.ContainsFunc(cluster, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.ResourceNames, n) }) {
			t.Errorf("the classes reference Secret %s, which the controller may not read", n)
		}
	}
	if nc, nn := grants(t, r, "spindle-node"); len(nc)+len(nn) > 0 {
		t.Errorf("the node plugin has API rules %v %v; it calls no API", nc, nn)
	}
	if w.snapshotCtl {
		sc, sn := grants(t, r, "spindle-snapshot-controller")
		if !allows(sc, "snapshot.storage.k8s.io", "volumesnapshotcontents", "create") || !allows(sc, "snapshot.storage.k8s.io", "volumesnapshots/status", "update") ||
			!allows(sn, "coordination.k8s.io", "leases", "update") {
			t.Error("snapshot-controller lacks its rules (volumesnapshotcontents create, volumesnapshots/status update, leases)")
		}
	}
}

// secretish matches a key or value that carries a credential.
var secretish = regexp.MustCompile(`(?i)(password|passwd|userkey|secret_?key|token|BEGIN [A-Z ]*PRIVATE KEY|AQ[A-Za-z0-9+/]{38}==)`)

// checkConfig: the backend config parses with the driver's own parser and
// holds no credentials; no Secret is rendered at all.
func checkConfig(t *testing.T, r *rendering, w want) {
	if n := len(all[corev1.Secret](t, r, "Secret")); n > 0 {
		t.Errorf("the chart renders %d Secrets; credentials are referenced, never inlined", n)
	}
	cm := one[corev1.ConfigMap](t, r, "ConfigMap", "spindle-config")
	data, ok := cm.Data["config.yaml"]
	if !ok {
		t.Fatalf("ConfigMap spindle-config has no config.yaml: %v", cm.Data)
	}
	if m := secretish.FindString(data); m != "" {
		t.Errorf("the backend config holds %q:\n%s", m, data)
	}
	f := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(f, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := config.LoadFile(f); err != nil {
		t.Errorf("the driver refuses the rendered config: %v\n%s", err, data)
	}
	kmsConfig, hasKMS := cm.Data["kms.json"]
	if hasKMS != (w.kmsIDs != nil) {
		t.Errorf("ConfigMap spindle-config has kms.json: %t, want %t", hasKMS, w.kmsIDs != nil)
	}
	if hasKMS {
		f := filepath.Join(t.TempDir(), "kms.json")
		if err := os.WriteFile(f, []byte(kmsConfig), 0o644); err != nil {
			t.Fatal(err)
		}
		if reg, err := kms.Load(f); err != nil {
			t.Errorf("the driver refuses the rendered KMS configuration: %v\n%s", err, kmsConfig)
		} else if !slices.Equal(reg.IDs(), w.kmsIDs) {
			t.Errorf("the rendered KMS configuration has %v, want %v", reg.IDs(), w.kmsIDs)
		}
	}
	for _, name := range []string{"spindle-controller", "spindle-node"} {
		var spec corev1.PodSpec
		if name == "spindle-node" {
			spec = one[appsv1.DaemonSet](t, r, "DaemonSet", name).Spec.Template.Spec
		} else {
			spec = one[appsv1.Deployment](t, r, "Deployment", name).Spec.Template.Spec
		}
		d := container(t, spec, "spindle")
		cfg, _ := flag(d.Args, "config")
		m := mount(d, "config")
		if m == nil || path.Dir(cfg) != m.MountPath || !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool {
			return v.Name == "config" && v.ConfigMap != nil && v.ConfigMap.Name == cm.Name
		}) || path.Base(cfg) != "config.yaml" {
			t.Errorf("%s: --config=%s is not ConfigMap %s's config.yaml", name, cfg, cm.Name)
		}
		kmsFlag, ok := flag(d.Args, "kms-config")
		if ok != hasKMS || ok && (path.Dir(kmsFlag) != m.MountPath || path.Base(kmsFlag) != "kms.json") {
			t.Errorf("%s: --kms-config=%q (given: %t); want ConfigMap %s's kms.json exactly when it has one", name, kmsFlag, ok, cm.Name)
		}
	}
}

func checkClasses(t *testing.T, r *rendering) {
	scs := all[storagev1.StorageClass](t, r, "StorageClass")
	for _, sc := range scs {
		if sc.Provisioner != "spindle.csi.dev" {
			t.Errorf("StorageClass %s provisioner %q", sc.Name, sc.Provisioner)
		}
		for k, v := range sc.Parameters {
			if secretish.MatchString(k) || secretish.MatchString(v) {
				t.Errorf("StorageClass %s parameter %s=%s looks like an inlined credential", sc.Name, k, v)
			}
			if strings.HasSuffix(k, "-secret-name") {
				if _, ok := sc.Parameters[strings.TrimSuffix(k, "-name")+"-namespace"]; !ok {
					t.Errorf("StorageClass %s: %s without its -namespace", sc.Name, k)
				}
			}
		}
	}
	if def := r.has("StorageClass", "spindle-ext4"); def {
		sc := one[storagev1.StorageClass](t, r, "StorageClass", "spindle-ext4")
		if sc.AllowVolumeExpansion == nil || !*sc.AllowVolumeExpansion {
			t.Error("StorageClass spindle-ext4 does not allow volume expansion")
		}
	}
	for _, vsc := range all[volumeSnapshotClass](t, r, "VolumeSnapshotClass") {
		if vsc.Driver != "spindle.csi.dev" || vsc.APIVersion != "snapshot.storage.k8s.io/v1" {
			t.Errorf("VolumeSnapshotClass %s: driver %q apiVersion %q", vsc.Metadata.Name, vsc.Driver, vsc.APIVersion)
		}
	}
}

// checkEveryContainer: pull policy, and the apiserver override on every
// container of every workload.
func checkEveryContainer(t *testing.T, r *rendering, w want) {
	var specs []corev1.PodSpec
	for _, d := range all[appsv1.Deployment](t, r, "Deployment") {
		specs = append(specs, d.Spec.Template.Spec)
	}
	for _, d := range all[appsv1.DaemonSet](t, r, "DaemonSet") {
		specs = append(specs, d.Spec.Template.Spec)
	}
	for _, spec := range specs {
		for _, c := range spec.Containers {
			if c.ImagePullPolicy != w.pullPolicy {
				t.Errorf("container %s imagePullPolicy %q, want %q", c.Name, c.ImagePullPolicy, w.pullPolicy)
			}
			env := map[string]string{}
			for _, e := range c.Env {
				env[e.Name] = e.Value
			}
			got := ""
			if h, ok := env["KUBERNETES_SERVICE_HOST"]; ok {
				got = h + ":" + env["KUBERNETES_SERVICE_PORT"]
			}
			if got != w.apiServer {
				t.Errorf("container %s reaches the apiserver at %q, want %q", c.Name, got, w.apiServer)
			}
		}
	}
}

// The Rook example mounts Rook's cluster map ConfigMap into the driver of
// the controller and of every node as a directory: kubelet updates a
// ConfigMap volume in place only without subPath, and the driver reads the
// file on every call, so a monitor Rook moves is used without a restart.
func TestRookClusterMapFollowsTheConfigMap(t *testing.T) {
	helm(t)
	r := mustTemplate(t, []string{filepath.Join(chartDir, "examples", "rook.yaml")})
	specs := podSpecs(t, r)
	if len(specs) < 2 {
		t.Fatalf("workloads %v: want the controller and the node plugin", slices.Collect(maps.Keys(specs)))
	}
	for workload, spec := range specs {
		d := container(t, spec, "spindle")
		if d == nil {
			continue
		}
		var mounted bool
		for _, m := range d.VolumeMounts {
			if m.MountPath != "/etc/ceph-csi-config" {
				continue
			}
			mounted = true
			if m.SubPath != "" {
				t.Errorf("%s: the cluster map is mounted with subPath %q: kubelet would never update it", workload, m.SubPath)
			}
			i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
			if i < 0 || spec.Volumes[i].ConfigMap == nil || spec.Volumes[i].ConfigMap.Name != "rook-ceph-csi-config" {
				t.Errorf("%s: volume %s is not Rook's ConfigMap rook-ceph-csi-config", workload, m.Name)
			}
		}
		if !mounted {
			t.Errorf("%s: the driver has no mount at /etc/ceph-csi-config, where the config's clusterMap is", workload)
		}
	}
}
