package rbd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	utilexec "k8s.io/utils/exec"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/ceph/cephfake"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// The real texts of "rbd device map" on a node without the rbd module,
// and of "rbd device map -t nbd" on one without nbd (Debian 12, Ceph 16.2.15,
// a container with no module loading).
const (
	krbdNoModule = `sh: 1: /sbin/modinfo: not found
sh: 1: /sbin/modprobe: not found
rbd: failed to load rbd kernel module (127)
rbd: sysfs write failed
In some cases useful info is found in syslog - try "dmesg | tail".
rbd: map failed: (2) No such file or directory`
	// rbd-nbd's own lines of "rbd device map -t nbd"'s text, which is
	// what rbd-nbd map prints there (exit status 1).
	nbdNoModule = `sh: 1: /sbin/modprobe: not found
rbd-nbd: failed to find unused device`
	krbdNotMapped = `rbd: '/dev/rbd0' is not a block device
rbd: unmap failed: (22) Invalid argument`
)

// noModule is kmod 30's modprobe (Debian 12) on a kernel built without the
// module.
func noModule(module string) string {
	return "modprobe: FATAL: Module " + module + " not found in directory /lib/modules/6.18.44-fc-v782"
}

// callArgs is what every node program of the test config ends with: the
// node's own identity (userID + keyFile), no secrets in argv.
var callArgs = []string{"-c", "/dev/null", "-m", "10.0.0.1:3300", "--id", "csi", "--keyfile", "/etc/spindle/ceph.key"}

func with(args ...string) []string { return append(args, callArgs...) }

// kernelInstance builds an instance on a fake cluster (with user csi,
// whose key is what /etc/spindle/ceph.key would hold), a scripted runner
// for the node's programs and a fake sysfs. The cluster has testImage,
// published to node-a.
func kernelInstance(t *testing.T, mounter string, script *commandtest.Script) (*backend.Instance, string, *cephfake.Cluster) {
	t.Helper()
	return kernelInstanceWithKey(t, mounter, script, testKey)
}

// kernelInstanceWithKey is kernelInstance with user csi's key.
func kernelInstanceWithKey(t *testing.T, mounter string, script *commandtest.Script, testKey string) (*backend.Instance, string, *cephfake.Cluster) {
	t.Helper()
	sys := t.TempDir()
	f := fakeWithPublishedImage(t)
	f.AddUser("csi", testKey)
	cfg := Config{ClusterID: "c", Monitors: []string{"10.0.0.1:3300"}, Pool: "kube", UserID: "csi", KeyFile: "/etc/spindle/ceph.key", Mounter: mounter, StateDir: t.TempDir()}.withDefaults()
	c := newCluster(cfg, command.New(script, nil), f.Dialer())
	c.readKeyFile = func(string) ([]byte, error) { return []byte(testKey + "\n"), nil }
	m := &kernelMapper{c: c, nbd: mounter == MounterNBD, sysRoot: sys, procRoot: filepath.Join(sys, "proc")}
	return newInstance("a", c, map[string]mapper{cfg.Mounter: m}), sys, f
}

// testKey is user csi's key on the fake clusters.
const testKey = "AQBcsicsicsicsicsicsicsicsicsicsicsi0=="

// fakeWithPublishedImage is a fake cluster with pool kube, user csi and
// volume testImage, published to node-a.
func fakeWithPublishedImage(t *testing.T) *cephfake.Cluster {
	t.Helper()
	f := cephfake.New("kube")
	f.AddUser("csi", testKey)
	ctx := context.Background()
	img := ceph.PoolSpec{Pool: "kube"}.Image(testImage)
	if err := f.Client().CreateImage(ctx, img, 4<<20, ceph.ImageOptions{Features: []string{"layering"}}); err != nil {
		t.Fatal(err)
	}
	if err := f.Client().SetImageMetadata(ctx, img, map[string]string{
		metaName: "pvc-1", metaVolume: `{"accessType":"mount","fsType":"ext4"}`,
		metaAttachments: `[{"nodeID":"node-a","accessMode":"SINGLE_NODE_WRITER","readOnly":false}]`,
	}); err != nil {
		t.Fatal(err)
	}
	return f
}

