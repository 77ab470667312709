package rbd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
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

// attachDaemon is the attach daemon as a node plugin's runner sees it: a
// directory both see, and its health.
type attachDaemon struct {
	dir     string
	err     error
	checked []string
}

func (a *attachDaemon) Check(_ context.Context, programs ...string) error {
	a.checked = append(a.checked, programs...)
	return a.err
}
func (a *attachDaemon) Dir() string { return a.dir }

// withAttachDaemon is a runner whose commands run from local and whose
// daemons' commands run from remote, in an attach daemon.
func withAttachDaemon(t *testing.T, local, remote *commandtest.Script) (*command.Runner, *attachDaemon) {
	d := &attachDaemon{dir: t.TempDir()}
	return command.New(local, nil).WithDaemons(command.New(remote, nil), d), d
}

// rbd-nbd map runs in the attach daemon, as "rbd device map -t nbd" would
// run it (its -o options as --options); nothing runs in the node plugin.
func TestNBDMapRunsInTheAttachDaemon(t *testing.T) {
	remote := commandtest.New(t,
		commandtest.Expect("rbd-nbd", with("map", "kube/"+testImage, "--read-only", "--try-netlink", "--timeout=120")...).Prints("/dev/nbd3\n"))
	run, _ := withAttachDaemon(t, commandtest.New(t), remote)
	cfg := Config{ClusterID: "c", Monitors: []string{"10.0.0.1:3300"}, Pool: "kube", UserID: "csi", KeyFile: "/etc/spindle/ceph.key", Mounter: MounterNBD}.withDefaults()
	m := &kernelMapper{c: newCluster(cfg, run), nbd: true, sysRoot: t.TempDir()}
	dev, err := m.Map(context.Background(), location{cluster: "c", pool: "kube"}.ref(testImage), true, "try-netlink,timeout=120")
	if err != nil || dev != "/dev/nbd3" {
		t.Fatalf("Map = %q, %v; want /dev/nbd3", dev, err)
	}
}

