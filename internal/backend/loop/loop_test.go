package loop_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/testutil"

	"golang.org/x/sys/unix"
	utilexec "k8s.io/utils/exec"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/conformance"
	"github.com/spindle-csi/spindle/internal/backend/filestore"
	"github.com/spindle-csi/spindle/internal/backend/loop"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

const mib = int64(1) << 20

// TestConformanceFake runs the shared suite with the in-memory loop driver:
// everything but the kernel, and no root needed. The small-capacity variant
// is a provisioning cap (Config.MaxProvisionedBytes).
func TestConformanceFake(t *testing.T) {
	conformance.Run(t, func(t *testing.T, opts conformance.Options) *conformance.Fixture {
		return newFakeEnv(t, loop.Config{MaxProvisionedBytes: opts.CapacityBytes}).fixture()
	})
}

// TestConformanceLosetup runs the shared suite with real losetup and sysfs.
// The small-capacity variant is a pool on a tmpfs of that size, so a single
// image too big is refused by the filesystem's real free space; the same
// provisioning cap keeps sparse images from totalling more than that.
func TestConformanceLosetup(t *testing.T) {
	requireRealLoop(t)
	conformance.Run(t, func(t *testing.T, opts conformance.Options) *conformance.Fixture {
		var tmpfsSize int64
		if opts.CapacityBytes > 0 {
			tmpfsSize = opts.CapacityBytes
		}
		return newRealEnv(t, tmpfsSize).fixture()
	})
}

// env is one loop instance on the fake driver or on the real one, with the
// view of the kernel that the loop-specific tests check against. The views
// never go through the code under test.
type env struct {
	inst  *backend.Instance
	store *filestore.Store
	fake  *blockdev.FakeLoopDevices // nil with real losetup
}

func newFakeEnv(t *testing.T, cfg loop.Config) *env {
	t.Helper()
	cfg.PoolDir = filepath.Join(t.TempDir(), "pool")
	fake := blockdev.NewFakeLoopDevices()
	inst, err := loop.NewWithLoopDevices("test", cfg, fake)
	if err != nil {
		t.Fatal(err)
	}
	return &env{inst: inst, store: inst.Store.(*filestore.Store), fake: fake}
}

// requireRealLoop: the cases on real loop devices run in the root tier,
// where the loop driver must be there.
func requireRealLoop(t *testing.T) {
	t.Helper()
	testutil.RootOnlyCase(t, "bind real loop devices")
	testutil.RequireCommands(t, "losetup")
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Fatalf("no loop driver: %v", err)
	}
}

// newRealEnv builds an instance on real losetup; with tmpfsSize > 0 its pool
// is a tmpfs of that size. Any loop device still bound to the pool when the
// test ends is reported (the test's own cleanups should have detached it)
// and then detached, so a failing test never leaks devices.
func newRealEnv(t *testing.T, tmpfsSize int64) *env {
	t.Helper()
	requireRealLoop(t)
	pool := filepath.Join(t.TempDir(), "pool")
	if tmpfsSize > 0 {
		mountTmpfs(t, pool, fmt.Sprintf("size=%d,mode=0750", tmpfsSize))
	}
	inst, err := loop.New("real", loop.Config{PoolDir: pool, MaxProvisionedBytes: tmpfsSize}, command.New(utilexec.New(), nil))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{inst: inst, store: inst.Store.(*filestore.Store)}
	t.Cleanup(func() {
		for dev, file := range sysLoopDevices(t) {
			if strings.HasPrefix(file, e.store.Dir()+"/") {
				t.Errorf("loop device %s is still bound to %s after the test", dev, file)
				if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
					t.Errorf("losetup --detach %s: %v: %s", dev, err, out)
				}
			}
		}
	})
	return e
}

// mountTmpfs mounts a tmpfs on dir (created if needed) until the test ends.
func mountTmpfs(t *testing.T, dir, opts string) {
	t.Helper()
	testutil.RootOnlyCase(t, "mount a tmpfs")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("spindle-test", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		t.Fatalf("mount tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
			_ = unix.Unmount(dir, unix.MNT_DETACH)
		}
	})
}

// sysLoopDevices reads the kernel's bound loop devices: path -> backing file
// (with " (deleted)" when it was unlinked).
func sysLoopDevices(t *testing.T) map[string]string {
	t.Helper()
	dirs, err := filepath.Glob("/sys/block/loop*")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "loop", "backing_file"))
		if err != nil {
			continue // not bound
		}
		out["/dev/"+filepath.Base(d)] = strings.TrimSpace(string(b))
	}
	return out
}

