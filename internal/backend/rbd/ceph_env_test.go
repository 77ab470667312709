//go:build cgo && ceph

package rbd_test

import (
	"context"
	"os"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend/rbd/rbdtest"
	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/ceph/cephtest"
)

// Built with -tags ceph (inside a Ceph root: `make test` runs it so), the
// package's tests start a real cluster, and the store's cases run on it
// too, through the real client.
func TestMain(m *testing.M) { os.Exit(rbdtest.Main(m)) }

func init() {
	dialer := ceph.NewDialer()
	realCluster = func(t *testing.T) *testCluster {
		cl := rbdtest.Require(t)
		direct, err := dialer.Dial(context.Background(), cl.Target())
		if err != nil {
			t.Fatal(err)
		}
		return &testCluster{
			name: "ceph", dialer: dialer, monitors: []string{"v2:" + cl.Monitor}, pool: cl.Pool,
			user: cl.User, key: cl.Key, keyFile: cl.KeyFile,
			admin: cl.Env(dialer).Admin, direct: direct, data: cl,
			everything: cl.Everything,
			copyImage: func(ctx context.Context, src ceph.ImageSpec, snap string, dst ceph.ImageSpec) error {
				_, err := cl.RBD(ctx, "cp", "--no-progress", src.At(snap), dst.String())
				return err
			},
		}
	}
	wipe = func(t *testing.T, c *testCluster) {
		t.Helper()
		cl := rbdtest.Require(t)
		empty := func() {
			if err := cl.Wipe(context.Background()); err != nil {
				t.Fatalf("empty pool %s: %v", cl.Pool, err)
			}
		}
		empty()
		t.Cleanup(empty)
	}
	_ = cephtest.Pool
}