// rbd-fuse runs in the attach daemon. The request's key is in a 0600 file
// below the directory both see while rbd-fuse starts (it reads it when it
// connects, after it daemonized) and gone once the map is done; the loop
// device binds the image's file.
func TestFuseMountRunsInTheAttachDaemon(t *testing.T) {
	const key = "AQBsecretsecretsecretsecretsecretsecret=="
	fuseDir, proc := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	mountinfo := filepath.Join(proc, "self", "mountinfo")
	if err := os.WriteFile(mountinfo, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(fuseDir, "kube", testImage)
	daemon := &attachDaemon{dir: t.TempDir()}
	remote := commandtest.New(t,
		commandtest.Expect("rbd-fuse", "-c", "/dev/null", "-p", "kube", "-r", testImage, dir, "-o", "attr_timeout=0,entry_timeout=0").Does(func() {
			files, _ := filepath.Glob(filepath.Join(daemon.dir, keyDirPrefix+"*", "key"))
			if len(files) != 1 {
				t.Errorf("key files in the attach daemon's directory while rbd-fuse starts: %v, want one", files)
			}
			for _, f := range files {
				st, err := os.Stat(f)
				got, _ := os.ReadFile(f)
				if err != nil || st.Mode().Perm() != 0o600 || string(got) != key {
					t.Errorf("key file %s: %v, %v; want mode 0600 and the request's key", f, st, err)
				}
			}
			// What rbd-fuse does: mount, show the image's file.
			line := "901 29 0:77 / " + dir + " rw,nosuid,nodev,relatime shared:512 - fuse.rbd-fuse rbd-fuse rw,user_id=0,group_id=0\n"
			if err := os.WriteFile(mountinfo, []byte(line), 0o644); err != nil {
				t.Error(err)
			}
			if err := os.WriteFile(filepath.Join(dir, testImage), make([]byte, 4096), 0o600); err != nil {
				t.Error(err)
			}
		}))
	run := command.New(commandtest.New(t), nil).WithDaemons(command.New(remote, nil), daemon)
	cfg := Config{ClusterID: "c", Monitors: []string{"10.0.0.1:3300"}, Pool: "kube", Mounter: MounterFuse}.withDefaults()
	loops := blockdev.NewFakeLoopDevices()
	f := &fuseMapper{c: newCluster(cfg, run), loops: loops, dir: fuseDir, sysRoot: t.TempDir(), procRoot: proc, retryPause: time.Millisecond}
	ctx := backend.WithSecrets(context.Background(), map[string]string{SecretUserID: "csi", SecretUserKey: key})

	dev, err := f.Map(ctx, location{cluster: "c", pool: "kube"}.ref(testImage), false, "")
	if err != nil {
		t.Fatalf("Map: %v", err)
	}
	if d := loops.Devices[dev]; d == nil || d.BackingFile != filepath.Join(dir, testImage) {
		t.Fatalf("Map = %s bound to %+v; want the image's rbd-fuse file", dev, d)
	}
	if left, _ := filepath.Glob(filepath.Join(daemon.dir, keyDirPrefix+"*")); len(left) != 0 {
		t.Errorf("key directories left in the attach daemon's directory: %v", left)
	}

	// The node plugin's container restarts (rbd-fuse runs on in the attach
	// daemon): sysfs now shows the device's file from the root of the
	// mount the old container saw, "/<image>". It is still the image's.
	loops.ShowFromGoneMount(dev)
	m, err := f.Identify(ctx, dev)
	if err != nil || m.Device != dev || m.Pool != "kube" || m.Image != testImage {
		t.Fatalf("Identify(%s) after a restart = %+v, %v; want image kube/%s", dev, m, err, testImage)
	}
	r := location{cluster: "c", pool: "kube"}.ref(testImage)
	if got, err := f.Mapped(ctx, r); err != nil || len(got) != 1 || got[0].Device != dev {
		t.Fatalf("Mapped after a restart = %+v, %v; want %s", got, err, dev)
	}
	// rbd-fuse answers a stat of its file with ENOENT while it cannot
	// open the image (a loaded cluster): asked again, it answers.
	loops.Unanswered = map[string]int{dev: 2}
	if m, err := f.Identify(ctx, dev); err != nil || m.Image != testImage {
		t.Fatalf("Identify(%s) while rbd-fuse answered ENOENT twice = %+v, %v; want image kube/%s", dev, m, err, testImage)
	}
	loops.Unanswered = map[string]int{dev: goneMountTries}
	if m, err := f.Identify(ctx, dev); errdefs.KindOf(err) != errdefs.ErrNotFound {
		t.Fatalf("Identify(%s) while rbd-fuse never answered = %+v, %v; want NotFound", dev, m, err)
	}
	// A lookup rbd-fuse answered with ENOENT (it could not open the image)
	// makes the kernel show the device's file "(deleted)", from the gone
	// mount or from its own path: it is still the image's, by device and
	// inode, and Mapped finds it.
	loops.ShowDeleted(dev)
	if m, err := f.Identify(ctx, dev); err != nil || m.Image != testImage {
		t.Fatalf("Identify(%s) shown \"/%s (deleted)\" = %+v, %v; want image kube/%s", dev, testImage, m, err, testImage)
	}
	// NodeUnstage finds it so too, though rbd-fuse answers ENOENT twice
	// more: taken for unmapped, the device and its mount were left behind.
	loops.Unanswered = map[string]int{dev: 2}
	if got, err := f.Mapped(ctx, r); err != nil || len(got) != 1 || got[0].Device != dev {
		t.Fatalf("Mapped shown \"/%s (deleted)\" while rbd-fuse answered ENOENT twice = %+v, %v; want %s", testImage, got, err, dev)
	}
	loops.Devices[dev].BackingFile = filepath.Join(dir, testImage)
	delete(loops.Shown, dev)
	loops.ShowDeleted(dev)
	if m, err := f.Identify(ctx, dev); err != nil || m.Image != testImage {
		t.Fatalf("Identify(%s) shown \"%s (deleted)\" = %+v, %v; want image kube/%s", dev, filepath.Join(dir, testImage), m, err, testImage)
	}
	if got, err := f.Mapped(ctx, r); err != nil || len(got) != 1 || got[0].Device != dev {
		t.Fatalf("Mapped with the file shown deleted = %+v, %v; want %s", got, err, dev)
	}
	// Another image's name is not enough: the file must be the device's.
	other := location{cluster: "c", pool: "kube"}.ref("csi-vol-ffffffffffffffffffffffffffffffff")
	if got, err := f.Mapped(ctx, other); err != nil || len(got) != 0 {
		t.Errorf("Mapped(%s) = %+v, %v; want nothing", other.image, got, err)
	}
}

// The attach daemon the node plugin is configured with does not answer: the
// modes whose daemons it starts are not usable, and the probe says why.
func TestProbeAsksTheAttachDaemon(t *testing.T) {
	for _, mounter := range []string{MounterNBD, MounterFuse} {
		t.Run(mounter, func(t *testing.T) {
			run, daemon := withAttachDaemon(t, commandtest.New(t), commandtest.New(t))
			daemon.err = errors.New("the attach daemon at /run/spindle/attachd/attachd.sock does not answer")
			cfg := Config{ClusterID: "c", Monitors: []string{"10.0.0.1:3300"}, Pool: "kube", Mounter: mounter}.withDefaults()
			sys := t.TempDir()
			if err := os.MkdirAll(filepath.Join(sys, "module", "nbd"), 0o755); err != nil {
				t.Fatal(err)
			}
			var m mapper = &kernelMapper{c: newCluster(cfg, run), nbd: true, sysRoot: sys}
			if mounter == MounterFuse {
				if _, err := os.Stat("/dev/fuse"); err != nil {
					t.Skip("/dev/fuse is missing here; the probe stops at it")
				}
				m = &fuseMapper{c: newCluster(cfg, run), loops: blockdev.NewFakeLoopDevices(), dir: t.TempDir(), sysRoot: sys, procRoot: "/proc"}
			}
			err := m.Available(context.Background())
			testutil.WantKind(t, err, errdefs.ErrPrecondition, mounter, "does not answer")
			if len(daemon.checked) != 1 || daemon.checked[0] != mounter {
				t.Errorf("the probe asked the attach daemon about %v, want [%s]", daemon.checked, mounter)
			}
			if !strings.Contains(err.Error(), "/run/spindle/attachd/attachd.sock") {
				t.Errorf("the probe's error %q does not name the daemon's socket", err)
			}
		})
	}
}

// NodeUnstage of an rbd-fuse volume whose loop device the device list did
// not find (bound through a replaced node plugin's mount while rbd-fuse
// answered ENOENT, run G in docs/testing.md): the detach must not report
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
	f := &fuseMapper{c: newCluster(cfg, command.New(commandtest.New(t), nil)), loops: blockdev.NewFakeLoopDevices(), dir: fuseDir, sysRoot: t.TempDir(), procRoot: proc, retryPause: time.Millisecond}
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

// mountedHere reports whether dir is a mount point in this process's mount
// table.
func mountedHere(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if fields := strings.Fields(l); len(fields) > 4 && fields[4] == dir {
			return true
		}
	}
	return false
}
