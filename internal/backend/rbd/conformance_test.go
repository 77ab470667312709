//go:build cgo && ceph

package rbd_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	utilexec "k8s.io/utils/exec"

	"github.com/spindle-csi/spindle/internal/backend/conformance"
	"github.com/spindle-csi/spindle/internal/backend/rbd"
	"github.com/spindle-csi/spindle/internal/backend/rbd/rbdtest"
	"github.com/spindle-csi/spindle/internal/command"
)

// newFixture builds an instance on the test cluster's pool, mapping with
// the run's mounter: rbd-fuse + loop by default (the one mounter that runs
// on a node without the rbd and nbd kernel modules), krbd or rbd-nbd where
// rbdtest.EnvMounter selects them. The pool is emptied before and after
// each case.
func newFixture(t *testing.T, opts conformance.Options) *conformance.Fixture {
	cl := rbdtest.Require(t)
	wipe := func() {
		if err := cl.Wipe(context.Background()); err != nil {
			t.Fatalf("empty pool %s: %v", cl.Pool, err)
		}
	}
	wipe()
	t.Cleanup(wipe)
	fuseDir := filepath.Join(t.TempDir(), "fuse")
	inst, err := rbd.New("test", rbd.Config{
		ClusterID:           "test",
		Monitors:            []string{"v2:" + cl.Monitor},
		Pool:                cl.Pool,
		Mounter:             cl.Mounter,
		FuseDir:             fuseDir,
		StateDir:            filepath.Join(t.TempDir(), "state"),
		MaxProvisionedBytes: opts.CapacityBytes,
		UserID:              cl.User,
		KeyFile:             cl.KeyFile,
		NodeRegistry:        true,
	}, command.New(utilexec.New(), nil))
	if err != nil {
		t.Fatal(err)
	}
	return &conformance.Fixture{
		Instance:          inst,
		ImageID:           func(name string) string { return rbd.ImageIDFor(cl.Pool, name) },
		Artifacts:         cl.Artifacts,
		MutableParameters: map[string]string{rbd.MutableParamMapOptions: "noudev"},
		// The rbd store refuses keys it does not know (ceph-csi's are
		// its keys): one it takes that names nothing the image's ID
		// depends on.
		ExtraParameter: map[string]string{rbd.ParamImageFeatures: "layering"},
		Secrets:        cl.Secrets(),
		WriteImage: func(ctx context.Context, id string, off int64, data []byte) error {
			return cl.WriteImage(ctx, imageIn(t, cl, id), off, data)
		},
		ReadImage: func(ctx context.Context, id string, off int64, n int) ([]byte, error) {
			return cl.ReadImage(ctx, imageIn(t, cl, id), off, n)
		},
	}
}

func imageIn(t testing.TB, cl *rbdtest.Cluster, id string) string {
	image, ok := strings.CutPrefix(id, cl.Pool+"/")
	if !ok {
		t.Fatalf("image ID %q is not in pool %s", id, cl.Pool)
	}
	return image
}

func TestConformance(t *testing.T) {
	conformance.Run(t, newFixture)
}
