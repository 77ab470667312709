package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/testutil"
)

// fakeNode answers the health check's questions about device nodes and
// paths without a real device.
type fakeNode struct {
	devices map[string][2]uint32 // block device nodes (and files a device is bound on): path -> major, minor
	files   map[string]bool      // other existing paths that are no device
	statErr map[string]error     // stat fails for these paths
	sizes   map[string]int64     // device sizes; a missing entry is 1 GiB
}

func (f *fakeNode) blockDeviceAt(path string) (uint32, uint32, bool, error) {
	if err := f.statErr[path]; err != nil {
		return 0, 0, false, err
	}
	if n, ok := f.devices[path]; ok {
		return n[0], n[1], true, nil
	}
	if f.files[path] {
		return 0, 0, false, nil
	}
	return 0, 0, false, &os.PathError{Op: "stat", Path: path, Err: unix.ENOENT}
}

func (f *fakeNode) deviceSize(path string) (int64, error) {
	if size, ok := f.sizes[path]; ok {
		return size, nil
	}
	return 1 << 30, nil
}

// stat fails as configured, else looks at the real path (the test's
// directories).
func (f *fakeNode) stat(path string) error {
	if err := f.statErr[path]; err != nil {
		return err
	}
	return statPath(path)
}

func TestCheckVolumeHealth(t *testing.T) {
	staging := realDir(t, "globalmount")
	publish := realDir(t, "mount")
	blockFile := filepath.Join(realDir(t, "block"), "pvc")
	missingPath := filepath.Join(t.TempDir(), "gone")
	dead := func(p string, errno unix.Errno) map[string]error {
		return map[string]error{p: &os.PathError{Op: "stat", Path: p, Err: errno}}
	}
	mountLine := func(id int, devNum, path, opts, fsType, source, superOpts string) string {
		return fmt.Sprintf("%d 22 %s / %s %s shared:%d - %s %s %s", id, devNum, escape(path), opts, id, fsType, source, superOpts)
	}
	stagedExt4 := mountLine(100, "7:3", staging, "rw,relatime", "ext4", testDev, "rw")
	publishedExt4 := mountLine(101, "7:3", publish, "rw,relatime", "ext4", testDev, "rw")
	loopDev := map[string][2]uint32{testDev: {7, 3}}

	tests := []struct {
		name    string
		check   VolumeHealthCheck
		mounts  []string
		node    fakeNode
		want    []string // reasons, in order
		mention []string // in the messages
	}{
		{
			name:   "staged ext4, healthy",
			check:  VolumeHealthCheck{Device: testDev, StagingPath: staging},
			mounts: []string{stagedExt4},
			node:   fakeNode{devices: loopDev},
		},
		{
			name:   "staged and published, healthy",
			check:  VolumeHealthCheck{Device: testDev, StagingPath: staging, PublishPath: publish},
			mounts: []string{stagedExt4, publishedExt4},
			node:   fakeNode{devices: loopDev},
		},
		{
			name:  "read-only bind of a writable stage, healthy",
			check: VolumeHealthCheck{Device: testDev, StagingPath: staging, PublishPath: publish},
			mounts: []string{stagedExt4,
				mountLine(101, "7:3", publish, "ro,relatime", "ext4", testDev, "rw")},
			node: fakeNode{devices: loopDev},
		},
		{
			name:   "staged read-only on purpose, healthy",
			check:  VolumeHealthCheck{Device: testDev, StagingPath: staging},
			mounts: []string{mountLine(100, "7:3", staging, "ro,relatime", "xfs", testDev, "ro,nouuid,attr2")},
			node:   fakeNode{devices: loopDev},
		},
		{
			// btrfs mounts carry an anonymous device number.
			name:   "btrfs: matched by source, healthy",
			check:  VolumeHealthCheck{Device: testDev, StagingPath: staging, PublishPath: publish},
			mounts: []string{mountLine(100, "0:52", staging, "rw", "btrfs", testDev, "rw,space_cache=v2"), mountLine(101, "0:52", publish, "rw", "btrfs", testDev, "rw")},
			node:   fakeNode{devices: loopDev},
		},
		{
			name:    "staging path holds nothing",
			check:   VolumeHealthCheck{Device: testDev, StagingPath: staging},
			node:    fakeNode{devices: loopDev},
			want:    []string{ReasonStagingMountMissing},
			mention: []string{"nothing is mounted at staging path " + staging},
		},
		{
			name:    "staging path gone; the pod's bind lives on",
			check:   VolumeHealthCheck{Device: testDev, StagingPath: missingPath, PublishPath: publish},
			mounts:  []string{publishedExt4},
			node:    fakeNode{devices: loopDev},
			want:    []string{ReasonStagingMountMissing},
			mention: []string{"staging path " + missingPath + " does not exist"},
		},
		{
			name:    "staging path holds another device",
			check:   VolumeHealthCheck{Device: testDev, StagingPath: staging},
			mounts:  []string{mountLine(100, "7:4", staging, "rw", "ext4", "/dev/loop4", "rw")},
			node:    fakeNode{devices: loopDev},
			want:    []string{ReasonStagingMountWrongDevice},
			mention: []string{"holds ext4 /dev/loop4, not the volume's device " + testDev},
		},
		{
			name:    "staging mount dead (ENOTCONN)",
			check:   VolumeHealthCheck{Device: testDev, StagingPath: staging, PublishPath: publish},
			mounts:  []string{stagedExt4, publishedExt4},
			node:    fakeNode{devices: loopDev, statErr: dead(staging, unix.ENOTCONN)},
			want:    []string{ReasonMountCorrupted},
			mention: []string{"staging path " + staging + " is dead", "transport endpoint is not connected"},
		},
		{
			name:    "xfs shut down: every path answers EIO",
			check:   VolumeHealthCheck{Device: testDev, StagingPath: staging, PublishPath: publish},
			mounts:  []string{stagedExt4, publishedExt4},
			node:    fakeNode{devices: loopDev, statErr: map[string]error{staging: dead(staging, unix.EIO)[staging], publish: dead(publish, unix.EIO)[publish]}},
			want:    []string{ReasonMountCorrupted, ReasonMountCorrupted},
			mention: []string{"input/output error"},
		},
		{
			name:    "stale publish mount (ESTALE)",
			check:   VolumeHealthCheck{Device: testDev, StagingPath: staging, PublishPath: publish},
			mounts:  []string{stagedExt4, publishedExt4},
			node:    fakeNode{devices: loopDev, statErr: dead(publish, unix.ESTALE)},
			want:    []string{ReasonMountCorrupted},
			mention: []string{"publish path " + publish, "stale"},
		},
		{
			// The real line of an ext4 after an error, Linux 6.18.
			name:    "ext4 made read-only by the kernel: said once for the stage and its bind",
			check:   VolumeHealthCheck{Device: testDev, StagingPath: staging, PublishPath: publish},
			mounts:  []string{mountLine(100, "7:3", staging, "rw,relatime", "ext4", testDev, "rw,errors=remount-ro,emergency_ro"), mountLine(101, "7:3", publish, "rw,relatime", "ext4", testDev, "rw,errors=remount-ro,emergency_ro")},
			node:    fakeNode{devices: loopDev},
			want:    []string{ReasonFilesystemReadOnly},
			mention: []string{"made read-only by the kernel", "rw,errors=remount-ro,emergency_ro"},
		},
		{
			name:   "older kernels: superblock ro under a read-write mount",
			check:  VolumeHealthCheck{Device: testDev, StagingPath: staging},
			mounts: []string{mountLine(100, "7:3", staging, "rw,relatime", "ext4", testDev, "ro,errors=remount-ro")},
			node:   fakeNode{devices: loopDev},
			want:   []string{ReasonFilesystemReadOnly},
		},
		{
			name:    "device node gone; the mounts still name it",
			check:   VolumeHealthCheck{Device: testDev, StagingPath: staging, PublishPath: publish},
			mounts:  []string{stagedExt4, publishedExt4},
			want:    []string{ReasonDeviceMissing},
			mention: []string{"device " + testDev + " does not exist"},
		},
		{
			name:    "device path is no device",
			check:   VolumeHealthCheck{Device: testDev, StagingPath: staging},
			mounts:  []string{stagedExt4},
			node:    fakeNode{files: map[string]bool{testDev: true}},
			want:    []string{ReasonDeviceMissing},
			mention: []string{"not a block device"},
		},
		{
			name:    "loop device detached: size 0",
			check:   VolumeHealthCheck{Device: testDev, StagingPath: blockFile, Block: true},
			node:    fakeNode{devices: loopDev, sizes: map[string]int64{testDev: 0}},
			want:    []string{ReasonDeviceMissing},
			mention: []string{"attached to nothing"},
		},
		{
			name:    "everything gone at once, device first",
			check:   VolumeHealthCheck{Device: testDev, StagingPath: staging, PublishPath: missingPath},
			want:    []string{ReasonDeviceMissing, ReasonStagingMountMissing, ReasonPublishMountMissing},
			mention: []string{"publish path " + missingPath + " does not exist"},
		},
		{
			name:    "publish path holds nothing",
			check:   VolumeHealthCheck{Device: testDev, StagingPath: staging, PublishPath: publish},
			mounts:  []string{stagedExt4},
			node:    fakeNode{devices: loopDev},
			want:    []string{ReasonPublishMountMissing},
			mention: []string{"nothing is mounted at publish path " + publish},
		},
		{
			name:    "publish path holds another filesystem",
			check:   VolumeHealthCheck{Device: testDev, StagingPath: staging, PublishPath: publish},
			mounts:  []string{stagedExt4, mountLine(101, "0:45", publish, "rw", "tmpfs", "tmpfs", "rw")},
			node:    fakeNode{devices: loopDev},
			want:    []string{ReasonPublishMountWrongDevice},
			mention: []string{"holds tmpfs tmpfs"},
		},
		{
			// Block volumes: the stage mounts nothing, so an empty staging
			// path is no problem.
			name:  "block volume bound, healthy",
			check: VolumeHealthCheck{Device: testDev, StagingPath: staging, PublishPath: blockFile, Block: true},
			node:  fakeNode{devices: map[string][2]uint32{testDev: {7, 3}, blockFile: {7, 3}}},
		},
		{
			name:    "block volume: the file is no longer bound",
			check:   VolumeHealthCheck{Device: testDev, StagingPath: staging, PublishPath: blockFile, Block: true},
			node:    fakeNode{devices: loopDev, files: map[string]bool{blockFile: true}},
			want:    []string{ReasonPublishMountMissing},
			mention: []string{"not a device node"},
		},
		{
			name:    "block volume: another device bound",
			check:   VolumeHealthCheck{Device: testDev, StagingPath: staging, PublishPath: blockFile, Block: true},
			node:    fakeNode{devices: map[string][2]uint32{testDev: {7, 3}, blockFile: {7, 4}}},
			want:    []string{ReasonPublishMountWrongDevice},
			mention: []string{"is device 7:4, not the volume's device " + testDev + " (7:3)"},
		},
		{
			name:  "block volume: publish file gone",
			check: VolumeHealthCheck{Device: testDev, StagingPath: staging, PublishPath: missingPath, Block: true},
			node:  fakeNode{devices: loopDev},
			want:  []string{ReasonPublishMountMissing},
		},
		{
			name:  "block volume: dead bind",
			check: VolumeHealthCheck{Device: testDev, StagingPath: staging, PublishPath: blockFile, Block: true},
			node:  fakeNode{devices: loopDev, statErr: map[string]error{blockFile: unix.ENOTCONN}},
			want:  []string{ReasonMountCorrupted},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := scriptedDataPath(t) // no commands
			d.mountInfoPath = newMountTable(t, append([]string{rootMount}, tc.mounts...)...).path
			d.blockDeviceAt, d.deviceSize, d.stat = tc.node.blockDeviceAt, tc.node.deviceSize, tc.node.stat
			problems, err := d.CheckVolumeHealth(tc.check)
			if err != nil {
				t.Fatal(err)
			}
			var reasons []string
			for _, p := range problems {
				reasons = append(reasons, p.Reason)
			}
			if !slices.Equal(reasons, tc.want) {
				t.Fatalf("problems %q, want reasons %q", problems, tc.want)
			}
			for _, m := range tc.mention {
				if !slices.ContainsFunc(problems, func(p HealthProblem) bool { return strings.Contains(p.Message, m) }) {
					t.Errorf("no message mentions %q: %q", m, problems)
				}
			}
		})
	}
}

