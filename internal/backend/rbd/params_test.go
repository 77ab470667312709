package rbd

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	utilexec "k8s.io/utils/exec"
	"sigs.k8s.io/yaml"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// rookClusterMap is the ConfigMap Rook writes (rook-ceph-csi-config, key
// csi-cluster-config-json), as Rook v1.15 formats it, with a second
// cluster that keeps its RBD images in a RADOS namespace.
const rookClusterMap = `[{"clusterID":"rook-ceph","monitors":["10.96.12.7:6789","10.96.80.3:6789"],"namespace":"rook-ceph","cephFS":{"netNamespaceFilePath":"","subvolumeGroup":"","kernelMountOptions":"","fuseMountOptions":""},"rbd":{"netNamespaceFilePath":"","radosNamespace":""},"nfs":{"netNamespaceFilePath":""},"readAffinity":{"enabled":false,"crushLocationLabels":null}},` +
	`{"clusterID":"tenant-a","monitors":["10.96.12.7:6789"],"namespace":"rook-ceph","rbd":{"radosNamespace":"tenant-a"}}]`

// paramStore is a store whose own cluster is "rook-ceph" (listed in the
// cluster map too) with pool "replicapool"; no command may run.
func paramStore(t *testing.T, clusterMap string) *Store {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte(clusterMap), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{ClusterID: "rook-ceph", ClusterMap: path, Pool: "replicapool", UserID: "csi", KeyFile: "/k"}.withDefaults()
	c := newCluster(cfg, command.New(utilexec.New(), nil), nil)
	return &Store{c: c, cfg: cfg, key: "rbd/ceph"}
}

