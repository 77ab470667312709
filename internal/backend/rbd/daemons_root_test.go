//go:build root

package rbd

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
	"golang.org/x/sys/unix"
)

// NodeUnstage of a volume of an earlier version's rbd-fuse mount whose
// loop device the device list did not find (bound through a replaced node
// plugin's mount while rbd-fuse answered ENOENT): the detach must not report
// the volume released while its rbd-fuse mount, and with it the image's
// watch, stays. A mount something holds is refused; once nothing holds
// it, the detach unmounts it. A real mount (tmpfs) stands in for
// rbd-fuse's, so that umount(2) answers EBUSY as it would.
func TestDetachReleasesALeftoverFuseMount(t *testing.T) {
	testutil.RequireRoot(t, "mount a filesystem where the rbd-fuse mount would be")
	fuseDir, proc := t.TempDir(), t.TempDir()
	r := location{cluster: "c", pool: "kube"}.ref(testImage)
	dir := filepath.Join(fuseDir, "kube", testImage)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount tmpfs at %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	// The mapper reads its mount table from procRoot: there the mount is
	// rbd-fuse's.
	line := "901 29 0:77 / " + dir + " rw,nosuid,nodev,relatime shared:512 - fuse.rbd-fuse rbd-fuse rw,user_id=0,group_id=0\n"
	if err := os.MkdirAll(filepath.Join(proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "self", "mountinfo"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	// What a loop device bound to the image's file does to the mount.
	holder, err := os.Create(filepath.Join(dir, testImage))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()

	cfg := Config{ClusterID: "c", Monitors: []string{"10.0.0.1:3300"}, Pool: "kube", Mounter: MounterFuse}.withDefaults()
	f := &fuseMapper{c: newCluster(cfg, command.New(commandtest.New(t), nil), nil), loops: blockdev.NewFakeLoopDevices(), dir: fuseDir, state: t.TempDir(), sysRoot: t.TempDir(), procRoot: proc, retryPause: time.Millisecond}
	a := &backend.TransportAttacher{Transport: &transport{s: &Store{cfg: cfg}, mappers: map[string]mapper{MounterFuse: f}}}
	volumeID := r.idOf(cfg.ClusterID)

	err = a.Detach(context.Background(), volumeID, "")
	testutil.WantKind(t, err, errdefs.ErrPrecondition, dir, "still in use")
	if !mountedHere(t, dir) {
		t.Fatalf("the refused detach unmounted %s", dir)
	}

	holder.Close()
	if err := a.Detach(context.Background(), volumeID, ""); err != nil {
		t.Fatalf("Detach once nothing holds the mount: %v", err)
	}
	if mountedHere(t, dir) {
		t.Errorf("%s is still mounted after the detach", dir)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the mount point %s is left behind: %v", dir, err)
	}
}
