//go:build cgo && ceph

package rbd_test

import (
	"context"
	"os"
	"testing"

	utilexec "k8s.io/utils/exec"

	"github.com/spindle-csi/spindle/internal/backend/rbd"
	"github.com/spindle-csi/spindle/internal/backend/rbd/rbdtest"
	"github.com/spindle-csi/spindle/internal/command"
)

// On a real kernel that has the mounter's module but has not loaded it
// (a node before its first map; `make vmtest` runs this first after the
// guest boots), the node's probe loads it and answers ready.
func TestProbeLoadsTheModuleOnARealKernel(t *testing.T) {
	cl := rbdtest.Require(t)
	present := map[string]string{rbd.MounterKRBD: "/sys/bus/rbd", rbd.MounterNBD: "/sys/module/nbd"}[cl.Mounter]
	if present == "" {
		t.Skipf("the %s mounter needs no kernel module (%s selects krbd or rbd-nbd)", cl.Mounter, rbdtest.EnvMounter)
	}
	if _, err := os.Stat(present); err == nil {
		t.Skipf("%s exists: the module is loaded already, so this node cannot show the probe loading it (run it first after boot)", present)
	}
	inst, err := rbd.New("probe", rbd.Config{
		ClusterID: "test", Monitors: []string{"v2:" + cl.Monitor}, Pool: cl.Pool, Mounter: cl.Mounter,
		FuseDir: t.TempDir(), StateDir: t.TempDir(), UserID: cl.User, KeyFile: cl.KeyFile,
	}, command.New(utilexec.New(), nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Attacher.Probe(context.Background()); err != nil {
		t.Fatalf("Probe on a node that has not loaded the module: %v", err)
	}
	if _, err := os.Stat(present); err != nil {
		t.Errorf("Probe answered ready, but %s is still missing: %v", present, err)
	}
}