func (e *env) fixture() *conformance.Fixture {
	return &conformance.Fixture{
		Instance:          e.inst,
		ImageID:           filestore.ImageIDForName,
		Artifacts:         e.artifacts,
		MutableParameters: map[string]string{loop.MutableParamDirectIO: "false"},
		WriteImage:        e.writeImage,
		ReadImage:         e.readImage,
	}
}

// writeImage writes into an image file, durably, as a node writing through
// its loop device would.
func (e *env) writeImage(_ context.Context, id string, off int64, data []byte) error {
	f, err := os.OpenFile(e.store.ImagePath(id), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		return err
	}
	return f.Sync()
}

func (e *env) readImage(_ context.Context, id string, off int64, n int) ([]byte, error) {
	f, err := os.Open(e.store.ImagePath(id))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, n)
	_, err = f.ReadAt(buf, off)
	return buf, err
}

// artifacts lists every entry of the pool directory with its size.
func (e *env) artifacts(context.Context) ([]string, error) {
	var out []string
	err := filepath.WalkDir(e.store.Dir(), func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == e.store.Dir() {
			return err
		}
		rel, err := filepath.Rel(e.store.Dir(), p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			out = append(out, rel+"/")
		} else {
			out = append(out, fmt.Sprintf("%s %d", rel, info.Size()))
		}
		return nil
	})
	return out, err
}

// backing reports what the kernel (or the fake) has dev bound to, and
// whether it is bound at all.
func (e *env) backing(t *testing.T, dev string) (file string, deleted, bound bool) {
	t.Helper()
	if e.fake != nil {
		d, ok := e.fake.Devices[dev]
		if !ok {
			return "", false, false
		}
		return d.BackingFile, d.Deleted, true
	}
	b, ok := sysLoopDevices(t)[dev]
	if !ok {
		return "", false, false
	}
	file, deleted = strings.CutSuffix(b, " (deleted)")
	return file, deleted, true
}

// armed reports whether dev's release at last close is armed (autoclear).
func (e *env) armed(t *testing.T, dev string) bool {
	t.Helper()
	if e.fake != nil {
		d, ok := e.fake.Devices[dev]
		return ok && d.AutoClear
	}
	b, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/loop/autoclear")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b)) == "1"
}

// imageUnlinked tells the fake that the image file was removed, as the
// kernel notices by itself.
func (e *env) imageUnlinked(id string) {
	if e.fake == nil {
		return
	}
	for _, d := range e.fake.Devices {
		if d.BackingFile == e.store.ImagePath(id) {
			d.Deleted = true
		}
	}
}

// holdBusy makes dev "in use" until the returned function runs: the fake's
// Busy flag, or on a real device an exclusive open, which is what a mount
// holds.
func (e *env) holdBusy(t *testing.T, dev string) (release func()) {
	t.Helper()
	if e.fake != nil {
		e.fake.Busy[dev] = true
		return func() { delete(e.fake.Busy, dev) }
	}
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s exclusively: %v", dev, err)
	}
	closed := false
	release = func() {
		if !closed {
			closed = true
			_ = unix.Close(fd)
		}
	}
	t.Cleanup(release)
	return release
}

// holdOpen opens dev without O_EXCL, as a process reading a raw block
// volume would, until the returned function runs. InUse cannot see such a
// holder.
func (e *env) holdOpen(t *testing.T, dev string) (release func()) {
	t.Helper()
	if e.fake != nil {
		e.fake.Open[dev] = true
		return func() { e.fake.Close(dev) }
	}
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s: %v", dev, err)
	}
	closed := false
	release = func() {
		if !closed {
			closed = true
			_ = unix.Close(fd)
		}
	}
	t.Cleanup(release)
	return release
}

// bothDrivers runs fn on the fake loop driver and, where possible, on the real one.
func bothDrivers(t *testing.T, fn func(t *testing.T, e *env)) {
	t.Run("fake", func(t *testing.T) { fn(t, newFakeEnv(t, loop.Config{})) })
	t.Run("losetup", func(t *testing.T) { fn(t, newRealEnv(t, 0)) })
}

// published creates an image and publishes it to node "n1".
func (e *env) published(t *testing.T, name string, mode backend.AccessMode, ro bool) (*backend.Image, map[string]string) {
	t.Helper()
	ctx := t.Context()
	if err := e.inst.Attacher.RegisterNode(ctx, backend.NodeInfo{NodeID: "n1"}); err != nil {
		t.Fatal(err)
	}
	img, err := e.inst.Store.Create(ctx, backend.VolumeSpec{Name: name, CapacityBytes: 4 * mib, AccessType: backend.AccessBlock})
	if err != nil {
		t.Fatal(err)
	}
	pc, err := e.inst.Exporter.Publish(ctx, img.ID, backend.Attachment{NodeID: "n1", AccessMode: mode, ReadOnly: ro})
	if err != nil {
		t.Fatal(err)
	}
	return img, pc
}