func TestCheckVolumeHealthCannotCheck(t *testing.T) {
	staging := realDir(t, "globalmount")
	tests := []struct {
		name    string
		setup   func(*DataPath)
		wantErr []string
	}{
		{
			name:    "mount table unreadable",
			setup:   func(d *DataPath) { d.mountInfoPath = filepath.Join(t.TempDir(), "missing") },
			wantErr: []string{"missing"},
		},
		{
			name: "device cannot be looked at",
			setup: func(d *DataPath) {
				d.blockDeviceAt = func(string) (uint32, uint32, bool, error) { return 0, 0, false, unix.EACCES }
			},
			wantErr: []string{"check device " + testDev, "permission denied"},
		},
		{
			name: "staging path cannot be looked at",
			setup: func(d *DataPath) {
				d.stat = func(string) error { return unix.ELOOP }
			},
			wantErr: []string{"check staging path " + staging, "too many levels"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := scriptedDataPath(t)
			node := fakeNode{devices: map[string][2]uint32{testDev: {7, 3}}}
			d.blockDeviceAt, d.deviceSize, d.stat = node.blockDeviceAt, node.deviceSize, node.stat
			tc.setup(d)
			problems, err := d.CheckVolumeHealth(VolumeHealthCheck{Device: testDev, StagingPath: staging})
			if err == nil {
				t.Fatalf("CheckVolumeHealth = %q, want an error: the check could not be made", problems)
			}
			for _, s := range tc.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

// The health check on real mounts: a staged and published ext4 is healthy;
// an error the kernel answers with remount-ro, the pod's unmount and the
// stage's unmount are reported, each with its reason.
func TestRealCheckVolumeHealth(t *testing.T) {
	testutil.RequireRoot(t, "attach loop devices and mount them")
	testutil.RequireCommands(t, "losetup", "blkid", "mount", "umount", "mkfs.ext4")
	ctx := context.Background()
	d, _ := realDataPath()
	dev, _ := loopDevice(t, 64*mib)
	staging := mountPoint(t, d, "globalmount")
	publish := mountPoint(t, d, "mount")
	if _, err := d.EnsureFilesystem(ctx, FormatRequest{Device: dev, Filesystem: mustFS(t, "ext4")}); err != nil {
		t.Fatal(err)
	}
	// mkfs.ext4 records "Errors behavior: Continue"; ask for remount-ro.
	if err := d.MountDevice(ctx, dev, staging, "ext4", []string{"errors=remount-ro"}); err != nil {
		t.Fatal(err)
	}
	if err := d.BindMount(ctx, staging, publish, false); err != nil {
		t.Fatal(err)
	}
	check := VolumeHealthCheck{Device: dev, StagingPath: staging, PublishPath: publish}
	wantHealth(t, d, check)

	// /sys/fs/ext4/<dev>/trigger_fs_error records an error as if ext4 had
	// found one, which with errors=remount-ro makes it read-only.
	var readOnly []string
	trigger := filepath.Join("/sys/fs/ext4", filepath.Base(dev), "trigger_fs_error")
	if err := os.WriteFile(trigger, []byte("spindle health test\n"), 0o200); err != nil {
		t.Logf("cannot trigger an ext4 error (%v); the read-only check is left to the unit test", err)
	} else {
		readOnly = []string{ReasonFilesystemReadOnly}
		if err := os.WriteFile(filepath.Join(staging, "x"), nil, 0o600); !errors.Is(err, unix.EROFS) {
			t.Fatalf("write after the triggered error = %v, want EROFS", err)
		}
	}
	wantHealth(t, d, check, readOnly...)

	mustUnmount(t, d, publish)
	wantHealth(t, d, check, append(readOnly, ReasonPublishMountMissing)...)
	mustUnmount(t, d, staging)
	wantHealth(t, d, check, ReasonStagingMountMissing, ReasonPublishMountMissing)
}

// A block volume: its device bound onto a file is healthy; once the loop
// device is detached (the bind does not keep it), the device is missing.
func TestRealCheckBlockVolumeHealth(t *testing.T) {
	testutil.RequireRoot(t, "attach loop devices and bind them")
	testutil.RequireCommands(t, "losetup")
	ctx := context.Background()
	d, _ := realDataPath()
	file := sparseFile(t, t.TempDir(), 16*mib)
	out, err := setupRunner.Run(ctx, "losetup", "--find", "--show", file)
	if err != nil {
		t.Fatal(err)
	}
	dev := strings.TrimSpace(string(out))
	attached := true
	detach := func() {
		if _, err := setupRunner.Run(ctx, "losetup", "--detach", dev); err != nil {
			t.Errorf("detach %s: %v", dev, err)
		}
		attached = false
	}
	t.Cleanup(func() {
		if attached {
			detach()
		}
	})
	target := filepath.Join(realDir(t, "block"), "pvc")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	unmountAtCleanup(t, d, target)
	if err := d.BindMount(ctx, dev, target, false); err != nil {
		t.Fatal(err)
	}
	check := VolumeHealthCheck{Device: dev, StagingPath: realDir(t, "staging"), PublishPath: target, Block: true}
	wantHealth(t, d, check)

	detach()
	wantHealth(t, d, check, ReasonDeviceMissing)

	mustUnmount(t, d, target)
	wantHealth(t, d, check, ReasonDeviceMissing, ReasonPublishMountMissing)
}

func wantHealth(t *testing.T, d *DataPath, check VolumeHealthCheck, want ...string) {
	t.Helper()
	problems, err := d.CheckVolumeHealth(check)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range problems {
		got = append(got, p.Reason)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("problems %q, want reasons %q", problems, want)
	}
}
