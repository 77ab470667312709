package rbd_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	utilexec "k8s.io/utils/exec"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/rbd"
	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/ceph/cephfake"
	"github.com/spindle-csi/spindle/internal/ceph/cephtest"
	"github.com/spindle-csi/spindle/internal/command"
)

// The store's tests run on every cluster there is: the in-memory one
// (cephfake, always: no root, no Ceph, seconds), and a real one where the
// package is built with -tags ceph and runs inside a Ceph root
// (ceph_env_test.go sets realCluster; `make test` runs it so). What
// needs data (checksums, ceph df) runs where the cluster keeps data.

const (
	MiB = int64(1) << 20
	GiB = int64(1) << 30
)

// testCluster is one cluster as the store's tests use it.
type testCluster struct {
	name     string      // "fake" or "ceph", the subtest's name
	dialer   ceph.Dialer // the client the store gets
	monitors []string
	pool     string
	user     string
	key      string
	keyFile  string
	admin    cephtest.Admin // another client's doings: protect, clone v1, watch, lock
	// direct is a client for the test's own calls, around no fault.
	direct ceph.Client
	// everything lists what the pool holds: "image", "image@snap" (other
	// namespaces in angle brackets), "trash:name".
	everything func(ctx context.Context) ([]string, error)
	// copyImage is "rbd cp src@snap dst" (the fake copies no data).
	copyImage func(ctx context.Context, src ceph.ImageSpec, snap string, dst ceph.ImageSpec) error
	// data is nil on the fake.
	data dataCluster
	fake *cephfake.Cluster // nil on a real cluster
}

// dataCluster reads and writes images and the pool's statistics.
type dataCluster interface {
	WriteRandom(ctx context.Context, image string, n int64, seed uint64) (string, error)
	Checksum(ctx context.Context, image string, n int64) (string, error)
	PoolUsed(ctx context.Context) (int64, error)
}

// realCluster gives the real cluster of a test (it skips t when there is
// none); nil unless the package is built with -tags ceph.
var realCluster func(t *testing.T) *testCluster

// forEachCluster runs fn on the fake cluster and on the real one.
func forEachCluster(t *testing.T, fn func(t *testing.T, c *testCluster)) {
	t.Run("fake", func(t *testing.T) { fn(t, fakeCluster(t)) })
	if realCluster != nil {
		t.Run("ceph", func(t *testing.T) { fn(t, realCluster(t)) })
	}
}

// fakeCluster is a fresh in-memory cluster with the test pool.
func fakeCluster(t *testing.T) *testCluster {
	f := cephfake.New(cephtest.Pool, cephtest.OtherPool)
	return &testCluster{
		name: "fake", dialer: f.Dialer(), monitors: []string{"v2:127.0.0.1:3300"}, pool: cephtest.Pool,
		user: "admin", key: cephfake.AdminKey, keyFile: writeKey(t, cephfake.AdminKey),
		admin: fakeAdmin{f}, direct: f.Client(), fake: f,
		everything: func(context.Context) ([]string, error) {
			return f.Everything(ceph.PoolSpec{Pool: cephtest.Pool}), nil
		},
		copyImage: func(ctx context.Context, src ceph.ImageSpec, snap string, dst ceph.ImageSpec) error {
			info, err := f.Client().StatImage(ctx, src, snap)
			if err == nil {
				err = f.Client().CreateImage(ctx, dst, info.Size, ceph.ImageOptions{Features: info.Features})
			}
			return err
		},
	}
}

func writeKey(t *testing.T, key string) string {
	t.Helper()
	f := t.TempDir() + "/key"
	if err := os.WriteFile(f, []byte(key), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// fakeAdmin is cephtest.Admin on the fake.
type fakeAdmin struct{ c *cephfake.Cluster }

func (a fakeAdmin) Protect(_ context.Context, s ceph.ImageSpec, snap string) error {
	return a.c.Protect(s, snap)
}

func (a fakeAdmin) CloneV1(_ context.Context, parent ceph.ImageSpec, snap string, child ceph.ImageSpec) error {
	return a.c.CloneV1(parent, snap, child)
}

func (a fakeAdmin) Watch(_ context.Context, s ceph.ImageSpec) (string, func(), error) {
	const addr = "10.0.0.7:0/3411306950"
	stop, err := a.c.Watch(s, addr)
	return addr, stop, err
}

func (a fakeAdmin) Lock(_ context.Context, s ceph.ImageSpec, cookie string) error {
	return a.c.Lock(s, ceph.Lock{Client: "client.4152", Cookie: cookie, Addr: "10.0.0.7:0/3411306950"})
}

// spec is an image of the test pool.
func (c *testCluster) spec(image string) ceph.ImageSpec {
	return ceph.PoolSpec{Pool: c.pool}.Image(image)
}

// faults injects failures into the store's calls (cephtest.Intercept):
// fail, when set, answers each call first.
type faults struct {
	mu   sync.Mutex
	fail func(cephtest.Call) error
	seen []cephtest.Call
	// hold runs before each call outside mu, so that it may block one
	// call while others go on.
	hold func(cephtest.Call)
}

// holdCalls sets (nil: clears) a function run before each call, outside
// the lock that serialises fail.
func (f *faults) holdCalls(fn func(cephtest.Call)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hold = fn
}

func (f *faults) set(fn func(cephtest.Call) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = fn
}

func (f *faults) hook(_ context.Context, call cephtest.Call) error {
	f.mu.Lock()
	hold := f.hold
	f.mu.Unlock()
	if hold != nil {
		hold(call)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen = append(f.seen, call)
	if f.fail != nil {
		return f.fail(call)
	}
	return nil
}

// calls returns the calls seen since the last reset.
func (f *faults) calls() []cephtest.Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.seen)
}

func (f *faults) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen = nil
}