// attach attaches and makes sure the image's devices are gone when the test ends.
func (e *env) attach(t *testing.T, req backend.AttachRequest) *backend.Device {
	t.Helper()
	dev, err := e.inst.Attacher.Attach(t.Context(), req)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	t.Cleanup(func() {
		if err := e.inst.Attacher.Detach(context.Background(), req.ImageID, ""); err != nil {
			t.Errorf("cleanup Detach: %v", err)
		}
	})
	return dev
}

func TestSupportsAccess(t *testing.T) {
	e := newFakeEnv(t, loop.Config{})
	const oneWriter = "written from one node only"
	tests := []struct {
		mode   backend.AccessMode
		ok     bool
		reason string // the refusal explains itself
	}{
		{mode: backend.SingleNodeWriter, ok: true},
		{mode: backend.SingleNodeReaderOnly, ok: true},
		{mode: backend.SingleNodeSingleWriter, ok: true},
		{mode: backend.SingleNodeMultiWriter, ok: true},
		{mode: backend.MultiNodeReaderOnly, ok: true},
		// One kernel caches a loop image; two nodes writing it corrupt it.
		{mode: backend.MultiNodeSingleWriter, reason: oneWriter},
		{mode: backend.MultiNodeMultiWriter, reason: oneWriter},
		{mode: "UNKNOWN_MODE"},
	}
	for _, at := range []backend.AccessType{backend.AccessMount, backend.AccessBlock} {
		for _, tt := range tests {
			t.Run(string(at)+"/"+string(tt.mode), func(t *testing.T) {
				err := e.inst.Exporter.SupportsAccess(at, tt.mode)
				if tt.ok {
					if err != nil {
						t.Fatalf("SupportsAccess = %v, want supported", err)
					}
					return
				}
				testutil.WantKind(t, err, errdefs.ErrInvalidArgument, string(tt.mode), tt.reason)
			})
		}
	}
	t.Run("unknown access type", func(t *testing.T) {
		testutil.WantKind(t, e.inst.Exporter.SupportsAccess("tape", backend.SingleNodeWriter), errdefs.ErrInvalidArgument, "tape")
	})
}

func TestPublishContextNamesTheImage(t *testing.T) {
	e := newFakeEnv(t, loop.Config{})
	img, pc := e.published(t, "pvc-ctx", backend.SingleNodeWriter, false)
	want := map[string]string{loop.ContextImagePath: e.store.ImagePath(img.ID), backend.ContextReadOnly: "false"}
	if !maps.Equal(pc, want) {
		t.Fatalf("publish_context = %v, want %v", pc, want)
	}
	if _, err := os.Stat(pc[loop.ContextImagePath]); err != nil {
		t.Fatalf("the published image path does not exist: %v", err)
	}
}

func TestAttachImagePathMismatch(t *testing.T) {
	e := newFakeEnv(t, loop.Config{})
	img, pc := e.published(t, "pvc-mismatch", backend.SingleNodeWriter, false)
	pc[loop.ContextImagePath] = "/other/pool/" + img.ID + ".img"
	_, err := e.inst.Attacher.Attach(t.Context(), backend.AttachRequest{ImageID: img.ID, NodeID: "n1", PublishContext: pc})
	testutil.WantKind(t, err, errdefs.ErrPrecondition, "/other/pool/", e.store.ImagePath(img.ID))
	if len(e.fake.Calls) != 0 {
		t.Fatalf("a refused attach ran %v", e.fake.Calls)
	}
}