// TestVolumeParameters: every ceph-csi StorageClass parameter, with its
// meaning where it is taken, and the refusal, naming the key and why,
// where it needs something Spindle lacks.
func TestVolumeParameters(t *testing.T) {
	s := paramStore(t, rookClusterMap)
	tests := []struct {
		name   string
		params map[string]string
		check  func(t *testing.T, o volumeOptions)
		refuse []string // the refusal names these
	}{
		{name: "none: the instance's own cluster and pool", params: nil, check: func(t *testing.T, o volumeOptions) {
			want := location{cluster: "rook-ceph", pool: "replicapool"}
			if o.loc != want || o.features != DefaultImageFeatures || o.mounter != MounterKRBD || o.prefix != volumePrefix {
				t.Fatalf("options %+v", o)
			}
		}},
		{name: "Rook's StorageClass", params: map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "imageFormat": "2", "imageFeatures": "layering",
			"csi.storage.k8s.io/provisioner-secret-name": "rook-csi-rbd-provisioner", "csi.storage.k8s.io/fstype": "ext4", "mkfsOptions": "-m0"},
			check: func(t *testing.T, o volumeOptions) {
				if o.loc != (location{cluster: "rook-ceph", pool: "replicapool"}) || o.features != "layering" {
					t.Fatalf("options %+v", o)
				}
			}},
		{name: "clusterID from the cluster map, its namespace", params: map[string]string{"clusterID": "tenant-a", "pool": "rbd"}, check: func(t *testing.T, o volumeOptions) {
			if o.loc != (location{cluster: "tenant-a", pool: "rbd", namespace: "tenant-a"}) {
				t.Fatalf("location %+v", o.loc)
			}
		}},
		{name: "clusterID unknown", params: map[string]string{"clusterID": "elsewhere"}, refuse: []string{"parameters.clusterID", `"elsewhere"`, "cluster map"}},
		{name: "clusterID not an ID", params: map[string]string{"clusterID": "a b"}, refuse: []string{"parameters.clusterID", "not a cluster ID"}},
		{name: "pool", params: map[string]string{"pool": "fast"}, check: func(t *testing.T, o volumeOptions) {
			if o.loc.pool != "fast" {
				t.Fatalf("pool %q", o.loc.pool)
			}
		}},
		{name: "pool not a name", params: map[string]string{"pool": "a/b"}, refuse: []string{"parameters.pool", "not a pool name"}},
		{name: "dataPool", params: map[string]string{"dataPool": "ec-data"}, check: func(t *testing.T, o volumeOptions) {
			if opts := o.imageOptions(o.features); !reflect.DeepEqual(opts, ceph.ImageOptions{Features: []string{"layering"}, DataPool: "ec-data"}) {
				t.Fatalf("image options %+v", opts)
			}
		}},
		{name: "dataPool not a name", params: map[string]string{"dataPool": "x y"}, refuse: []string{"parameters.dataPool"}},
		{name: "radosNamespace", params: map[string]string{"radosNamespace": "team-b"}, check: func(t *testing.T, o volumeOptions) {
			if o.loc.namespace != "team-b" {
				t.Fatalf("namespace %q", o.loc.namespace)
			}
		}},
		{name: "radosNamespace overrides the map's", params: map[string]string{"clusterID": "tenant-a", "radosNamespace": ""}, check: func(t *testing.T, o volumeOptions) {
			if o.loc.namespace != "" {
				t.Fatalf("namespace %q", o.loc.namespace)
			}
		}},
		{name: "radosNamespace bad", params: map[string]string{"radosNamespace": "-x"}, refuse: []string{"parameters.radosNamespace"}},
		{name: "imageFeatures all of ceph-csi's", params: map[string]string{"imageFeatures": "layering,exclusive-lock,object-map,fast-diff,deep-flatten", "mounter": "rbd-nbd"},
			check: func(t *testing.T, o volumeOptions) {
				if o.features != "layering,exclusive-lock,object-map,fast-diff,deep-flatten" {
					t.Fatalf("features %q", o.features)
				}
			}},
		{name: "imageFeatures unknown", params: map[string]string{"imageFeatures": "layering,striping"}, refuse: []string{"imageFeatures", `"striping"`}},
		{name: "imageFeatures without what they need", params: map[string]string{"imageFeatures": "layering,fast-diff"}, refuse: []string{"fast-diff needs object-map"}},
		{name: "imageFeatures without layering", params: map[string]string{"imageFeatures": "exclusive-lock"}, refuse: []string{"must include layering", "clones"}},
		{name: "imageFeatures journaling with krbd", params: map[string]string{"imageFeatures": "layering,exclusive-lock,journaling"}, refuse: []string{"krbd cannot map images with journaling"}},
		{name: "imageFeatures journaling with rbd-nbd", params: map[string]string{"imageFeatures": "layering,exclusive-lock,journaling", "mounter": "rbd-nbd"}},
		{name: "imageFormat 2", params: map[string]string{"imageFormat": "2"}},
		{name: "imageFormat 1", params: map[string]string{"imageFormat": "1"}, refuse: []string{"parameters.imageFormat", "refused", "format 1 images cannot be cloned"}},
		{name: "imageFormat other", params: map[string]string{"imageFormat": "3"}, refuse: []string{"parameters.imageFormat", `must be "2"`}},
		{name: "mounter rbd (ceph-csi's krbd)", params: map[string]string{"mounter": "rbd"}, check: func(t *testing.T, o volumeOptions) {
			if o.mounter != MounterKRBD {
				t.Fatalf("mounter %q", o.mounter)
			}
		}},
		{name: "mounter rbd-nbd", params: map[string]string{"mounter": "rbd-nbd"}, check: func(t *testing.T, o volumeOptions) {
			if o.mounter != MounterNBD {
				t.Fatalf("mounter %q", o.mounter)
			}
		}},
		{name: "mounter rbd-fuse", params: map[string]string{"mounter": "rbd-fuse"}, check: func(t *testing.T, o volumeOptions) {
			if o.mounter != MounterFuse {
				t.Fatalf("mounter %q", o.mounter)
			}
		}},
		{name: "mounter unknown", params: map[string]string{"mounter": "iscsi"}, refuse: []string{"parameters.mounter", "not a mounter"}},
		{name: "mapOptions ceph-csi form", params: map[string]string{"mapOptions": "krbd:lock_on_read,queue_depth=1024;nbd:try-netlink"}, check: func(t *testing.T, o volumeOptions) {
			if optionsFor(o.mapOptions, MounterKRBD) != "lock_on_read,queue_depth=1024" || optionsFor(o.mapOptions, MounterNBD) != "try-netlink" {
				t.Fatalf("map options %q", o.mapOptions)
			}
		}},
		{name: "mapOptions plain is krbd's", params: map[string]string{"mapOptions": "lock_on_read"}, check: func(t *testing.T, o volumeOptions) {
			if optionsFor(o.mapOptions, MounterKRBD) != "lock_on_read" || optionsFor(o.mapOptions, MounterNBD) != "" {
				t.Fatalf("map options %q", o.mapOptions)
			}
		}},
		{name: "mapOptions unknown mounter", params: map[string]string{"mapOptions": "fuse:x"}, refuse: []string{"parameters.mapOptions", `"fuse"`}},
		{name: "mapOptions shell characters", params: map[string]string{"mapOptions": "krbd:a;b"}, refuse: []string{"parameters.mapOptions"}},
		{name: "mapOptions with rbd-fuse", params: map[string]string{"mounter": "rbd-fuse", "mapOptions": "krbd:x"}, refuse: []string{"rbd-fuse takes no map or unmap options"}},
		{name: "unmapOptions", params: map[string]string{"unmapOptions": "krbd:force;nbd:force"}, check: func(t *testing.T, o volumeOptions) {
			if optionsFor(o.unmapOptions, MounterKRBD) != "force" || optionsFor(o.unmapOptions, MounterNBD) != "force" {
				t.Fatalf("unmap options %q", o.unmapOptions)
			}
		}},
		{name: "unmapOptions bad", params: map[string]string{"unmapOptions": "krbd:f o"}, refuse: []string{"parameters.unmapOptions"}},
		{name: "volumeNamePrefix", params: map[string]string{"volumeNamePrefix": "db-"}, check: func(t *testing.T, o volumeOptions) {
			if o.prefix != "db-" {
				t.Fatalf("prefix %q", o.prefix)
			}
		}},
		{name: "volumeNamePrefix of snapshots", params: map[string]string{"volumeNamePrefix": "csi-snap-x"}, refuse: []string{"parameters.volumeNamePrefix", "csi-snap-"}},
		{name: "volumeNamePrefix of temporaries", params: map[string]string{"volumeNamePrefix": "csi-tmp-"}, refuse: []string{"parameters.volumeNamePrefix", "images being built"}},
		{name: "volumeNamePrefix bad", params: map[string]string{"volumeNamePrefix": "a/b"}, refuse: []string{"parameters.volumeNamePrefix"}},
		{name: "striping", params: map[string]string{"stripeUnit": "65536", "stripeCount": "16", "objectSize": "4194304"}, check: func(t *testing.T, o volumeOptions) {
			want := ceph.ImageOptions{Features: []string{"layering"}, ObjectSize: 4194304, StripeCount: 16, StripeUnit: 65536}
			if opts := o.imageOptions(o.features); !reflect.DeepEqual(opts, want) {
				t.Fatalf("image options %+v, want %+v", opts, want)
			}
		}},
		{name: "stripeUnit not a number", params: map[string]string{"stripeUnit": "64k"}, refuse: []string{"parameters.stripeUnit", "positive whole number"}},
		{name: "objectSize not a power of two", params: map[string]string{"objectSize": "3000000"}, refuse: []string{"parameters.objectSize", "power of two"}},
		{name: "objectSize beyond Ceph's", params: map[string]string{"objectSize": "67108864"}, refuse: []string{"parameters.objectSize", "33554432"}},
		{name: "tryOtherMounters false", params: map[string]string{"tryOtherMounters": "false"}},
		{name: "tryOtherMounters true", params: map[string]string{"tryOtherMounters": "true"}, refuse: []string{"parameters.tryOtherMounters", "does not fall back"}},
		// encrypted and encryptionKMSID are the driver's, with ceph-csi's
		// meaning (internal/driver/encryption.go validates them): a
		// volume's record holds them, and the store reads past them.
		{name: "encrypted true", params: map[string]string{"encrypted": "true", "encryptionKMSID": "vault"}, check: func(t *testing.T, o volumeOptions) {
			if want := (ceph.ImageOptions{Features: []string{"layering"}}); !reflect.DeepEqual(o.imageOptions(o.features), want) {
				t.Fatalf("image options %+v, want %+v: the encryption keys shape nothing of the image", o.imageOptions(o.features), want)
			}
		}},
		{name: "encryptionType", params: map[string]string{"encryptionType": "block"}, refuse: []string{"parameters.encryptionType", "refused", "LUKS2", "fixed"}},
		{name: "encryptionCipher", params: map[string]string{"encryptionCipher": "aes-xts-plain64"}, refuse: []string{"parameters.encryptionCipher"}},
		{name: "encryptionKeySize", params: map[string]string{"encryptionKeySize": "256"}, refuse: []string{"parameters.encryptionKeySize"}},
		{name: "encryptionSectorSize", params: map[string]string{"encryptionSectorSize": "4096"}, refuse: []string{"parameters.encryptionSectorSize"}},
		{name: "integrityMode", params: map[string]string{"integrityMode": "hmac-sha256"}, refuse: []string{"parameters.integrityMode", "dm-integrity"}},
		{name: "topologyConstrainedPools", params: map[string]string{"topologyConstrainedPools": "[]"}, refuse: []string{"parameters.topologyConstrainedPools", "topology"}},
		{name: "cephLogDir", params: map[string]string{"cephLogDir": "/var/log/ceph"}, refuse: []string{"parameters.cephLogDir", "log files"}},
		{name: "cephLogStrategy", params: map[string]string{"cephLogStrategy": "remove"}, refuse: []string{"parameters.cephLogStrategy", "log files"}},
		{name: "thickProvision", params: map[string]string{"thickProvision": "true"}, refuse: []string{"parameters.thickProvision", "thin"}},
		{name: "journalPool", params: map[string]string{"journalPool": "replicapool"}, refuse: []string{"parameters.journalPool", "omap journal"}},
		{name: "QoS", params: map[string]string{"baseIops": "100"}, refuse: []string{"parameters.baseIops", "QoS"}},
		{name: "QoS per GiB", params: map[string]string{"writeBpsPerGiB": "1000"}, refuse: []string{"parameters.writeBpsPerGiB", "QoS"}},
		{name: "unknown key", params: map[string]string{"color": "blue"}, refuse: []string{`unknown key "color"`, "clusterID", "volumeNamePrefix"}},
		{name: "too long for a volume ID", params: map[string]string{"pool": strings.Repeat("p", 60), "radosNamespace": strings.Repeat("n", 40)}, refuse: []string{"longer than 128 bytes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := s.volumeOptionsOf(tt.params)
			if len(tt.refuse) > 0 {
				testutil.WantKind(t, err, errdefs.ErrInvalidArgument, tt.refuse...)
				return
			}
			if err != nil {
				t.Fatalf("volumeOptionsOf(%v): %v", tt.params, err)
			}
			if tt.check != nil {
				tt.check(t, o)
			}
		})
	}
}

