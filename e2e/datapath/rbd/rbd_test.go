//go:build cgo && ceph

// Package rbd measures the RBD backend's data path (e2e/datapath): an ext4
// volume on an RBD image of a real Ceph cluster (internal/backend/rbd/rbdtest),
// mapped by the mounter the environment selects (rbd-fuse here; krbd and
// rbd-nbd in `make vmtest`'s guest), against the same fio jobs on an image
// of the same pool through librbd (fio's rbd engine): the cluster's own
// speed, without a mapping, a block device or a filesystem.
package rbd

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/spindle-csi/spindle/e2e/datapath"
	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/lifecycle"
	"github.com/spindle-csi/spindle/internal/backend/rbd/rbdtest"
)

// TestMain starts a Ceph cluster only when benchmarks were asked for: the
// package has no tests, and `make test` must not pay for a cluster here.
// The cluster's memory-backed OSD gets room for both sides' data (the
// volume's file and the backing image, 1 GiB each by default): a full OSD
// blocks every write, and with it the volume's unmount.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run())
	}
	if os.Getenv("OSD_BYTES") == "" {
		_ = os.Setenv("OSD_BYTES", strconv.FormatInt(6<<30, 10)) // hack/ceph-up.sh
	}
	os.Exit(rbdtest.Main(m))
}

// BenchmarkDataPathRBD measures the mounter once, whatever b.N is: its
// runs and medians are its own (datapath.Compare).
func BenchmarkDataPathRBD(b *testing.B) {
	datapath.Require(b)
	s := datapath.SettingsFromEnv(b)
	cl := rbdtest.Require(b)
	ctx := context.Background()
	b.Cleanup(func() {
		if err := cl.Wipe(ctx); err != nil {
			b.Errorf("empty the pool: %v", err)
		}
	})
	drv := harness.Start(b, harness.Options{Config: cl.DriverConfig(filepath.Join(harness.TempDir(b), "fuse"))})
	c := lifecycle.NewClient(drv, nil)
	c.Secrets = cl.Secrets()
	mounted := datapath.Published(b, drv, c, "datapath", s, nil)

	const backingImage = "datapath-backing"
	if out, err := cl.RBD(ctx, "create", "--size", fmt.Sprintf("%dM", s.SizeBytes>>20), cl.Pool+"/"+backingImage); err != nil {
		b.Fatalf("rbd create: %v: %s", err, out)
	}
	backing := datapath.Side{
		Name: "backing",
		Args: []string{"--ioengine=rbd", "--clientname=" + cl.User, "--pool=" + cl.Pool, "--rbdname=" + backingImage},
		Env:  []string{"CEPH_CONF=" + cl.Conf},
	}
	if err := datapath.Fill(ctx, s, backing); err != nil {
		b.Fatal(err)
	}
	datapath.Compare(b, "rbd/"+cl.Mounter, s, datapath.FileSide("volume", mounted), backing)
	datapath.CompareEncrypted(b, "rbd/"+cl.Mounter, s, drv, c, mounted)
}