func TestAttachReadOnly(t *testing.T) {
	tests := []struct {
		name   string
		mode   backend.AccessMode
		attRO  bool // the controller's attachment
		reqRO  bool // the node's request
		wantRO bool
	}{
		{"read-write", backend.SingleNodeWriter, false, false, false},
		{"read-only attachment, request does not say", backend.SingleNodeWriter, true, false, true},
		{"read-only mode, flag unset", backend.SingleNodeReaderOnly, false, false, true},
		{"multi-node reader", backend.MultiNodeReaderOnly, true, false, true},
		{"read-only view of a read-write attachment", backend.SingleNodeWriter, false, true, true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bothDrivers(t, func(t *testing.T, e *env) {
				img, pc := e.published(t, "pvc-ro-"+strconv.Itoa(i), tt.mode, tt.attRO)
				dev := e.attach(t, backend.AttachRequest{ImageID: img.ID, NodeID: "n1", PublishContext: pc, ReadOnly: tt.reqRO})
				if dev.ReadOnly != tt.wantRO {
					t.Fatalf("device read-only = %t, want %t", dev.ReadOnly, tt.wantRO)
				}
				file, _, bound := e.backing(t, dev.Path)
				if !bound || file != e.store.ImagePath(img.ID) {
					t.Fatalf("%s is bound to %q (bound %t), want %s", dev.Path, file, bound, e.store.ImagePath(img.ID))
				}
				if e.fake == nil {
					ro, err := os.ReadFile("/sys/block/" + filepath.Base(dev.Path) + "/ro")
					if err != nil {
						t.Fatal(err)
					}
					if got := strings.TrimSpace(string(ro)) == "1"; got != tt.wantRO {
						t.Fatalf("the kernel says %s read-only=%t, want %t", dev.Path, got, tt.wantRO)
					}
				}
			})
		})
	}
}

// TestReadOnlyViewBesideWriter: the node publishes a read-only view of a
// volume it also has read-write; the two are separate devices and Detach
// can release one of them.
func TestReadOnlyViewBesideWriter(t *testing.T) {
	bothDrivers(t, func(t *testing.T, e *env) {
		img, pc := e.published(t, "pvc-views", backend.SingleNodeWriter, false)
		rw := e.attach(t, backend.AttachRequest{ImageID: img.ID, NodeID: "n1", PublishContext: pc})
		ro := e.attach(t, backend.AttachRequest{ImageID: img.ID, NodeID: "n1", PublishContext: pc, ReadOnly: true})
		if rw.Path == ro.Path || rw.ReadOnly || !ro.ReadOnly {
			t.Fatalf("rw = %+v, ro = %+v; want two devices, one of each", rw, ro)
		}
		devs, err := e.inst.Attacher.Devices(t.Context(), img.ID)
		if err != nil || len(devs) != 2 {
			t.Fatalf("Devices = %+v, %v; want both", devs, err)
		}
		if err := e.inst.Attacher.Detach(t.Context(), img.ID, ro.Path); err != nil {
			t.Fatal(err)
		}
		if _, _, bound := e.backing(t, ro.Path); bound {
			t.Fatalf("%s still bound after its Detach", ro.Path)
		}
		if _, _, bound := e.backing(t, rw.Path); !bound {
			t.Fatalf("detaching the read-only view released the writer %s too", rw.Path)
		}
	})
}

// TestNeverTouchesAnotherFilesDevice: a device that the kernel now reports
// bound to another file (it was detached and reused behind our back) is
// neither reused by Attach nor released by Detach.
func TestNeverTouchesAnotherFilesDevice(t *testing.T) {
	e := newFakeEnv(t, loop.Config{})
	img, pc := e.published(t, "pvc-identity", backend.SingleNodeWriter, false)
	req := backend.AttachRequest{ImageID: img.ID, NodeID: "n1", PublishContext: pc}
	first := e.attach(t, req)
	e.fake.Devices[first.Path].BackingFile = "/var/lib/other/tenant.img"

	second := e.attach(t, req)
	if second.Path == first.Path {
		t.Fatalf("Attach reused %s, which is bound to another file", first.Path)
	}
	devs, err := e.inst.Attacher.Devices(t.Context(), img.ID)
	if err != nil || len(devs) != 1 || devs[0].Path != second.Path {
		t.Fatalf("Devices = %+v, %v; want only %s", devs, err, second.Path)
	}
	for _, path := range []string{first.Path, ""} {
		if err := e.inst.Attacher.Detach(t.Context(), img.ID, path); err != nil {
			t.Fatalf("Detach(%q): %v", path, err)
		}
		if _, ok := e.fake.Devices[first.Path]; !ok {
			t.Fatalf("Detach(%q) released %s, bound to another file", path, first.Path)
		}
	}
	if slices.Contains(e.fake.Calls, "detach "+first.Path) {
		t.Fatalf("calls %v detached the foreign device", e.fake.Calls)
	}
	if _, ok := e.fake.Devices[second.Path]; ok {
		t.Fatalf("Detach of every device kept the image's own %s", second.Path)
	}
}