// TestSnapshotParameters: a VolumeSnapshotClass's clusterID must be its
// source's; snapshotNamePrefix names the snapshot images.
func TestSnapshotParameters(t *testing.T) {
	s := paramStore(t, rookClusterMap)
	source := location{cluster: "rook-ceph", pool: "replicapool"}.ref("csi-vol-0123456789abcdef0123456789abcdef")
	tests := []struct {
		params map[string]string
		prefix string
		refuse []string
	}{
		{params: map[string]string{"clusterID": "rook-ceph", "csi.storage.k8s.io/snapshotter-secret-name": "rook-csi-rbd-provisioner"}, prefix: snapPrefix},
		{params: map[string]string{"snapshotNamePrefix": "nightly-"}, prefix: "nightly-"},
		{params: map[string]string{"clusterID": "tenant-a"}, refuse: []string{"parameters.clusterID", `"tenant-a"`, "cluster rook-ceph"}},
		{params: map[string]string{"snapshotNamePrefix": "csi-vol-"}, refuse: []string{"parameters.snapshotNamePrefix", "volumes"}},
		{params: map[string]string{"pool": "other"}, refuse: []string{`unknown key "pool"`, "snapshotNamePrefix"}},
	}
	for _, tt := range tests {
		o, err := s.snapshotOptionsOf(source, tt.params)
		if len(tt.refuse) > 0 {
			testutil.WantKind(t, err, errdefs.ErrInvalidArgument, tt.refuse...)
			continue
		}
		if err != nil || o.prefix != tt.prefix {
			t.Errorf("snapshotOptionsOf(%v) = %+v, %v; want prefix %q", tt.params, o, err, tt.prefix)
		}
	}
}

