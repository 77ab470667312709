package rbd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
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
	m := &kernelMapper{c: newCluster(cfg, run, nil), nbd: true, sysRoot: t.TempDir()}
	dev, err := m.Map(context.Background(), location{cluster: "c", pool: "kube"}.ref(testImage), true, "try-netlink,timeout=120")
	if err != nil || dev != "/dev/nbd3" {
		t.Fatalf("Map = %q, %v; want /dev/nbd3", dev, err)
	}
}

// The rbd-fuse mounter's server, qemu-storage-daemon, runs in the attach
// daemon: its librbd reads the request's key from a 0600 file below the
// directory both see, which is gone once the map is done; the monitors
// come in a config of its own; the loop device binds the image's file.
// After a node plugin restart the device's file is shown from the gone
// mount ("/"), and it is still the image's, by device and inode.
func TestUserspaceMapRunsInTheAttachDaemon(t *testing.T) {
	const key = "AQBsecretsecretsecretsecretsecretsecret=="
	fuseDir, state := t.TempDir(), t.TempDir()
	r := location{cluster: "c", pool: "kube"}.ref(testImage)
	file := filepath.Join(fuseDir, "kube", testImage, testImage)
	daemon := &attachDaemon{dir: t.TempDir()}
	cfg := Config{ClusterID: "c", Monitors: []string{"10.0.0.1:3300"}, Pool: "kube", Mounter: MounterFuse}.withDefaults()
	loops := blockdev.NewFakeLoopDevices()
	var served bool
	proc := t.TempDir() // no rbd-fuse mount of an earlier version here
	if err := os.MkdirAll(filepath.Join(proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "self", "mountinfo"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	f := &fuseMapper{loops: loops, dir: fuseDir, state: state, sysRoot: t.TempDir(), procRoot: proc, retryPause: time.Millisecond,
		served: func(ref) (int, bool) {
			if served {
				return 4242, false
			}
			return 0, false
		}}
	stateDir := f.stateDir(r)
	remote := commandtest.New(t,
		commandtest.ExpectMatching("qemu-storage-daemon", func(args []string) error {
			want := []string{"--object", "secret,id=key,format=base64,file=KEY",
				"--blockdev", "driver=rbd,node-name=image,pool=kube,image=" + testImage + ",conf=" + stateDir + "/ceph.conf,user=csi,key-secret=key",
				"--export", "type=fuse,id=image,node-name=image,mountpoint=" + file + ",writable=on",
				"--chardev", "socket,id=qmp,server=on,wait=off,path=" + stateDir + "/qmp.sock",
				"--monitor", "chardev=qmp", "--pidfile", stateDir + "/qsd.pid", "--daemonize"}
			if len(args) != len(want) {
				return fmt.Errorf("%d arguments, want %d: %q", len(args), len(want), want)
			}
			keyFile, ok := strings.CutPrefix(args[1], "secret,id=key,format=base64,file=")
			if !ok || !strings.HasPrefix(keyFile, filepath.Join(daemon.dir, keyDirPrefix)) {
				return fmt.Errorf("the key is not in a file below the attach daemon's directory: %s", args[1])
			}
			args[1] = want[1]
			if !slices.Equal(args, want) {
				return fmt.Errorf("want %q", want)
			}
			st, err := os.Stat(keyFile)
			got, _ := os.ReadFile(keyFile)
			if err != nil || st.Mode().Perm() != 0o600 || string(got) != key {
				return fmt.Errorf("key file %s: %v, %v; want mode 0600 and the request's key", keyFile, st, err)
			}
			if conf, err := os.ReadFile(filepath.Join(stateDir, "ceph.conf")); err != nil || !strings.Contains(string(conf), "mon host = 10.0.0.1:3300") {
				return fmt.Errorf("the daemon's config %q (%v) does not name the monitors", conf, err)
			}
			if st, err := os.Stat(file); err != nil || !st.Mode().IsRegular() {
				return fmt.Errorf("the export's mount point %s is not a file: %v", file, err)
			}
			served = true
			return nil
		}))
	run := command.New(commandtest.New(t), nil).WithDaemons(command.New(remote, nil), daemon)
	f.c = newCluster(cfg, run, nil)
	ctx := backend.WithSecrets(context.Background(), map[string]string{SecretUserID: "csi", SecretUserKey: key})

	dev, err := f.Map(ctx, r, false, "")
	if err != nil {
		t.Fatalf("Map: %v", err)
	}
	if d := loops.Devices[dev]; d == nil || d.BackingFile != file || !slices.Contains(loops.Calls, "attach "+file+" ro=false direct-io=off") {
		t.Fatalf("Map = %s bound to %+v (%q); want the image's file, through the page cache", dev, d, loops.Calls)
	}
	if left, _ := filepath.Glob(filepath.Join(daemon.dir, keyDirPrefix+"*")); len(left) != 0 {
		t.Errorf("key directories left in the attach daemon's directory: %v", left)
	}
	// Mapped again (another stage of the same image): the daemon serves
	// it already; a second device, no second daemon.
	if _, err := f.Map(ctx, r, true, ""); err != nil {
		t.Fatalf("Map read-only beside it: %v", err)
	}
	if got, err := f.Mapped(ctx, r); err != nil || len(got) != 2 {
		t.Fatalf("Mapped = %+v, %v; want both devices", got, err)
	}

	// The node plugin's container restarts (the daemon runs on in the
	// attach daemon): sysfs shows the device's file from the root of the
	// gone mount, the FUSE export itself, "/".
	loops.ShowFromGoneMount(dev)
	loops.Devices[dev].BackingFile = "/"
	m, err := f.Identify(ctx, r, dev)
	if err != nil || m.Device != dev || m.Pool != "kube" || m.Image != testImage {
		t.Fatalf("Identify(%s) after a restart = %+v, %v; want image kube/%s", dev, m, err, testImage)
	}
	// Another image is not it.
	other := location{cluster: "c", pool: "kube"}.ref("csi-vol-ffffffffffffffffffffffffffffffff")
	if _, err := f.Identify(ctx, other, dev); errdefs.KindOf(err) != errdefs.ErrNotFound {
		t.Errorf("Identify(%s) as %s = %v; want NotFound", dev, other.image, err)
	}
	if got, err := f.Mapped(ctx, other); err != nil || len(got) != 0 {
		t.Errorf("Mapped(%s) = %+v, %v; want nothing", other.image, got, err)
	}
	// Nothing serves the file any more (the daemon died): not a device of
	// the image.
	served = false
	if _, err := f.Identify(ctx, r, dev); errdefs.KindOf(err) != errdefs.ErrNotFound {
		t.Errorf("Identify(%s) with no daemon = %v; want NotFound", dev, err)
	}
}

// A volume mapped by an earlier version, through rbd-fuse's own mount of
// the image's directory, is still identified (also shown "(deleted)" or
// from the gone mount while rbd-fuse answered ENOENT, asked again), and
// Mapped finds it, so that its unstage releases it.
func TestLegacyRBDFuseMountIsRecognised(t *testing.T) {
	fuseDir, proc := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(fuseDir, "kube", testImage)
	line := "901 29 0:77 / " + dir + " rw,nosuid,nodev,relatime shared:512 - fuse.rbd-fuse rbd-fuse rw,user_id=0,group_id=0\n"
	if err := os.WriteFile(filepath.Join(proc, "self", "mountinfo"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, testImage), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{ClusterID: "c", Monitors: []string{"10.0.0.1:3300"}, Pool: "kube", Mounter: MounterFuse}.withDefaults()
	loops := blockdev.NewFakeLoopDevices()
	f := &fuseMapper{c: newCluster(cfg, command.New(commandtest.New(t), nil), nil), loops: loops, dir: fuseDir, state: t.TempDir(),
		sysRoot: t.TempDir(), procRoot: proc, retryPause: time.Millisecond}
	ctx := context.Background()
	r := location{cluster: "c", pool: "kube"}.ref(testImage)
	// A stage of this version beside it binds the legacy mount's file.
	dev, err := f.Map(ctx, r, false, "")
	if err != nil {
		t.Fatalf("Map beside an rbd-fuse mount: %v", err)
	}
	if d := loops.Devices[dev]; d == nil || d.BackingFile != filepath.Join(dir, testImage) || !slices.Contains(loops.Calls, "attach "+filepath.Join(dir, testImage)+" ro=false") {
		t.Fatalf("Map = %s bound to %+v (%q); want rbd-fuse's file, with direct I/O as before", dev, d, loops.Calls)
	}
	loops.ShowFromGoneMount(dev)
	if m, err := f.Identify(ctx, r, dev); err != nil || m.Image != testImage {
		t.Fatalf("Identify(%s) after a restart = %+v, %v", dev, m, err)
	}
	loops.Unanswered = map[string]int{dev: 2}
	if m, err := f.Identify(ctx, r, dev); err != nil || m.Image != testImage {
		t.Fatalf("Identify(%s) while rbd-fuse answered ENOENT twice = %+v, %v", dev, m, err)
	}
	loops.Unanswered = map[string]int{dev: goneMountTries}
	if _, err := f.Identify(ctx, r, dev); errdefs.KindOf(err) != errdefs.ErrNotFound {
		t.Fatalf("Identify(%s) while rbd-fuse never answered = %v; want NotFound", dev, err)
	}
	loops.ShowDeleted(dev)
	loops.Unanswered = map[string]int{dev: 2}
	if got, err := f.Mapped(ctx, r); err != nil || len(got) != 1 || got[0].Device != dev {
		t.Fatalf("Mapped shown deleted while rbd-fuse answered ENOENT twice = %+v, %v; want %s", got, err, dev)
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
			var m mapper = &kernelMapper{c: newCluster(cfg, run, nil), nbd: true, sysRoot: sys}
			program := mounter
			if mounter == MounterFuse {
				if _, err := os.Stat("/dev/fuse"); err != nil {
					t.Skip("/dev/fuse is missing here; the probe stops at it")
				}
				m = &fuseMapper{c: newCluster(cfg, run, nil), loops: blockdev.NewFakeLoopDevices(), dir: t.TempDir(), state: t.TempDir(), sysRoot: sys, procRoot: "/proc"}
				program = "qemu-storage-daemon"
			}
			err := m.Available(context.Background())
			testutil.WantKind(t, err, errdefs.ErrPrecondition, mounter, "does not answer")
			if len(daemon.checked) != 1 || daemon.checked[0] != program {
				t.Errorf("the probe asked the attach daemon about %v, want [%s]", daemon.checked, program)
			}
			if !strings.Contains(err.Error(), "/run/spindle/attachd/attachd.sock") {
				t.Errorf("the probe's error %q does not name the daemon's socket", err)
			}
		})
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
