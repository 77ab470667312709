package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend/iscsi"
	"github.com/spindle-csi/spindle/internal/backend/loop"
	"github.com/spindle-csi/spindle/internal/backend/rbd"
)

// loopOf is the loop section of b, or nil.
func loopOf(b BackendConfig) *loop.Config {
	if b.Section == nil {
		return nil
	}
	c, _ := b.Section.Settings().(*loop.Config)
	return c
}

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadFileValid(t *testing.T) {
	path := writeConfig(t, `
defaultBackend: loop/fast
backends:
  - type: loop
    name: default
    loop:
      poolDir: /var/lib/spindle/pools/default
  - type: loop
    name: fast
    loop:
      poolDir: /mnt/nvme/spindle
      maxProvisionedBytes: 107374182400
`)
	f, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Backends) != 2 {
		t.Fatalf("backends = %+v", f.Backends)
	}
	b := f.Backends[1]
	if b.Key() != "loop/fast" || loopOf(b) == nil || *loopOf(b) != (loop.Config{PoolDir: "/mnt/nvme/spindle", MaxProvisionedBytes: 100 << 30}) {
		t.Errorf("backends[1] = %+v (loop %+v)", b, loopOf(b))
	}
	if got := f.Default(); got != "loop/fast" {
		t.Errorf("Default() = %q, want loop/fast", got)
	}
}

func TestDefaultIsFirstBackendWithoutDefaultBackend(t *testing.T) {
	f, err := LoadFile(writeConfig(t, `
backends:
  - {type: loop, name: second, loop: {poolDir: /p2}}
  - {type: loop, name: first, loop: {poolDir: /p1}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Default(); got != "loop/second" {
		t.Errorf("Default() = %q, want the first listed backend loop/second", got)
	}
}

func TestLoadFileRejects(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    []string
	}{
		{
			name:    "unknown top-level key (typo)",
			content: "defaultBackand: loop/default\nbackends:\n  - {type: loop, name: default, loop: {poolDir: /p}}\n",
			want:    []string{"defaultBackand"},
		},
		{
			name:    "unknown key in a loop section",
			content: "backends:\n  - {type: loop, name: default, loop: {poolDir: /p, maxBytes: 10}}\n",
			want:    []string{"maxBytes"},
		},
		{
			name:    "duplicate key",
			content: "backends:\n  - type: loop\n    name: a\n    name: b\n    loop: {poolDir: /p}\n",
			want:    []string{"name"},
		},
		{
			name:    "duplicate backend",
			content: "backends:\n  - {type: loop, name: default, loop: {poolDir: /p}}\n  - {type: loop, name: default, loop: {poolDir: /q}}\n",
			want:    []string{"backends[1]", "loop/default is configured twice"},
		},
		{
			name:    "missing loop section",
			content: "backends:\n  - {type: loop, name: default}\n",
			want:    []string{"backends[0]", `needs its section "loop"`},
		},
		{
			name:    "relative pool dir",
			content: "backends:\n  - {type: loop, name: default, loop: {poolDir: pools/default}}\n",
			want:    []string{"backends[0].loop.poolDir", "pools/default", "absolute"},
		},
		{
			name:    "empty pool dir",
			content: "backends:\n  - {type: loop, name: default, loop: {}}\n",
			want:    []string{"backends[0].loop.poolDir", "absolute"},
		},
		{
			name:    "negative capacity",
			content: "backends:\n  - {type: loop, name: default, loop: {poolDir: /p, maxProvisionedBytes: -1}}\n",
			want:    []string{"backends[0].loop.maxProvisionedBytes", "negative"},
		},
		{
			name:    "default backend not configured",
			content: "defaultBackend: loop/nope\nbackends:\n  - {type: loop, name: default, loop: {poolDir: /p}}\n",
			want:    []string{`defaultBackend "loop/nope"`, "not one of the configured backends"},
		},
		{
			name:    "default backend names only the instance",
			content: "defaultBackend: default\nbackends:\n  - {type: loop, name: default, loop: {poolDir: /p}}\n",
			want:    []string{`defaultBackend "default"`},
		},
		{
			name:    "unknown backend type",
			content: "backends:\n  - {type: nfs, name: default}\n",
			want:    []string{`backends[0].type "nfs"`, "unknown backend type"},
		},
		{
			name:    "bad instance name",
			content: "backends:\n  - {type: loop, name: Default_1, loop: {poolDir: /p}}\n",
			want:    []string{"backends[0].name", "Default_1"},
		},
		{
			name:    "no backends",
			content: "backends: []\n",
			want:    []string{"no backends configured"},
		},
		{
			name:    "empty file",
			content: "",
			want:    []string{"no backends configured"},
		},
		{
			name:    "not YAML",
			content: "backends: [\n",
			want:    []string{"config "},
		},
		{
			// Each problem is listed, also two in the same backend.
			name: "every problem reported",
			content: "defaultBackend: loop/x\nbackends:\n  - {type: loop, name: a, loop: {poolDir: rel, maxProvisionedBytes: -5}}\n" +
				"  - {type: loop, name: B}\n  - {type: ceph, name: c}\n",
			want: []string{"backends[0].loop.poolDir", "backends[0].loop.maxProvisionedBytes", "backends[1].name", `backends[1]: type loop needs its section "loop"`,
				`backends[2].type "ceph"`, `defaultBackend "loop/x"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.content)
			f, err := LoadFile(path)
			if err == nil {
				t.Fatalf("LoadFile accepted it: %+v", f)
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name the file", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestLoadFileMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent.yaml")
	_, err := LoadFile(path)
	if err == nil || !strings.Contains(err.Error(), "read config") || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadFile(missing) = %v, want a read error", err)
	}
}

