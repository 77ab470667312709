package loop_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/loop"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

func TestInstanceFromConfig(t *testing.T) {
	for _, nodeLocal := range []bool{false, true} {
		e := newFakeEnv(t, loop.Config{NodeLocal: nodeLocal})
		if e.inst.NodeLocal != nodeLocal {
			t.Errorf("Config.NodeLocal %t gave Instance.NodeLocal %t", nodeLocal, e.inst.NodeLocal)
		}
		if e.inst.Snapshots == nil {
			t.Errorf("the loop instance takes no snapshots")
		}
	}
}

func TestMutableParameters(t *testing.T) {
	e := newFakeEnv(t, loop.Config{})
	ctx := t.Context()
	img, err := e.inst.Store.Create(ctx, backend.VolumeSpec{Name: "pvc-mutable", CapacityBytes: 4 * mib, AccessType: backend.AccessBlock})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		mutable  map[string]string
		mentions []string // empty: accepted
	}{
		{"direct I/O off", map[string]string{loop.MutableParamDirectIO: "false"}, nil},
		{"direct I/O on", map[string]string{loop.MutableParamDirectIO: "true"}, nil},
		{"not a boolean", map[string]string{loop.MutableParamDirectIO: "yes"}, []string{loop.MutableParamDirectIO, `"yes"`}},
		{"unknown key", map[string]string{"iops": "100"}, []string{`"iops"`, loop.MutableParamDirectIO}},
		{"unknown key beside a valid one", map[string]string{loop.MutableParamDirectIO: "false", "iops": "100"}, []string{`"iops"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, modErr := e.inst.Store.Modify(ctx, img.ID, tt.mutable)
			_, createErr := e.inst.Store.Create(ctx, backend.VolumeSpec{Name: "pvc-mutable-" + strings.ReplaceAll(tt.name, " ", "-"), CapacityBytes: 4 * mib, AccessType: backend.AccessBlock, MutableParameters: tt.mutable})
			if len(tt.mentions) == 0 {
				if modErr != nil || createErr != nil {
					t.Fatalf("Modify: %v; Create: %v", modErr, createErr)
				}
				return
			}
			testutil.WantKind(t, modErr, errdefs.ErrInvalidArgument, tt.mentions...)
			testutil.WantKind(t, createErr, errdefs.ErrInvalidArgument, tt.mentions...)
		})
	}
}

// TestDirectIOReachesLosetup: the image's directIO parameter decides how a
// new device is bound, whether it was set at create or by Modify.
func TestDirectIOReachesLosetup(t *testing.T) {
	tests := []struct {
		name    string
		create  map[string]string // at Create
		modify  map[string]string // then Modify, before the attach
		wantDIO bool
	}{
		{"default", nil, nil, true},
		{"off at create", map[string]string{loop.MutableParamDirectIO: "false"}, nil, false},
		{"off by modify", nil, map[string]string{loop.MutableParamDirectIO: "false"}, false},
		{"back on by modify", map[string]string{loop.MutableParamDirectIO: "false"}, map[string]string{loop.MutableParamDirectIO: "true"}, true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bothDrivers(t, func(t *testing.T, e *env) {
				ctx := t.Context()
				if err := e.inst.Attacher.RegisterNode(ctx, backend.NodeInfo{NodeID: "n1"}); err != nil {
					t.Fatal(err)
				}
				img, err := e.inst.Store.Create(ctx, backend.VolumeSpec{Name: "pvc-dio-" + strconv.Itoa(i), CapacityBytes: 4 * mib, AccessType: backend.AccessBlock, MutableParameters: tt.create})
				if err != nil {
					t.Fatal(err)
				}
				if tt.modify != nil {
					if _, err := e.inst.Store.Modify(ctx, img.ID, tt.modify); err != nil {
						t.Fatal(err)
					}
				}
				pc, err := e.inst.Exporter.Publish(ctx, img.ID, backend.Attachment{NodeID: "n1", AccessMode: backend.SingleNodeWriter})
				if err != nil {
					t.Fatal(err)
				}
				dev := e.attach(t, backend.AttachRequest{ImageID: img.ID, NodeID: "n1", PublishContext: pc})
				if e.fake != nil {
					want := "attach " + e.store.ImagePath(img.ID) + " ro=false"
					if !tt.wantDIO {
						want += " direct-io=off"
					}
					if !slices.Equal(e.fake.Calls, []string{want}) {
						t.Fatalf("loop calls %q, want [%q]", e.fake.Calls, want)
					}
					return
				}
				dio, err := os.ReadFile("/sys/block/" + filepath.Base(dev.Path) + "/loop/dio")
				if err != nil {
					t.Fatal(err)
				}
				got := strings.TrimSpace(string(dio)) == "1"
				// The kernel declines direct I/O on a backing filesystem that
				// cannot do it (losetup then only warns); it never turns it on unasked.
				if tt.wantDIO && !got && !canDirectIO(e.store.ImagePath(img.ID)) {
					t.Skipf("the pool filesystem cannot do direct I/O")
				}
				if got != tt.wantDIO {
					t.Fatalf("%s has direct I/O %t, want %t", dev.Path, got, tt.wantDIO)
				}
			})
		})
	}
}

// TestRefreshAfterExpand: after Expand, Refresh makes the attached device
// as large as the image, and reports that size (read from sysfs on a real
// device).
func TestRefreshAfterExpand(t *testing.T) {
	bothDrivers(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		img, pc := e.published(t, "pvc-refresh", backend.SingleNodeWriter, false)
		dev := e.attach(t, backend.AttachRequest{ImageID: img.ID, NodeID: "n1", PublishContext: pc})
		if _, err := e.inst.Store.Expand(ctx, img.ID, 12*mib); err != nil {
			t.Fatal(err)
		}
		if e.fake == nil {
			// losetup took the size at attach; the kernel has not looked since.
			if got := sysSize(t, dev.Path); got != 4*mib {
				t.Fatalf("setup: %s is %d bytes before the refresh, want %d", dev.Path, got, 4*mib)
			}
		}
		size, err := e.inst.Attacher.Refresh(ctx, img.ID, dev.Path)
		if err != nil {
			t.Fatal(err)
		}
		if size != 12*mib {
			t.Fatalf("Refresh = %d bytes, want %d", size, 12*mib)
		}
		if e.fake == nil {
			if got := sysSize(t, dev.Path); got != 12*mib {
				t.Fatalf("/sys/block says %s is %d bytes after the refresh, want %d", dev.Path, got, 12*mib)
			}
		}
	})
}

// canDirectIO reports whether the file's filesystem accepts O_DIRECT.
func canDirectIO(path string) bool {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	_ = unix.Close(fd)
	return true
}

// sysSize reads a block device's size from sysfs, in bytes.
func sysSize(t *testing.T, dev string) int64 {
	t.Helper()
	data, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/size")
	if err != nil {
		t.Fatal(err)
	}
	sectors, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return sectors * 512
}

// TestRefreshProvesTheDevice: Refresh never touches a device that is not
// the image's.
func TestRefreshProvesTheDevice(t *testing.T) {
	e := newFakeEnv(t, loop.Config{})
	ctx := t.Context()
	img, pc := e.published(t, "pvc-refresh-a", backend.SingleNodeWriter, false)
	dev := e.attach(t, backend.AttachRequest{ImageID: img.ID, NodeID: "n1", PublishContext: pc})
	other, _ := e.published(t, "pvc-refresh-b", backend.SingleNodeWriter, false)
	for _, path := range []string{dev.Path, "/dev/loop99"} {
		_, err := e.inst.Attacher.Refresh(ctx, other.ID, path)
		testutil.WantKind(t, err, errdefs.ErrNotFound, path)
	}
	if slices.ContainsFunc(e.fake.Calls, func(c string) bool { return strings.HasPrefix(c, "set-capacity") }) {
		t.Fatalf("a refused Refresh ran %v", e.fake.Calls)
	}
}

func TestAttachLimit(t *testing.T) {
	e := newFakeEnv(t, loop.Config{})
	ctx := t.Context()
	if err := e.inst.Attacher.RegisterNode(ctx, backend.NodeInfo{NodeID: "n-small", MaxVolumesPerNode: 1}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, name := range []string{"pvc-a", "pvc-b"} {
		img, err := e.inst.Store.Create(ctx, backend.VolumeSpec{Name: name, CapacityBytes: 4 * mib, AccessType: backend.AccessBlock})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, img.ID)
	}
	publish := func(id string) error {
		_, err := e.inst.Exporter.Publish(ctx, id, backend.Attachment{NodeID: "n-small", AccessMode: backend.SingleNodeWriter})
		return err
	}
	if err := publish(ids[0]); err != nil {
		t.Fatal(err)
	}
	testutil.WantKind(t, publish(ids[1]), errdefs.ErrExhausted, `"n-small"`, "MaxVolumesPerNode=1", "loop/test")
	if err := publish(ids[0]); err != nil {
		t.Fatalf("a repeated publish at the limit: %v", err)
	}
	// Raising the limit (a node plugin restarted with another one) takes effect.
	if err := e.inst.Attacher.RegisterNode(ctx, backend.NodeInfo{NodeID: "n-small", MaxVolumesPerNode: 2}); err != nil {
		t.Fatal(err)
	}
	if err := publish(ids[1]); err != nil {
		t.Fatalf("publish once the limit was raised: %v", err)
	}
}

// TestAttachLimitRace: two instances (a controller restarting, two
// controllers on a shared pool) race to publish two volumes to a node with
// room for one. The count and the grant happen under one pool lock, so
// exactly one wins.
func TestAttachLimitRace(t *testing.T) {
	insts := sharedPoolInstances(t)
	ctx := t.Context()
	if err := insts[0].Attacher.RegisterNode(ctx, backend.NodeInfo{NodeID: "n-one", MaxVolumesPerNode: 1}); err != nil {
		t.Fatal(err)
	}
	const rounds = 10
	for r := range rounds {
		var ids [2]string
		for i := range ids {
			img, err := insts[i].Store.Create(ctx, backend.VolumeSpec{Name: "pvc-race-" + strconv.Itoa(r) + "-" + strconv.Itoa(i), CapacityBytes: mib, AccessType: backend.AccessBlock})
			if err != nil {
				t.Fatal(err)
			}
			ids[i] = img.ID
		}
		var errs [2]error
		var wg sync.WaitGroup
		for i := range ids {
			wg.Go(func() {
				_, errs[i] = insts[i].Exporter.Publish(ctx, ids[i], backend.Attachment{NodeID: "n-one", AccessMode: backend.SingleNodeWriter})
			})
		}
		wg.Wait()
		won := 0
		for i, err := range errs {
			switch {
			case err == nil:
				won++
				if err := insts[i].Exporter.Unpublish(ctx, ids[i], "n-one"); err != nil {
					t.Fatal(err)
				}
			case errdefs.KindOf(err) != errdefs.ErrExhausted:
				t.Fatalf("round %d: the losing publish failed with %v, want exhaustion", r, err)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d publishes won the last slot (%v)", r, won, errors.Join(errs[:]...))
		}
	}
}