// TestImageIDs: the three forms of an image ID, the shortest given, all
// read back; old IDs stay valid.
func TestImageIDs(t *testing.T) {
	tests := []struct {
		r  ref
		id string
	}{
		{location{cluster: "rook-ceph", pool: "replicapool"}.ref("csi-vol-1"), "replicapool/csi-vol-1"},
		{location{cluster: "tenant-a", pool: "rbd"}.ref("csi-vol-1"), "tenant-a/rbd/csi-vol-1"},
		{location{cluster: "rook-ceph", pool: "rbd", namespace: "ns1"}.ref("csi-vol-1"), "rook-ceph/rbd/ns1/csi-vol-1"},
		{location{cluster: "tenant-a", pool: "rbd", namespace: "ns1"}.ref("img"), "tenant-a/rbd/ns1/img"},
	}
	for _, tt := range tests {
		if got := tt.r.idOf("rook-ceph"); got != tt.id {
			t.Errorf("idOf(%+v) = %q, want %q", tt.r, got, tt.id)
		}
		back, err := parseRef(tt.id, "rook-ceph", "volume")
		if err != nil || back != tt.r {
			t.Errorf("parseRef(%q) = %+v, %v; want %+v", tt.id, back, err, tt.r)
		}
	}
	// An ID of earlier versions.
	if r, err := parseRef("kube/csi-vol-0123456789abcdef0123456789abcdef", "ceph-a", "volume"); err != nil || r.spec() != "kube/csi-vol-0123456789abcdef0123456789abcdef" || r.cluster != "ceph-a" {
		t.Fatalf("old ID: %+v, %v", r, err)
	}
	if r, _ := parseRef("c/rbd/ns1/img", "x", "volume"); r.spec() != "rbd/ns1/img" || r.at("s") != "rbd/ns1/img@s" {
		t.Fatalf("spec %q", r.spec())
	}
	for _, bad := range []string{"img", "a/b/c/d/e", "kube/.hidden", "c/p/-ns/img", "kube/a@b"} {
		_, err := parseRef(bad, "c", "volume")
		testutil.WantKind(t, err, errdefs.ErrNotFound, bad)
	}
}