// keep, given to controller, leaves the cluster as it is: a second
// controller process on it.
type keepCluster struct{}

var keep = keepCluster{}

// controller is an instance "test" on c as the controller sees it (its own
// identity for Maintain), its calls through faults, the cluster emptied
// first (and a real one after the test too) unless keep is given; ctx
// carries the admin's secrets, as the sidecars' requests carry a class's.
func controller(t *testing.T, c *testCluster, cfg rbd.Config, opts ...keepCluster) (*backend.Instance, *rbd.Store, context.Context, *faults) {
	t.Helper()
	switch {
	case len(opts) > 0:
	case c.fake != nil:
		c.fake.Reset()
	default:
		wipe(t, c)
	}
	f := &faults{}
	cfg.ClusterID, cfg.Monitors, cfg.Pool = "test", c.monitors, c.pool
	cfg.UserID, cfg.KeyFile = c.user, c.keyFile
	if cfg.Mounter == "" {
		cfg.Mounter = rbd.MounterFuse
	}
	if cfg.FuseDir == "" {
		cfg.FuseDir, cfg.StateDir = t.TempDir()+"/fuse", t.TempDir()+"/state"
	}
	inst, err := rbd.NewWithDialer("test", cfg, command.New(utilexec.New(), nil), cephtest.Intercept(c.dialer, f.hook))
	if err != nil {
		t.Fatal(err)
	}
	ctx := backend.WithSecrets(t.Context(), map[string]string{rbd.SecretUserID: c.user, rbd.SecretUserKey: c.key})
	return inst, inst.Store.(*rbd.Store), ctx, f
}

// wipe empties a real cluster's pool before and after the test.
var wipe = func(*testing.T, *testCluster) {}

func blockVolume(name string, size int64, src *backend.ContentSource) backend.VolumeSpec {
	return backend.VolumeSpec{Name: name, CapacityBytes: size, AccessType: backend.AccessBlock, Source: src}
}

func mustCreate(t *testing.T, ctx context.Context, inst *backend.Instance, spec backend.VolumeSpec) *backend.Image {
	t.Helper()
	img, err := inst.Store.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create %s: %v", spec.Name, err)
	}
	return img
}

func mustSnapshot(t *testing.T, ctx context.Context, inst *backend.Instance, name, source string) *backend.Snapshot {
	t.Helper()
	snap, err := inst.Snapshots.CreateSnapshot(ctx, backend.SnapshotSpec{Name: name, SourceImageID: source})
	if err != nil {
		t.Fatalf("CreateSnapshot %s of %s: %v", name, source, err)
	}
	return snap
}

// imageOf is the image name of an image ID of the pool.
func imageOf(t testing.TB, c *testCluster, id string) string {
	t.Helper()
	image, ok := strings.CutPrefix(id, c.pool+"/")
	if !ok {
		t.Fatalf("image ID %q is not in pool %s", id, c.pool)
	}
	return image
}

// everything lists what the pool holds, sorted.
func everything(t *testing.T, ctx context.Context, c *testCluster) []string {
	t.Helper()
	got, err := c.everything(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	return got
}

// settle runs the controller's upkeep until the pool holds exactly want
// (images, their snapshots in every namespace, the trash): the removal of
// trashed images runs in the background, in the Ceph manager.
func settle(t *testing.T, ctx context.Context, c *testCluster, store *rbd.Store, want ...string) {
	t.Helper()
	slices.Sort(want)
	deadline := time.Now().Add(3 * time.Minute)
	rbd.WaitAnswered(store)
	for {
		if _, err := store.Maintain(ctx); err != nil {
			t.Logf("maintain: %v", err)
		}
		got := everything(t, ctx, c)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			tasks, _ := store.Tasks(ctx)
			t.Fatalf("the pool still holds %q, want %q (background tasks: %+v)", got, want, tasks)
		}
		time.Sleep(time.Second)
	}
}

// writeData writes n seeded bytes to the image where the cluster keeps
// data, and returns their checksum ("" on the fake).
func writeData(t *testing.T, ctx context.Context, c *testCluster, id string, n int64, seed uint64) string {
	t.Helper()
	if c.data == nil {
		return ""
	}
	sum, err := c.data.WriteRandom(ctx, imageOf(t, c, id), n, seed)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// checkData checks the image holds what writeData wrote (on a cluster
// that keeps data).
func checkData(t *testing.T, ctx context.Context, c *testCluster, what, id string, n int64, sum string) {
	t.Helper()
	if c.data == nil {
		return
	}
	if got, err := c.data.Checksum(ctx, imageOf(t, c, id), n); err != nil || got != sum {
		t.Fatalf("%s reads sha256 %s (%v); want %s", what, got, err, sum)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