func TestDetachRefusesBusyDevice(t *testing.T) {
	bothDrivers(t, func(t *testing.T, e *env) {
		img, pc := e.published(t, "pvc-busy", backend.SingleNodeWriter, false)
		dev := e.attach(t, backend.AttachRequest{ImageID: img.ID, NodeID: "n1", PublishContext: pc})
		release := e.holdBusy(t, dev.Path)
		for _, path := range []string{dev.Path, ""} {
			err := e.inst.Attacher.Detach(t.Context(), img.ID, path)
			testutil.WantKind(t, err, errdefs.ErrPrecondition, dev.Path)
			if _, _, bound := e.backing(t, dev.Path); !bound {
				t.Fatalf("Detach(%q) released a busy device", path)
			}
			// Refused before "losetup -d": that would arm autoclear, and the
			// device would vanish under the mount's owner at unmount.
			if e.armed(t, dev.Path) {
				t.Fatalf("the refused Detach(%q) armed autoclear on %s", path, dev.Path)
			}
		}
		release()
		if err := e.inst.Attacher.Detach(t.Context(), img.ID, dev.Path); err != nil {
			t.Fatalf("Detach once the device is free: %v", err)
		}
		if _, _, bound := e.backing(t, dev.Path); bound {
			t.Fatalf("%s still bound after Detach", dev.Path)
		}
	})
}

// TestDetachOfDeviceHeldOpen: "losetup -d" on a device that a process
// holds open (without O_EXCL, so InUse does not see it) succeeds but only
// arms autoclear; the device stays bound and writable until the last close.
// Detach must not report that as released, and Attach must not hand the
// doomed device out again.
func TestDetachOfDeviceHeldOpen(t *testing.T) {
	bothDrivers(t, func(t *testing.T, e *env) {
		img, pc := e.published(t, "pvc-held", backend.SingleNodeWriter, false)
		req := backend.AttachRequest{ImageID: img.ID, NodeID: "n1", PublishContext: pc}
		dev := e.attach(t, req)
		release := e.holdOpen(t, dev.Path)

		err := e.inst.Attacher.Detach(t.Context(), img.ID, dev.Path)
		testutil.WantKind(t, err, errdefs.ErrPrecondition, dev.Path, "held open")
		if !e.armed(t, dev.Path) {
			t.Fatalf("setup: the deferred detach of %s did not arm autoclear", dev.Path)
		}
		if file, _, bound := e.backing(t, dev.Path); !bound || file != e.store.ImagePath(img.ID) {
			t.Fatalf("%s bound=%t to %q; the held device is still the image's", dev.Path, bound, file)
		}

		again := e.attach(t, req)
		if again.Path == dev.Path {
			t.Fatalf("Attach reused %s, whose release is already armed", dev.Path)
		}

		release()
		if err := e.inst.Attacher.Detach(t.Context(), img.ID, dev.Path); err != nil {
			t.Fatalf("Detach once the holder closed the device: %v", err)
		}
		if _, _, bound := e.backing(t, dev.Path); bound {
			t.Fatalf("%s is still bound after its holder closed it", dev.Path)
		}
		if _, _, bound := e.backing(t, again.Path); !bound {
			t.Fatalf("releasing %s took the new device %s with it", dev.Path, again.Path)
		}
	})
}

// TestDetachAfterDelete: the image file was removed while a device still
// held it (a volume deleted under a node that never unstaged). The device
// is not offered again but is still released.
func TestDetachAfterDelete(t *testing.T) {
	bothDrivers(t, func(t *testing.T, e *env) {
		img, pc := e.published(t, "pvc-orphan", backend.SingleNodeWriter, false)
		dev := e.attach(t, backend.AttachRequest{ImageID: img.ID, NodeID: "n1", PublishContext: pc})
		if err := e.inst.Exporter.Unpublish(t.Context(), img.ID, "n1"); err != nil {
			t.Fatal(err)
		}
		if err := e.inst.Store.Delete(t.Context(), img.ID); err != nil {
			t.Fatal(err)
		}
		e.imageUnlinked(img.ID)
		if file, deleted, bound := e.backing(t, dev.Path); !bound || !deleted || file != e.store.ImagePath(img.ID) {
			t.Fatalf("setup: %s bound=%t to %q deleted=%t", dev.Path, bound, file, deleted)
		}
		devs, err := e.inst.Attacher.Devices(t.Context(), img.ID)
		if err != nil || len(devs) != 0 {
			t.Fatalf("Devices = %+v, %v; a device of a deleted file is not the image's", devs, err)
		}
		// A new volume of the same name gets a new device, not the orphan.
		img2, pc2 := e.published(t, "pvc-orphan", backend.SingleNodeWriter, false)
		dev2 := e.attach(t, backend.AttachRequest{ImageID: img2.ID, NodeID: "n1", PublishContext: pc2})
		if dev2.Path == dev.Path {
			t.Fatalf("Attach reused %s, bound to the deleted image", dev.Path)
		}
		if err := e.inst.Attacher.Detach(t.Context(), img.ID, dev.Path); err != nil {
			t.Fatalf("Detach of the orphan: %v", err)
		}
		if _, _, bound := e.backing(t, dev.Path); bound {
			t.Fatalf("the orphan %s is still bound", dev.Path)
		}
		if _, _, bound := e.backing(t, dev2.Path); !bound {
			t.Fatalf("detaching the orphan released the new volume's %s", dev2.Path)
		}
	})
}