// TestClusterMap: the map is read on every call (a rewrite is seen at
// once), ceph-csi's old top-level radosNamespace is read too, the own
// cluster falls back to the config's monitors, and what cannot be used is
// a precondition naming the cluster and the map.
func TestClusterMap(t *testing.T) {
	s := paramStore(t, rookClusterMap)
	ep, err := s.c.endpointOf("rook-ceph")
	if err != nil || strings.Join(ep.monitors, ",") != "10.96.12.7:6789,10.96.80.3:6789" {
		t.Fatalf("endpoint = %+v, %v", ep, err)
	}
	// Rook moves a monitor: the next call uses the new list.
	moved := strings.Replace(rookClusterMap, "10.96.80.3:6789", "10.96.99.1:3300", 1)
	if err := os.WriteFile(s.cfg.ClusterMap, []byte(moved), 0o644); err != nil {
		t.Fatal(err)
	}
	if ep, _ := s.c.endpointOf("rook-ceph"); strings.Join(ep.monitors, ",") != "10.96.12.7:6789,10.96.99.1:3300" {
		t.Fatalf("after the rewrite: %v", ep.monitors)
	}
	// ceph-csi before its "rbd" section.
	old := `[{"clusterID":"c1","monitors":["10.0.0.1:6789"],"radosNamespace":"ns-old"}]`
	if err := os.WriteFile(s.cfg.ClusterMap, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	if ep, _ := s.c.endpointOf("c1"); ep.namespace != "ns-old" {
		t.Fatalf("top-level radosNamespace: %+v", ep)
	}
	_, err = s.c.endpointOf("nowhere")
	testutil.WantKind(t, err, errdefs.ErrPrecondition, `"nowhere"`, s.cfg.ClusterMap, "c1")
	// The own cluster, no longer in the map and with no monitors of its
	// own: a precondition too.
	_, err = s.c.endpointOf("rook-ceph")
	testutil.WantKind(t, err, errdefs.ErrPrecondition, "rook-ceph")

	for _, bad := range []struct{ content, want string }{
		{`{"clusterID":"c1"}`, "not ceph-csi's config.json"},
		{`[{"clusterID":"c1","monitors":[]}]`, "no monitors"},
		{`[{"clusterID":"c1","monitors":["10.0.0.1:6789 -k /x"]}]`, "not a monitor address"},
	} {
		if err := os.WriteFile(s.cfg.ClusterMap, []byte(bad.content), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := s.c.endpointOf("c1")
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("map %s: %v, want %q", bad.content, err, bad.want)
		}
	}
	// A map that cannot be read: a class naming one of its clusters is
	// still this backend's (Claims), and fails on the map's own error, not
	// as an unknown cluster; so does one naming the own cluster, whose
	// monitors and namespace the map may hold.
	if err := os.WriteFile(s.cfg.ClusterMap, []byte(`[{"clusterID":`), 0o644); err != nil {
		t.Fatal(err)
	}
	if !s.Claims(map[string]string{"clusterID": "c1"}) {
		t.Error("with the map unreadable, Claims let go of a class naming a cluster of the map")
	}
	err = s.CheckVolumeParameters(map[string]string{"clusterID": "c1", "pool": "p"})
	testutil.WantKind(t, err, errdefs.ErrUnavailable, "cluster c1", s.cfg.ClusterMap)
	err = s.CheckVolumeParameters(map[string]string{"clusterID": "rook-ceph", "pool": "p"})
	testutil.WantKind(t, err, errdefs.ErrUnavailable, "cluster rook-ceph", s.cfg.ClusterMap)
	// No map file yet (the ConfigMap not created): the config's monitors.
	s.cfg.ClusterMap = filepath.Join(t.TempDir(), "missing.json")
	s.c.cfg = s.cfg
	s.c.cfg.Monitors = []string{"10.0.0.9:3300"}
	if ep, err := s.c.endpointOf("rook-ceph"); err != nil || ep.monitors[0] != "10.0.0.9:3300" {
		t.Fatalf("no map: %+v, %v", ep, err)
	}
}

// TestStaticImage: ceph-csi's static form (volumeHandle = the image's
// name) and a dynamically provisioned ceph-csi volume (imageName).
func TestStaticImage(t *testing.T) {
	s := paramStore(t, rookClusterMap)
	attrs := map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "staticVolume": "true", "imageFeatures": "layering"}
	if id, err := s.StaticImage("static-image", attrs); err != nil || id != "replicapool/static-image" {
		t.Fatalf("StaticImage = %q, %v", id, err)
	}
	cephcsi := map[string]string{"clusterID": "tenant-a", "pool": "rbd", "imageName": "csi-vol-6b9ffd6d-4f49-4ea2-9e5b-2bb2e3f9fb4a", "journalPool": "rbd"}
	if id, err := s.StaticImage("0001-0008-tenant-a-0000000000000002-6b9ffd6d-4f49-4ea2-9e5b-2bb2e3f9fb4a", cephcsi); err != nil || id != "tenant-a/rbd/tenant-a/csi-vol-6b9ffd6d-4f49-4ea2-9e5b-2bb2e3f9fb4a" {
		t.Fatalf("StaticImage of a ceph-csi volume = %q, %v", id, err)
	}
	for _, tt := range []struct {
		attrs map[string]string
		want  string
	}{
		{map[string]string{"clusterID": "rook-ceph", "pool": "replicapool"}, "staticVolume"},
		{map[string]string{"staticVolume": "true", "pool": "replicapool"}, "clusterID is required"},
		{map[string]string{"staticVolume": "true", "clusterID": "rook-ceph"}, "pool is required"},
		{map[string]string{"staticVolume": "true", "clusterID": "other", "pool": "p"}, "cluster map"},
	} {
		_, err := s.StaticImage("static-image", tt.attrs)
		testutil.WantKind(t, err, errdefs.ErrInvalidArgument, tt.want)
	}
	pc, err := s.StaticPublishContext("replicapool/static-image", map[string]string{"mounter": "rbd-nbd", "mapOptions": "krbd:a;nbd:try-netlink", "unmapOptions": "nbd:force"})
	if err != nil || pc[ContextMounter] != MounterNBD || pc[ContextMapOptions] != "try-netlink" || pc[ContextUnmapOptions] != "force" || pc[ContextImage] != "static-image" || pc[ContextMonitors] != "10.96.12.7:6789,10.96.80.3:6789" {
		t.Fatalf("StaticPublishContext = %v, %v", pc, err)
	}
	_, err = s.StaticPublishContext("replicapool/static-image", map[string]string{"imageFeatures": "layering,exclusive-lock,journaling"})
	testutil.WantKind(t, err, errdefs.ErrInvalidArgument, "journaling")
}