func TestDefaultFile(t *testing.T) {
	f, err := DefaultFile("/var/lib/spindle/pools/default")
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Default(); got != "loop/default" {
		t.Errorf("Default() = %q, want loop/default", got)
	}
	if len(f.Backends) != 1 || loopOf(f.Backends[0]) == nil || loopOf(f.Backends[0]).PoolDir != "/var/lib/spindle/pools/default" {
		t.Errorf("DefaultFile = %+v", f.Backends)
	}
	if _, err := DefaultFile("relative"); err == nil || !strings.Contains(err.Error(), "absolute") {
		t.Errorf("DefaultFile(relative) = %v, want an absolute-path error", err)
	}
}

func TestLoadFileISCSI(t *testing.T) {
	f, err := LoadFile(writeConfig(t, `
backends:
  - type: iscsi
    name: san
    iscsi:
      poolDir: /var/lib/spindle/pools/san
      portals: ["192.0.2.10:3260", "[2001:db8::1]:3260"]
      targetTool: lio
      targetPrefix: iqn.2026-01.dev.spindle
      initiatorPrefix: iqn.2026-01.dev.spindle.node
      attachMode: userspace
`))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := f.Backends[0].Section.Settings().(*iscsi.Config)
	if f.Backends[0].Key() != "iscsi/san" || c == nil || c.TargetTool != "lio" || len(c.Portals) != 2 || c.AttachMode != "userspace" {
		t.Fatalf("backends[0] = %+v (iscsi %+v)", f.Backends[0], c)
	}
}

// Every problem of an iscsi section is reported, each naming its field.
func TestLoadFileRejectsISCSI(t *testing.T) {
	path := writeConfig(t, `
backends:
  - type: iscsi
    name: a
    iscsi:
      poolDir: rel
      maxProvisionedBytes: -1
      portals: ["192.0.2.10", "host:99999"]
      targetTool: scst
      tgtControlSocket: tgtd.sock
      targetPrefix: iqn.2026-01.Dev.Spindle
      initiatorPrefix: "eui.1234:x"
      attachMode: magic
      stateDir: run/spindle
  - type: iscsi
    name: b
  - type: loop
    name: c
    loop: {poolDir: /p}
    iscsi: {poolDir: /q}
  - type: iscsi
    name: d
    iscsi: {poolDir: /p, portals: []}
`)
	_, err := LoadFile(path)
	if err == nil {
		t.Fatal("LoadFile accepted it")
	}
	for _, w := range []string{
		`backends[0].iscsi.poolDir "rel"`, "backends[0].iscsi.maxProvisionedBytes",
		`backends[0].iscsi.portals[0] "192.0.2.10"`, `backends[0].iscsi.portals[1] "host:99999"`,
		`backends[0].iscsi.targetTool "scst"`, `backends[0].iscsi.tgtControlSocket "tgtd.sock"`,
		`backends[0].iscsi.targetPrefix "iqn.2026-01.Dev.Spindle"`, `backends[0].iscsi.initiatorPrefix "eui.1234:x"`,
		`backends[0].iscsi.attachMode "magic"`, `backends[0].iscsi.stateDir "run/spindle"`,
		"backends[1]: type iscsi needs its section \"iscsi\"",
		`backends[2]: section "iscsi" does not belong to type "loop"`,
		"backends[3].iscsi.portals: at least one", "backends[3].iscsi.targetPrefix",
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not mention %q:\n%v", w, err)
		}
	}
}

