// Package rbd is Spindle's Ceph RBD backend: images in one pool of a Ceph
// cluster, managed with the rbd CLI (store.go, snapshot.go), published by
// recording the node in the image's metadata (export.go), and mapped on
// the node with krbd, rbd-nbd or rbd-fuse + a loop device (attach.go,
// kernel.go, fuse.go).
//
// Every call to the cluster runs the rbd or ceph CLI through
// internal/command with a deadline and JSON output; the cephx key of the
// request (CSI secrets userID / userKey) reaches it in a 0600 key file
// that lives for the one call (ceph.go).
package rbd

import (
	"path/filepath"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/command"
)

func init() {
	backend.Register(backend.Kind[Config]{Type: Type, Validate: Config.Validate, New: New})
}

// New builds the instance named name from a validated Config.
func New(name string, cfg Config, run *command.Runner) (*backend.Instance, error) {
	cfg = cfg.withDefaults()
	c := &cluster{cfg: cfg, run: run}
	removeStaleKeyDirs(c.keyRoot, time.Now())
	var m mapper
	switch cfg.Mounter {
	case MounterFuse:
		m = &fuseMapper{c: c, loops: blockdev.NewLosetup(run), dir: filepath.Join(cfg.FuseDir, name, cfg.Pool), sysRoot: "/sys", procRoot: "/proc"}
	default:
		m = &kernelMapper{c: c, nbd: cfg.Mounter == MounterNBD, sysRoot: "/sys"}
	}
	return newInstance(name, c, m), nil
}

func newInstance(name string, c *cluster, m mapper) *backend.Instance {
	s := &Store{c: c, cfg: c.cfg, key: Type + "/" + name}
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
		Attacher:  &backend.TransportAttacher{Source: source{s}, Transport: &transport{s: s, m: m}},
		Snapshots: s,
	}
}

// ImageIDFor is the image ID (the part of the volume ID after
// "rbd/<instance>/") of the volume with that CSI name in pool.
func ImageIDFor(pool, csiName string) string { return pool + "/" + hashedName(volumePrefix, csiName) }