// TestSecretsAdminID: ceph-csi's older secret keys adminID/adminKey are
// taken when userID/userKey are absent; a half pair names what is missing.
func TestSecretsAdminID(t *testing.T) {
	c := &cluster{cfg: Config{ClusterID: "c", Pool: "p"}.withDefaults()}
	for _, tt := range []struct {
		secrets map[string]string
		user    string
		missing string
	}{
		{map[string]string{"userID": "csi-rbd-provisioner", "userKey": "AQB=="}, "csi-rbd-provisioner", ""},
		{map[string]string{"adminID": "admin", "adminKey": "AQB=="}, "admin", ""},
		{map[string]string{"userID": "u", "userKey": "AQB==", "adminID": "admin", "adminKey": "AQC=="}, "u", ""},
		{map[string]string{"adminID": "admin"}, "", "adminKey"},
		{map[string]string{"userKey": "AQB=="}, "", "userID"},
	} {
		cred, err := c.credentialsFor(backend.WithSecrets(context.Background(), tt.secrets), "c")
		if tt.missing != "" {
			testutil.WantKind(t, err, errdefs.ErrInvalidArgument, tt.missing)
			continue
		}
		if err != nil || cred.user != tt.user {
			t.Errorf("credentialsFor(%v) = %+v, %v", tt.secrets, cred, err)
			continue
		}
		cred.cleanup()
	}
}