// connectNBD makes the fake sysfs of kernelInstance show dev connected and
// served by process pid, whose command line is argv (in <sys>/proc).
func connectNBD(t *testing.T, sys, dev string, pid int, argv ...string) {
	t.Helper()
	block := filepath.Join(sys, "block", filepath.Base(dev))
	proc := filepath.Join(sys, "proc", strconv.Itoa(pid))
	for _, d := range []string{block, proc} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(block, "pid"), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "cmdline"), []byte(strings.Join(argv, "\x00")+"\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// rbd device list -t nbd starts a Ceph client (seconds on a slow node, and
// every RBD stage asks): the devices of rbd-nbd processes this driver
// started are read from sysfs and /proc instead; any other nbd device
// leaves the list to the CLI.
func TestNBDListFromProc(t *testing.T) {
	own := func(spec string) []string {
		return with("rbd-nbd", "map", spec, "--try-netlink")
	}
	cli := `[{"id":600,"pool":"other","namespace":"","image":"img","snap":"","device":"/dev/nbd5","cookie":""}]`
	for _, tc := range []struct {
		name    string
		connect map[string][]string // device -> its process's argv
		script  []*commandtest.Step
		want    []string // pool/namespace/image@device
	}{
		{name: "nothing connected", want: nil},
		{name: "own maps", connect: map[string][]string{
			"/dev/nbd0": own("kube/" + testImage),
			"/dev/nbd1": own("kube/ns1/csi-vol-1"),
			"/dev/nbd2": own("kube/" + testImage + "@snap1"),
		}, want: []string{"kube//" + testImage + "@/dev/nbd0", "kube/ns1/csi-vol-1@/dev/nbd1"}},
		{name: "another form goes to the CLI", connect: map[string][]string{
			"/dev/nbd0": own("kube/" + testImage),
			"/dev/nbd5": {"/usr/bin/rbd-nbd", "--device", "/dev/nbd5", "map", "other/img"},
		}, script: []*commandtest.Step{commandtest.Expect("rbd", "device", "list", "-t", "nbd", "--format", "json").Prints(cli)},
			want: []string{"other//img@/dev/nbd5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sys := t.TempDir()
			if err := os.MkdirAll(filepath.Join(sys, "module", "nbd"), 0o755); err != nil {
				t.Fatal(err)
			}
			cfg := Config{ClusterID: "c", Monitors: []string{"10.0.0.1:3300"}, Pool: "kube", UserID: "csi", KeyFile: "/etc/spindle/ceph.key", Mounter: MounterNBD}.withDefaults()
			k := &kernelMapper{c: newCluster(cfg, command.New(commandtest.New(t, tc.script...), nil), nil), nbd: true, sysRoot: sys, procRoot: filepath.Join(sys, "proc")}
			pid := 100
			for dev, argv := range tc.connect {
				pid++
				connectNBD(t, sys, dev, pid, argv...)
			}
			list, err := k.nbdList(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range list {
				got = append(got, m.Pool+"/"+m.Namespace+"/"+m.Image+"@"+m.Device)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("listed %q, want %q", got, tc.want)
			}
		})
	}
}

const testImage = "csi-vol-0123456789abcdef0123456789abcdef"

func attachReq() backend.AttachRequest {
	return backend.AttachRequest{ImageID: "kube/" + testImage, NodeID: "node-a", PublishContext: map[string]string{ContextPool: "kube", ContextImage: testImage}}
}

// A node without the kernel module: the exact sequence up to the map, and
// a precondition failure that names the module.
func TestAttachWithoutKernelModule(t *testing.T) {
	tests := []struct {
		mounter string
		list    []*commandtest.Step // how the mapper lists what is mapped
		program string
		mapCmd  []string
		exit    int
		stderr  string
		module  string
	}{
		{MounterKRBD, nil, "rbd", []string{"device", "map", "kube/" + testImage}, 2, krbdNoModule, "rbd"},
		// Without the nbd module nothing can be mapped with it: no list.
		{MounterNBD, nil, "rbd-nbd", []string{"map", "kube/" + testImage}, 1, nbdNoModule, "nbd"},
	}
	for _, tt := range tests {
		t.Run(tt.mounter, func(t *testing.T) {
			steps := append([]*commandtest.Step{}, tt.list...)
			steps = append(steps,
				commandtest.Expect(tt.program, with(tt.mapCmd...)...).Exits(tt.exit, tt.stderr),
				// The probe tries to load the module before it gives up.
				commandtest.Expect("modprobe", tt.module).Exits(1, noModule(tt.module)),
			)
			inst, _, _ := kernelInstance(t, tt.mounter, commandtest.New(t, steps...))
			_, err := inst.Attacher.Attach(context.Background(), attachReq())
			named := `"` + tt.module + `" kernel module`
			testutil.WantKind(t, err, errdefs.ErrPrecondition, named, tt.mounter)
			testutil.WantKind(t, inst.Attacher.Probe(context.Background()), errdefs.ErrPrecondition, named, "Module "+tt.module+" not found")
		})
	}
}

// krbd logs in with the node kernel's Ceph client, which takes Tentacle's
// default keys (aes256k) from Linux 7.0 on: on an older kernel the stage
// is refused before the map, naming the cipher, the kernel and the ways
// out; elsewhere the map runs (here it fails for want of the module).
func TestKRBDRefusesAKeyItsKernelCannotUse(t *testing.T) {
	// ceph-authtool --gen-print-key of Ceph 20.2.4.
	const aes256k = "AgCK+wtrpXvfFiAAM/LlJ3y5JA9VWMTDByKxtnNmLr5/FqP7I955vh1qOHU="
	tests := []struct {
		name, release, key string
		refused            bool
	}{
		{"Debian 12's kernel, Tentacle's default key", "6.1.0-28-amd64", aes256k, true},
		{"Debian 13's kernel, Tentacle's default key", "6.12.48+deb13-amd64", aes256k, true},
		{"Linux 7.0, Tentacle's default key", "7.0.0-rc1", aes256k, false},
		{"Debian 12's kernel, a key of cipher aes", "6.1.0-28-amd64", testKey, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var steps []*commandtest.Step
			if !tt.refused {
				steps = append(steps, commandtest.Expect("rbd", with("device", "map", "kube/"+testImage)...).Exits(2, krbdNoModule))
			}
			inst, sys, _ := kernelInstanceWithKey(t, MounterKRBD, commandtest.New(t, steps...), tt.key)
			osrelease := filepath.Join(sys, "proc", "sys", "kernel", "osrelease")
			if err := os.MkdirAll(filepath.Dir(osrelease), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(osrelease, []byte(tt.release+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := inst.Attacher.Attach(context.Background(), attachReq())
			if tt.refused {
				testutil.WantKind(t, err, errdefs.ErrPrecondition, "cipher aes256k", "user csi", "Linux 7.0", "runs Linux "+tt.release, "rbd-nbd or rbd-fuse", "cipher aes and allow")
				if strings.Contains(err.Error(), tt.key) {
					t.Fatalf("the refusal shows the key: %v", err)
				}
				return
			}
			testutil.WantKind(t, err, errdefs.ErrPrecondition, `"rbd" kernel module`)
		})
	}
}

// Another node's client has the image open: no map is attempted, and the
// error names that client, not the manager's, which has it open too.
func TestAttachRefusesWatchedImage(t *testing.T) {
	inst, _, f := kernelInstance(t, MounterKRBD, commandtest.New(t))
	img := ceph.PoolSpec{Pool: "kube"}.Image(testImage)
	for _, addr := range []string{"10.0.0.7:0/3411306950", cephfake.ManagerAddr} {
		stop, err := f.Watch(img, addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
	}
	_, err := inst.Attacher.Attach(context.Background(), attachReq())
	testutil.WantKind(t, err, errdefs.ErrPrecondition, "10.0.0.7:0/3411306950", "watchers")
	if strings.Contains(err.Error(), cephfake.ManagerAddr) {
		t.Fatalf("the refusal names the manager's own client: %v", err)
	}
}

// writeKRBD fakes /sys/bus/rbd/devices/<id> for pool/name.
func writeKRBD(t *testing.T, sys, id, pool, name string, ro bool) {
	t.Helper()
	dir := filepath.Join(sys, "bus", "rbd", "devices", id)
	block := filepath.Join(sys, "block", "rbd"+id)
	for _, d := range []string{dir, block} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	roVal := "0"
	if ro {
		roVal = "1"
	}
	for path, v := range map[string]string{
		filepath.Join(dir, "pool"): pool, filepath.Join(dir, "name"): name, filepath.Join(dir, "current_snap"): "-",
		filepath.Join(block, "ro"): roVal, filepath.Join(block, "size"): "8192",
	} {
		if err := os.WriteFile(path, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// krbd: a mapped device is identified through sysfs, reused by Attach
// without any map, refreshed from sysfs, and unmapped; "not mapped" is done.
func TestKRBDSysfsIdentityAndUnmap(t *testing.T) {
	script := commandtest.New(t,
		commandtest.Expect("rbd", "device", "unmap", "/dev/rbd0"),
		commandtest.Expect("rbd", "device", "unmap", "/dev/rbd0").Exits(22, krbdNotMapped),
	)
	inst, sys, _ := kernelInstance(t, MounterKRBD, script)
	writeKRBD(t, sys, "0", "kube", testImage, false)
	writeKRBD(t, sys, "1", "other-pool", testImage, false)
	writeKRBD(t, sys, "2", "kube", "csi-vol-ffffffffffffffffffffffffffffffff", false)
	ctx := context.Background()
	id := "kube/" + testImage

	dev, err := inst.Attacher.Attach(ctx, attachReq())
	if err != nil || dev.Path != "/dev/rbd0" || !strings.Contains(dev.FsType, "ext4") {
		t.Fatalf("Attach = %+v, %v; want /dev/rbd0 reused", dev, err)
	}
	if d, err := inst.Attacher.Identify(ctx, id, "/dev/rbd0"); err != nil || d.Path != "/dev/rbd0" {
		t.Fatalf("Identify(/dev/rbd0) = %+v, %v", d, err)
	}
	for _, other := range []string{"/dev/rbd1", "/dev/rbd2", "/dev/rbd9", "/dev/sda"} {
		_, err := inst.Attacher.Identify(ctx, id, other)
		testutil.WantKind(t, err, errdefs.ErrNotFound, other)
	}
	if size, err := inst.Attacher.Refresh(ctx, id, "/dev/rbd0"); err != nil || size != 8192*512 {
		t.Fatalf("Refresh = %d, %v; want %d", size, err, 8192*512)
	}
	if err := inst.Attacher.Detach(ctx, id, ""); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	// The kernel said it was gone already: still success.
	if err := inst.Attacher.Detach(ctx, id, "/dev/rbd0"); err != nil {
		t.Fatalf("Detach of a device that is not mapped: %v", err)
	}
}

// rbd-nbd: devices come from "rbd device list -t nbd"; unmap by device.
// The list is what Ceph 16.2.15 prints on Debian's 6.1 kernel (the id is
// the rbd-nbd process, the image is "image", not krbd's "name", and the
// snapshot is empty, not "-").
func TestNBDListAndUnmap(t *testing.T) {
	list := `[{"id":437,"pool":"kube","namespace":"","image":"` + testImage + `","snap":"","device":"/dev/nbd7","cookie":""},` +
		`{"id":496,"pool":"kube","namespace":"","image":"csi-vol-ffffffffffffffffffffffffffffffff","snap":"","device":"/dev/nbd8","cookie":""}]`
	script := commandtest.New(t,
		commandtest.Expect("rbd", "device", "list", "-t", "nbd", "--format", "json").Prints(list),
		commandtest.Expect("rbd", "device", "list", "-t", "nbd", "--format", "json").Prints(list),
		commandtest.Expect("rbd", "device", "list", "-t", "nbd", "--format", "json").Prints(list),
		commandtest.Expect("rbd", "device", "unmap", "-t", "nbd", "/dev/nbd7"),
	)
	inst, sys, _ := kernelInstance(t, MounterNBD, script)
	if err := os.MkdirAll(filepath.Join(sys, "module", "nbd"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Mapped by "rbd device map -t nbd" (options before "map"): the CLI lists them.
	connectNBD(t, sys, "/dev/nbd7", 437, "rbd-nbd", "--device", "/dev/nbd7", "map", "kube/"+testImage)
	connectNBD(t, sys, "/dev/nbd8", 496, "rbd-nbd", "--device", "/dev/nbd8", "map", "kube/csi-vol-ffffffffffffffffffffffffffffffff")
	ctx := context.Background()
	id := "kube/" + testImage
	devs, err := inst.Attacher.Devices(ctx, id)
	if err != nil || len(devs) != 1 || devs[0].Path != "/dev/nbd7" {
		t.Fatalf("Devices = %+v, %v; want /dev/nbd7", devs, err)
	}
	_, err = inst.Attacher.Identify(ctx, id, "/dev/nbd8")
	testutil.WantKind(t, err, errdefs.ErrNotFound, "/dev/nbd8")
	if err := inst.Attacher.Detach(ctx, id, "/dev/nbd7"); err != nil {
		t.Fatalf("Detach: %v", err)
	}
}

// The node's inventory checks every staged volume; under its listing memo
// the rbd-nbd devices are listed once for all of them (each list starts a
// Ceph client: 6-12 s on the emulated workers of make e2e-multinode, where
// a list per volume ran the inventory out of time).
func TestNBDListedOncePerInventory(t *testing.T) {
	list := `[{"id":437,"pool":"kube","namespace":"","image":"` + testImage + `","snap":"","device":"/dev/nbd7","cookie":""}]`
	script := commandtest.New(t,
		commandtest.Expect("rbd", "device", "list", "-t", "nbd", "--format", "json").Prints(list),
	)
	inst, sys, _ := kernelInstance(t, MounterNBD, script)
	if err := os.MkdirAll(filepath.Join(sys, "module", "nbd"), 0o755); err != nil {
		t.Fatal(err)
	}
	connectNBD(t, sys, "/dev/nbd7", 437, "rbd-nbd", "--device", "/dev/nbd7", "map", "kube/"+testImage)
	ctx := backend.WithListingMemo(context.Background())
	id := "kube/" + testImage
	for i := 0; i < 3; i++ {
		if m, err := inst.Attacher.Identify(ctx, id, "/dev/nbd7"); err != nil || m == nil {
			t.Fatalf("Identify #%d = %+v, %v; want /dev/nbd7 mapped", i+1, m, err)
		}
	}
	if devs, err := inst.Attacher.Devices(ctx, id); err != nil || len(devs) != 1 || devs[0].Path != "/dev/nbd7" {
		t.Fatalf("Devices = %+v, %v; want /dev/nbd7", devs, err)
	}
}

// The cephx key of the request reaches a node program only through
// --keyfile: a 0600 file in a 0700 directory that is gone after the call,
// never argv.
func TestKeyFileNeverOnCommandLine(t *testing.T) {
	const key = "AQBsecretsecretsecretsecretsecretsecret=="
	c := newCluster(Config{ClusterID: "c", Monitors: []string{"10.0.0.1:3300"}, Pool: "kube"}.withDefaults(), command.New(utilexec.New(), nil), nil)
	ctx := backend.WithSecrets(context.Background(), map[string]string{SecretUserID: "csi", SecretUserKey: key})
	// sh -c SCRIPT then the connection args as $0 $1 ...: $7 is the key file.
	out, err := c.program(ctx, c.run, "c", "sh", "-c", `set -e
[ "$4" = --id ] && [ "$5" = csi ] && [ "$6" = --keyfile ]
echo "$7"
stat -c %a "$7" "$(dirname "$7")"
cat "$7"; echo
tr '\0' ' ' < /proc/$$/cmdline`)
	if err != nil {
		t.Fatalf("%v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 5 {
		t.Fatalf("output %q", out)
	}
	file, modes, got, argv := lines[0], lines[1]+" "+lines[2], lines[3], strings.Join(lines[4:], "\n")
	if modes != "600 700" || got != key {
		t.Fatalf("key file %s: modes %q, content ok=%t; want 600 700 and the key", file, modes, got == key)
	}
	if strings.Contains(argv, key) {
		t.Fatalf("the key is on the command line: %q", argv)
	}
	if _, err := os.Stat(filepath.Dir(file)); !os.IsNotExist(err) {
		t.Fatalf("the key directory %s outlived the call (stat: %v)", filepath.Dir(file), err)
	}
	// Half of a credential is an error naming the missing key, not the value.
	_, err = c.program(backend.WithSecrets(context.Background(), map[string]string{SecretUserKey: key}), c.run, "c", "true")
	testutil.WantKind(t, err, errdefs.ErrInvalidArgument, SecretUserID)
	if strings.Contains(err.Error(), key) {
		t.Fatal("the error shows the key")
	}
}

// A node whose rbd or nbd module is not loaded yet (before its first map):
// the probe loads it rather than fail the node plugin's liveness; a module
// already loaded costs no command.
func TestProbeLoadsTheKernelModule(t *testing.T) {
	tests := []struct {
		name     string
		mounter  string
		loaded   string // the sysfs directory present before the probe
		modprobe *commandtest.Step
		appears  string // what modprobe makes appear
		wantErr  []string
	}{
		{name: "krbd loaded", mounter: MounterKRBD, loaded: "bus/rbd"},
		{name: "nbd loaded", mounter: MounterNBD, loaded: "module/nbd"},
		{name: "krbd loads rbd", mounter: MounterKRBD, modprobe: commandtest.Expect("modprobe", "rbd"), appears: "bus/rbd"},
		{name: "rbd-nbd loads nbd", mounter: MounterNBD, modprobe: commandtest.Expect("modprobe", "nbd"), appears: "module/nbd"},
		{name: "modprobe succeeds, nothing appears", mounter: MounterKRBD, modprobe: commandtest.Expect("modprobe", "rbd"),
			wantErr: []string{"modprobe rbd succeeded", "bus/rbd is still missing"}},
		{name: "no modprobe in the image", mounter: MounterNBD,
			modprobe: commandtest.Expect("modprobe", "nbd").FailsToStart(errors.New(`exec: "modprobe": executable file not found in $PATH`)),
			wantErr:  []string{`"nbd" kernel module is not loaded`, "executable file not found"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var steps []*commandtest.Step
			var sys string
			if tt.modprobe != nil {
				steps = append(steps, tt.modprobe.Does(func() {
					if tt.appears != "" {
						if err := os.MkdirAll(filepath.Join(sys, tt.appears), 0o755); err != nil {
							t.Error(err)
						}
					}
				}))
			}
			inst, dir, _ := kernelInstance(t, tt.mounter, commandtest.New(t, steps...))
			sys = dir
			if tt.loaded != "" {
				if err := os.MkdirAll(filepath.Join(sys, tt.loaded), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			err := inst.Attacher.Probe(context.Background())
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Probe: %v", err)
				}
				return
			}
			testutil.WantKind(t, err, errdefs.ErrPrecondition, tt.wantErr...)
		})
	}
}