func TestAttachNoFreeLoopDevice(t *testing.T) {
	e := newFakeEnv(t, loop.Config{})
	e.fake.Max = 1
	a, pcA := e.published(t, "pvc-a", backend.SingleNodeWriter, false)
	e.attach(t, backend.AttachRequest{ImageID: a.ID, NodeID: "n1", PublishContext: pcA})
	b, pcB := e.published(t, "pvc-b", backend.SingleNodeWriter, false)
	_, err := e.inst.Attacher.Attach(t.Context(), backend.AttachRequest{ImageID: b.ID, NodeID: "n1", PublishContext: pcB})
	testutil.WantKind(t, err, errdefs.ErrExhausted)
}

func TestProbe(t *testing.T) {
	e := newFakeEnv(t, loop.Config{})
	if err := e.inst.Attacher.Probe(t.Context()); err != nil {
		t.Fatalf("Probe of a usable pool: %v", err)
	}
	if err := os.RemoveAll(e.store.Dir()); err != nil {
		t.Fatal(err)
	}
	testutil.WantKind(t, e.inst.Attacher.Probe(t.Context()), errdefs.ErrUnavailable, e.store.Dir())
	testutil.WantKind(t, e.inst.Store.Probe(t.Context()), errdefs.ErrUnavailable, e.store.Dir())
}

// TestMaxProvisionedBytes: the cap counts every image's full size (they are
// sparse, so free space alone would overcommit the pool).
func TestMaxProvisionedBytes(t *testing.T) {
	e := newFakeEnv(t, loop.Config{MaxProvisionedBytes: 8 * mib})
	ctx := t.Context()
	create := func(name string, size int64) (*backend.Image, error) {
		return e.inst.Store.Create(ctx, backend.VolumeSpec{Name: name, CapacityBytes: size, AccessType: backend.AccessBlock})
	}
	a, err := create("pvc-a", 4*mib)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := create("pvc-b", 4*mib); err != nil {
		t.Fatalf("an image that fills the cap exactly: %v", err)
	}
	_, err = create("pvc-c", 1)
	testutil.WantKind(t, err, errdefs.ErrExhausted, "8388608")
	// A repeat of an existing volume takes no new space.
	if _, err := create("pvc-a", 4*mib); err != nil {
		t.Fatalf("repeated Create at the cap: %v", err)
	}
	if err := e.inst.Store.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := create("pvc-c", 4*mib); err != nil {
		t.Fatalf("Create after Delete freed the cap: %v", err)
	}
}