// TestCredentialsFallBackToTheOwnIdentityOnlyForTheOwnCluster: without
// secrets, a call to the instance's own cluster uses its configured
// identity; a call to another cluster of the map, or a request whose
// secrets must be the only credentials (adopt), never does.
func TestCredentialsFallBackToTheOwnIdentityOnlyForTheOwnCluster(t *testing.T) {
	c := &cluster{cfg: Config{ClusterID: "own", Pool: "p", UserID: "spindle", KeyFile: "/etc/spindle/key"}.withDefaults()}
	ctx := context.Background()
	cred, err := c.credentialsFor(ctx, "own")
	if err != nil || cred.user != "spindle" || cred.keyFile != "/etc/spindle/key" {
		t.Fatalf("own cluster without secrets: %+v, %v; want the configured identity", cred, err)
	}
	_, err = c.credentialsFor(ctx, "rook-ceph")
	testutil.WantKind(t, err, errdefs.ErrPrecondition, "no cephx credentials for cluster rook-ceph", "own cluster own only")
	for _, secrets := range []map[string]string{{"x": "y"}, {"encryptionPassphrase": "z"}} {
		_, err = c.credentialsFor(backend.WithSecretsOnly(ctx, secrets), "own")
		testutil.WantKind(t, err, errdefs.ErrInvalidArgument, "name no cephx identity", "userID", "adminID")
	}
	cred, err = c.credentialsFor(backend.WithSecretsOnly(ctx, map[string]string{"userID": "csi-rbd-provisioner", "userKey": "AQB=="}), "rook-ceph")
	if err != nil || cred.user != "csi-rbd-provisioner" || cred.keyFile == "/etc/spindle/key" {
		t.Fatalf("secrets only, a complete pair: %+v, %v", cred, err)
	}
	cred.cleanup()
}

