// Package rbd is Spindle's Ceph RBD backend: images in the pools of the
// Ceph clusters an instance serves (store.go, snapshot.go, cow.go,
// trash.go), published by recording the node in the image's metadata
// (export.go), and mapped on the node with krbd, rbd-nbd, or a FUSE file
// served by qemu-storage-daemon with a loop device (attach.go, kernel.go,
// fuse.go).
//
// Every call the store makes goes through internal/ceph's typed client
// (librados and librbd, one connection per cluster and identity; the key
// of the request, CSI secrets userID / userKey, stays in memory). Only
// what maps an image runs a program on the node (rbd device map, rbd-nbd,
// qemu-storage-daemon), which reads the key from a 0600 file that lives
// for the one call (ceph.go).
package rbd

import (
	"path/filepath"
	"sync"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/command"
)

func init() {
	backend.Register(backend.Kind[Config]{Type: Type, Validate: Config.Validate, New: New})
}

// New builds the instance named name from a validated Config, reaching
// its clusters through the process's one Ceph client (internal/ceph). Its
// node side holds a mapper of each kind: a volume is mapped with the
// mounter its parameters name, else the instance's.
func New(name string, cfg Config, run *command.Runner) (*backend.Instance, error) {
	return NewWithDialer(name, cfg, run, dialer())
}

// dialer is the process's Ceph client: one connection per cluster and
// identity, shared by every instance.
var dialer = sync.OnceValue(ceph.NewDialer)

// NewWithDialer is New with the Ceph client d (a fake cluster's, in
// tests).
func NewWithDialer(name string, cfg Config, run *command.Runner, d ceph.Dialer) (*backend.Instance, error) {
	cfg = cfg.withDefaults()
	c := newCluster(cfg, run, d)
	removeStaleKeyDirs(c.keyRoot, time.Now())
	return newInstance(name, c, map[string]mapper{
		MounterKRBD: &kernelMapper{c: c, sysRoot: "/sys", procRoot: "/proc"},
		MounterNBD:  &kernelMapper{c: c, nbd: true, sysRoot: "/sys", procRoot: "/proc"},
		MounterFuse: &fuseMapper{c: c, loops: blockdev.NewLosetup(run), dir: filepath.Join(cfg.FuseDir, name),
			state: filepath.Join(cfg.StateDir, name, "qsd"), sysRoot: "/sys", procRoot: "/proc"},
	}), nil
}

// newCluster is the instance's cluster client. Its per-call key files go
// where the programs run by run.Daemons() read them too: the attach
// daemon's directory when the node plugin has one.
func newCluster(cfg Config, run *command.Runner, d ceph.Dialer) *cluster {
	c := &cluster{cfg: cfg, dialer: d, run: run, keyRoot: run.DaemonsDir()}
	if cfg.MaxConcurrentCalls > 0 {
		c.slots = make(chan struct{}, cfg.MaxConcurrentCalls)
	}
	return c
}

func newInstance(name string, c *cluster, mappers map[string]mapper) *backend.Instance {
	s := &Store{c: c, cfg: c.cfg, key: Type + "/" + name}
	s.transport = &transport{s: s, mappers: mappers}
	return &backend.Instance{
		Type:  Type,
		Name:  name,
		Store: s,
		// An RBD image holds one filesystem that one kernel caches:
		// writable from one node, shared read-only. (Multi-node writers
		// need a cluster filesystem; block-mode multi-writer is left out
		// until a user needs it.)
		Exporter: &backend.GrantExporter{
			Backend: Type, Instance: s.key, OneWriterReason: "an image is written from one node at a time",
			Ledger: ledger{s}, Hooks: exportHooks{s: s},
		},
		Attacher:  &backend.TransportAttacher{Source: source{s}, Transport: s.transport},
		Snapshots: s,
	}
}

// ImageIDFor is the image ID (the part of the volume ID after
// "rbd/<instance>/") of the volume with that CSI name in pool of the
// instance's own cluster, made without parameters.
func ImageIDFor(pool, csiName string) string { return pool + "/" + hashedName(volumePrefix, csiName) }