// TestCreateENOSPC exhausts the inodes of a real tmpfs pool so that the
// filesystem itself fails the create at each of its steps (the free-space
// check passes: the space is there). Every time Create reports exhaustion
// and leaves the pool as it was.
func TestCreateENOSPC(t *testing.T) {
	// 0: the image file fails; 1: the record fails after the image was made.
	for _, freeInodes := range []int{0, 1} {
		t.Run(fmt.Sprintf("%d free inodes", freeInodes), func(t *testing.T) {
			pool := filepath.Join(t.TempDir(), "pool")
			mountTmpfs(t, pool, "size=16m,nr_inodes=64,mode=0750")
			fake := blockdev.NewFakeLoopDevices()
			inst, err := loop.NewWithLoopDevices("enospc", loop.Config{PoolDir: pool}, fake)
			if err != nil {
				t.Fatal(err)
			}
			e := &env{inst: inst, store: inst.Store.(*filestore.Store), fake: fake}
			ctx := t.Context()
			spec := backend.VolumeSpec{Name: "pvc-enospc", CapacityBytes: 4 * mib, AccessType: backend.AccessBlock}
			// One successful create first, so the pool lock file exists.
			if _, err := e.inst.Store.Create(ctx, backend.VolumeSpec{Name: "pvc-first", CapacityBytes: mib, AccessType: backend.AccessBlock}); err != nil {
				t.Fatal(err)
			}

			// Use up every inode, then give back exactly freeInodes.
			var filled []string
			for i := 0; ; i++ {
				p := filepath.Join(pool, fmt.Sprintf("filler-%d", i))
				f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
				if errors.Is(err, unix.ENOSPC) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				_ = f.Close()
				filled = append(filled, p)
				if i > 1000 {
					t.Fatal("the tmpfs inode limit did not take effect")
				}
			}
			for _, p := range filled[:freeInodes] {
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
			}
			filled = filled[freeInodes:]

			before, err := e.artifacts(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, err = e.inst.Store.Create(ctx, spec)
			testutil.WantKind(t, err, errdefs.ErrExhausted)
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("error %v does not carry the filesystem's ENOSPC", err)
			}
			after, err := e.artifacts(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(before, after) {
				t.Fatalf("the failed Create changed the pool:\nbefore %q\nafter  %q", before, after)
			}
			_, err = e.inst.Store.Get(ctx, filestore.ImageIDForName(spec.Name))
			testutil.WantKind(t, err, errdefs.ErrNotFound)

			for _, p := range filled {
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
			}
			img, err := e.inst.Store.Create(ctx, spec)
			if err != nil {
				t.Fatalf("Create once space is back: %v", err)
			}
			if img.CapacityBytes != spec.CapacityBytes {
				t.Fatalf("CapacityBytes = %d, want %d", img.CapacityBytes, spec.CapacityBytes)
			}
		})
	}
}

// TestTwoInstancesShareThePool: the controller and the node plugins open
// the same pool directory each with its own instance; the pool flock, not a
// mutex in one process, keeps them consistent.
func TestTwoInstancesShareThePool(t *testing.T) {
	insts := sharedPoolInstances(t)
	ctx := t.Context()
	for _, n := range []string{"n1", "n2"} {
		if err := insts[1].Attacher.RegisterNode(ctx, backend.NodeInfo{NodeID: n}); err != nil {
			t.Fatal(err)
		}
	}
	spec := backend.VolumeSpec{Name: "pvc-shared", CapacityBytes: 4 * mib, AccessType: backend.AccessBlock}
	const rounds = 8
	ids := make([]string, 2*rounds)
	errs := make([]error, 2*rounds)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			img, err := insts[i%2].Store.Create(ctx, spec)
			errs[i] = err
			if err == nil {
				ids[i] = img.ID
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if u := slices.Compact(slices.Sorted(slices.Values(ids))); len(u) != 1 {
		t.Fatalf("two instances created %v for one name", u)
	}

	// Two nodes race to publish a single-node volume, each through its own
	// instance: exactly one wins.
	pubErrs := make([]error, 2)
	for i, n := range []string{"n1", "n2"} {
		wg.Go(func() {
			_, pubErrs[i] = insts[i].Exporter.Publish(ctx, ids[0], backend.Attachment{NodeID: n, AccessMode: backend.SingleNodeWriter})
		})
	}
	wg.Wait()
	if (pubErrs[0] == nil) == (pubErrs[1] == nil) {
		t.Fatalf("publish results %v: want exactly one node granted", pubErrs)
	}
	img, err := insts[0].Store.Get(ctx, ids[0])
	if err != nil || len(img.Attachments) != 1 {
		t.Fatalf("Get = %+v, %v; want one attachment", img, err)
	}
}

// sharedPoolInstances opens one pool directory twice, as a controller and a
// node plugin (or two controllers) do, each instance with its own fake loop
// driver: only the pool's flock ties them together.
func sharedPoolInstances(t *testing.T) [2]*backend.Instance {
	t.Helper()
	pool := filepath.Join(t.TempDir(), "pool")
	var insts [2]*backend.Instance
	for i := range insts {
		inst, err := loop.NewWithLoopDevices("shared", loop.Config{PoolDir: pool}, blockdev.NewFakeLoopDevices())
		if err != nil {
			t.Fatal(err)
		}
		insts[i] = inst
	}
	return insts
}

// AttachedDevices lists every device bound to an image of the pool, with
// its image, including one whose image was deleted under it, and nothing
// bound to a file elsewhere.
func TestAttachedDevicesListsThePoolsDevices(t *testing.T) {
	bothDrivers(t, func(t *testing.T, e *env) {
		kept, pc := e.published(t, "pvc-kept", backend.SingleNodeWriter, false)
		keptDev := e.attach(t, backend.AttachRequest{ImageID: kept.ID, NodeID: "n1", PublishContext: pc})
		gone, pc2 := e.published(t, "pvc-gone", backend.SingleNodeWriter, false)
		goneDev := e.attach(t, backend.AttachRequest{ImageID: gone.ID, NodeID: "n1", PublishContext: pc2, ReadOnly: true})
		if err := e.inst.Exporter.Unpublish(t.Context(), gone.ID, "n1"); err != nil {
			t.Fatal(err)
		}
		if err := e.inst.Store.Delete(t.Context(), gone.ID); err != nil {
			t.Fatal(err)
		}
		e.imageUnlinked(gone.ID)
		if e.fake != nil {
			// Some other user's loop device, outside the pool.
			if _, err := e.fake.Attach(t.Context(), filepath.Join(t.TempDir(), "other.img"), false, true); err != nil {
				t.Fatal(err)
			}
		}

		got, err := e.inst.Attacher.(backend.DeviceLister).AttachedDevices(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]backend.AttachedDevice{
			keptDev.Path: {ImageID: kept.ID, Device: backend.Device{Path: keptDev.Path}},
			goneDev.Path: {ImageID: gone.ID, Device: backend.Device{Path: goneDev.Path, ReadOnly: true}, ImageDeleted: true},
		}
		if len(got) != len(want) {
			t.Fatalf("AttachedDevices = %+v, want %+v", got, want)
		}
		for _, d := range got {
			if w, ok := want[d.Path]; !ok || d != w {
				t.Errorf("AttachedDevices has %+v, want %+v", d, w)
			}
		}
		// The deleted image's device goes with the Detach of its image ID.
		if err := e.inst.Attacher.Detach(t.Context(), gone.ID, goneDev.Path); err != nil {
			t.Fatal(err)
		}
	})
}

// losetupTimesOut is a loop driver whose Get fails with an error of no
// kind, as a losetup that ran out of time does.
type losetupTimesOut struct{ *blockdev.FakeLoopDevices }

func (losetupTimesOut) Get(context.Context, string) (*blockdev.LoopDevice, error) {
	return nil, errors.New("losetup --json --list /dev/loop0: context deadline exceeded after 30s")
}

// TestIdentifyKeepsAnErrorOfNoKind: a losetup that failed is that failure,
// never taken for a device (it was, and Identify went on with no device).
func TestIdentifyKeepsAnErrorOfNoKind(t *testing.T) {
	inst, err := loop.NewWithLoopDevices("timeout", loop.Config{PoolDir: t.TempDir()}, losetupTimesOut{blockdev.NewFakeLoopDevices()})
	if err != nil {
		t.Fatal(err)
	}
	dev, err := inst.Attacher.Identify(t.Context(), "pvc-any", "/dev/loop0")
	if err == nil || dev != nil {
		t.Fatalf("Identify = %v, %v; want losetup's error", dev, err)
	}
	if !strings.Contains(err.Error(), "deadline exceeded") || errdefs.KindOf(err) != nil {
		t.Fatalf("Identify error = %v (kind %v); want losetup's own error, of no kind", err, errdefs.KindOf(err))
	}
}

// TestDeviceFromARestartedContainer: a device bound by a node plugin
// container that has since restarted shows its image's path below the
// container's gone mount ("/pvc-….img"); the restarted plugin still
// identifies it as the volume's, lists it, finds it again at a repeated
// attach (no second device), and detaches it.
func TestDeviceFromARestartedContainer(t *testing.T) {
	e := newFakeEnv(t, loop.Config{})
	img, pc := e.published(t, "pvc-restarted", backend.SingleNodeWriter, false)
	req := backend.AttachRequest{ImageID: img.ID, NodeID: "n1", PublishContext: pc}
	dev := e.attach(t, req)
	e.fake.ShowFromGoneMount(dev.Path)
	if file, _, _ := e.backing(t, dev.Path); !strings.HasPrefix(file, "/pvc-") {
		t.Fatalf("the fake shows %s bound to %q, want the path below a gone mount", dev.Path, file)
	}
	got, err := e.inst.Attacher.Identify(t.Context(), img.ID, dev.Path)
	if err != nil || got.Path != dev.Path {
		t.Fatalf("Identify(%s) = %+v, %v; want the volume's device", dev.Path, got, err)
	}
	devs, err := e.inst.Attacher.Devices(t.Context(), img.ID)
	if err != nil || len(devs) != 1 || devs[0].Path != dev.Path {
		t.Errorf("Devices = %+v, %v; want %s", devs, err, dev.Path)
	}
	again, err := e.inst.Attacher.Attach(t.Context(), req)
	if err != nil || again.Path != dev.Path {
		t.Errorf("a repeated Attach = %+v, %v; want %s again, no second device", again, err, dev.Path)
	}
	if err := e.inst.Attacher.Detach(t.Context(), img.ID, dev.Path); err != nil {
		t.Fatal(err)
	}
	if _, _, bound := e.backing(t, dev.Path); bound {
		t.Errorf("%s is still bound after Detach", dev.Path)
	}
}