// TestRookExampleClasses: Rook's example StorageClass and
// VolumeSnapshotClass (testdata, only the provisioner changed) are taken
// as they are, with ceph-csi's meaning: Rook's cluster and pool, layering.
func TestRookExampleClasses(t *testing.T) {
	s := paramStore(t, rookClusterMap)
	read := func(file string) map[string]string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join("testdata", file))
		if err != nil {
			t.Fatal(err)
		}
		var class struct {
			Provisioner, Driver string
			Parameters          map[string]string
		}
		if err := yaml.Unmarshal(b, &class); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if class.Provisioner+class.Driver != "spindle.csi.dev" || len(class.Parameters) == 0 {
			t.Fatalf("%s: provisioner %q, driver %q, %d parameters", file, class.Provisioner, class.Driver, len(class.Parameters))
		}
		return class.Parameters
	}
	sc := read("rook-storageclass.yaml")
	if !s.Claims(sc) {
		t.Fatalf("the store does not claim Rook's StorageClass (clusterID %q)", sc["clusterID"])
	}
	o, err := s.volumeOptionsOf(sc)
	if err != nil {
		t.Fatalf("Rook's StorageClass: %v", err)
	}
	if o.loc != (location{cluster: "rook-ceph", pool: "replicapool"}) || o.features != "layering" || o.mounter != MounterKRBD {
		t.Fatalf("Rook's StorageClass gives %+v", o)
	}
	vsc := read("rook-snapshotclass.yaml")
	source := location{cluster: "rook-ceph", pool: "replicapool"}.ref("csi-vol-0123456789abcdef0123456789abcdef")
	if so, err := s.snapshotOptionsOf(source, vsc); err != nil || so.prefix != snapPrefix {
		t.Fatalf("Rook's VolumeSnapshotClass: %+v, %v", so, err)
	}
}

// TestMapOptionsPerMounter: ceph-csi's "krbd:…;nbd:…" form with an empty
// item (a trailing ';') is taken as ceph-csi takes it, and the instance's
// own map options (written for its mounter) never reach another mounter.
func TestMapOptionsPerMounter(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want map[string]string
	}{
		{"krbd:lock_on_read;", map[string]string{MounterKRBD: "lock_on_read"}},
		{";nbd:try-netlink;;", map[string]string{MounterNBD: "try-netlink"}},
		{"lock_on_read,queue_depth=128", map[string]string{MounterKRBD: "lock_on_read,queue_depth=128"}},
	} {
		got, err := parseMounterOptions(tt.in)
		if err != nil || !maps.Equal(got, tt.want) {
			t.Errorf("parseMounterOptions(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	if _, err := parseMounterOptions("krbd:a;krbd:b"); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("krbd named twice: %v", err)
	}

	s := paramStore(t, rookClusterMap)
	s.cfg.MapOptions = "lock_on_read" // the instance's, for krbd
	s.c.cfg = s.cfg
	for _, tt := range []struct {
		attrs map[string]string
		want  string
	}{
		{map[string]string{}, "lock_on_read"},
		{map[string]string{"mounter": "rbd-nbd"}, ""},
		{map[string]string{"mounter": "rbd-nbd", "mapOptions": "nbd:try-netlink"}, "try-netlink"},
		{map[string]string{"mapOptions": "krbd:noshare;"}, "noshare"},
	} {
		pc, err := s.StaticPublishContext("replicapool/static-image", tt.attrs)
		if err != nil || pc[ContextMapOptions] != tt.want {
			t.Errorf("StaticPublishContext(%v): map options %q, %v; want %q", tt.attrs, pc[ContextMapOptions], err, tt.want)
		}
		img := &backend.Image{Parameters: tt.attrs}
		if _, mapOpts, _ := s.mapSettings(img, nil); mapOpts != tt.want {
			t.Errorf("mapSettings(%v): map options %q; want %q", tt.attrs, mapOpts, tt.want)
		}
	}
}