func TestLoadFileRBD(t *testing.T) {
	path := writeConfig(t, `
backends:
  - type: rbd
    name: ceph-a
    rbd:
      clusterID: ceph-a
      monitors: ["10.0.0.1:3300", "v2:10.0.0.2:3300"]
      pool: kube
      mounter: rbd-fuse
      fencing: true
`)
	f, err := LoadFile(path)
	if err != nil {
		t.Fatalf("LoadFile: %v", err)
	}
	got := f.Backends[0]
	if c, _ := got.Section.Settings().(*rbd.Config); got.Key() != "rbd/ceph-a" || c == nil || c.Pool != "kube" || !c.Fencing || c.Mounter != "rbd-fuse" {
		t.Fatalf("backend = %+v (rbd %+v)", got, c)
	}
}

// Every problem of an rbd section is reported at once, each naming its field.
func TestLoadFileRejectsRBD(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    []string
	}{
		{"missing section", "backends:\n  - {type: rbd, name: a}\n", []string{"backends[0]", `needs its section "rbd"`}},
		{"unknown key", "backends:\n  - {type: rbd, name: a, rbd: {clusterID: c, pool: p, monitors: [m:1], keyring: /k}}\n", []string{"keyring"}},
		{"everything wrong", `backends:
  - type: rbd
    name: a
    rbd:
      clusterID: "bad id"
      pool: "p/q"
      monitors: ["a,b"]
      mounter: floppy
      mapOptions: "a b"
      maxCloneDepth: -1
      maxProvisionedBytes: -5
      userID: admin
      fuseDir: relative
`, []string{
			"backends[0].rbd.clusterID", "backends[0].rbd.pool", "backends[0].rbd.monitors[0]", "backends[0].rbd.mounter", "floppy",
			"backends[0].rbd.mapOptions", "backends[0].rbd.maxCloneDepth", "backends[0].rbd.maxProvisionedBytes",
			"userID and keyFile go together", "backends[0].rbd.fuseDir",
		}},
		{"no monitors", "backends:\n  - {type: rbd, name: a, rbd: {clusterID: c, pool: p}}\n", []string{"backends[0].rbd.monitors", "at least one"}},
		{"hard clone depth not above the soft one", "backends:\n  - {type: rbd, name: a, rbd: {clusterID: c, pool: p, monitors: [m:1], maxCloneDepth: 6, hardMaxCloneDepth: 5}}\n",
			[]string{"backends[0].rbd.hardMaxCloneDepth", "above maxCloneDepth (6)"}},
		{"hard clone depth beyond krbd's chain", "backends:\n  - {type: rbd, name: a, rbd: {clusterID: c, pool: p, monitors: [m:1], hardMaxCloneDepth: 16}}\n",
			[]string{"backends[0].rbd.hardMaxCloneDepth", "at most 15"}},
		{"negative Ceph client slots", "backends:\n  - {type: rbd, name: a, rbd: {clusterID: c, pool: p, monitors: [m:1], maxConcurrentCalls: -1}}\n",
			[]string{"backends[0].rbd.maxConcurrentCalls", "between 1 and 256"}},
		{"too many Ceph client slots", "backends:\n  - {type: rbd, name: a, rbd: {clusterID: c, pool: p, monitors: [m:1], maxConcurrentCalls: 257}}\n",
			[]string{"backends[0].rbd.maxConcurrentCalls", "between 1 and 256"}},
		{"section of another type", "backends:\n  - {type: loop, name: a, loop: {poolDir: /p}, rbd: {clusterID: c, pool: p, monitors: [m:1]}}\n", []string{"backends[0]", "does not belong to type"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadFile(writeConfig(t, tt.content))
			if err == nil {
				t.Fatal("LoadFile accepted it")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}
