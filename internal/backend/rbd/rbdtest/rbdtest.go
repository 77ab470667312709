//go:build cgo && ceph

// Package rbdtest starts one real, throw-away Ceph cluster per test binary
// (cephtest.Start: hack/ceph-up.sh's 1 mon, 1 mgr, 1 memstore OSD on
// 127.0.0.1, ports of its own, everything under one temporary directory)
// and stops it when the binary's tests end, and reads and writes images
// for the tests through librbd. Its tests run inside a Ceph root (the
// Makefile runs them through hack/ceph/run, with the build tag "ceph");
// tests that need the cluster call Require, which skips them, saying
// exactly why, when it could not start.
//
//	func TestMain(m *testing.M) { os.Exit(rbdtest.Main(m)) }
package rbdtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/ceph/cephtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Pool is the pool every test cluster has (and cephtest.OtherPool).
const Pool = cephtest.Pool

// OSDBytes is the size of the test cluster's memstore OSD: room for the
// GiBs of real data the snapshot tests write (memstore holds only what is
// written, in memory), under Ceph's full ratio of 95 %.
const OSDBytes = 6 << 30

// Cluster is the running test cluster.
type Cluster struct {
	*cephtest.Cluster
	Mounter string // how the tests map images (EnvMounter)
	once    sync.Once
	dialer  ceph.Dialer
}

var (
	current       *Cluster
	missingReason string
)

// Main starts the cluster, runs the tests and stops it.
func Main(m *testing.M) int {
	c, err := start()
	if err != nil {
		missingReason = err.Error()
		fmt.Fprintf(os.Stderr, "rbdtest: the Ceph tests will fail: %s\n", missingReason)
	} else {
		current = c
		fmt.Fprintf(os.Stderr, "rbdtest: Ceph %s up in %s (mon %s, dir %s); client of the root %s\n", c.Release, c.StartUp.Round(time.Millisecond), c.Monitor, c.Dir, c.ClientRelease)
	}
	code := m.Run()
	if c != nil {
		c.Stop()
	}
	return code
}

// Require returns the cluster or fails t with the reason it is missing: the
// Ceph tier (-tags ceph, in a Ceph root) promises one.
func Require(t testing.TB) *Cluster {
	t.Helper()
	if current == nil {
		if missingReason == "" {
			missingReason = "rbdtest.Main did not run (the package's TestMain must call it)"
		}
		t.Fatalf("no Ceph cluster: %s", missingReason)
	}
	return current
}

func start() (*Cluster, error) {
	mounter, err := mounterFromEnv()
	if err != nil {
		return nil, err
	}
	if err := requireMounter(mounter); err != nil {
		return nil, err
	}
	c, err := cephtest.Start(OSDBytes)
	if err != nil {
		return nil, err
	}
	return &Cluster{Cluster: c, Mounter: mounter}, nil
}

// client is a Ceph client of the cluster as its admin (the real one,
// through librados and librbd), for the tests' own listings and cleanup.
func (c *Cluster) client(ctx context.Context) (ceph.Client, error) {
	c.once.Do(func() { c.dialer = ceph.NewDialer() })
	return c.dialer.Dial(ctx, c.Target())
}

func (c *Cluster) pool() ceph.PoolSpec { return ceph.PoolSpec{Pool: c.Pool} }

// Artifacts lists every image and user snapshot of the pool ("image",
// "image@snap"), for the conformance suite's leftover checks.
func (c *Cluster) Artifacts(ctx context.Context) ([]string, error) {
	cl, err := c.client(ctx)
	if err != nil {
		return nil, err
	}
	names, err := cl.ListImages(ctx, c.pool())
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		out = append(out, n)
		snaps, err := cl.Snapshots(ctx, c.pool().Image(n))
		if errdefs.KindOf(err) == errdefs.ErrNotFound {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, s := range snaps {
			if s.Namespace == ceph.SnapUser {
				out = append(out, n+"@"+s.Name)
			}
		}
	}
	return out, nil
}

// Wipe removes every image of the pool and its trash, whatever state they
// are in, in passes: each pass breaks locks, unprotects and removes
// snapshots and removes every image and trash entry that no clone hangs
// from any more, so clones go before their parents (nothing is flattened:
// that would copy the data).
func (c *Cluster) Wipe(ctx context.Context) error {
	cl, err := c.client(ctx)
	if err != nil {
		return err
	}
	p := c.pool()
	stuck := 0
	for {
		names, err := cl.ListImages(ctx, p)
		if err != nil {
			return err
		}
		trash, err := cl.Trash(ctx, p)
		if err != nil {
			return err
		}
		if len(names)+len(trash) == 0 {
			return nil
		}
		var errs []error
		for _, n := range names {
			img := p.Image(n)
			locks, _ := cl.Locks(ctx, img)
			for _, l := range locks {
				_ = cl.BreakLock(ctx, img, l)
			}
			snaps, _ := cl.Snapshots(ctx, img)
			for _, s := range snaps {
				if s.Namespace == ceph.SnapUser {
					_ = cl.UnprotectSnapshot(ctx, img, s.Name)
					_ = cl.RemoveSnapshot(ctx, img, s.Name)
				}
			}
			if err := cl.RemoveImage(ctx, img); err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
				errs = append(errs, err)
			}
		}
		for _, e := range trash {
			if err := cl.TrashRemove(ctx, p, e.ID); err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
				errs = append(errs, err)
			}
		}
		if len(errs) < len(names)+len(trash) {
			stuck = 0
			continue
		}
		// No progress: the Ceph manager may be removing a trash entry
		// right now. Give it a few seconds.
		if stuck++; stuck > 10 {
			return errors.Join(errs...)
		}
		time.Sleep(time.Second)
	}
}

// Trash lists the pool's trash.
func (c *Cluster) Trash(ctx context.Context) ([]ceph.TrashEntry, error) {
	cl, err := c.client(ctx)
	if err != nil {
		return nil, err
	}
	return cl.Trash(ctx, c.pool())
}

// Everything lists every image of the pool with all its snapshots, in any
// namespace ("image@snap", "image@<trash>"), and every trash entry
// ("trash:name"): what a pool that Spindle emptied must not hold.
func (c *Cluster) Everything(ctx context.Context) ([]string, error) {
	cl, err := c.client(ctx)
	if err != nil {
		return nil, err
	}
	p := c.pool()
	names, err := cl.ListImages(ctx, p)
	if err != nil {
		return nil, err
	}
	var out []string
	add := func(name string, snaps []ceph.SnapInfo) {
		out = append(out, name)
		for _, s := range snaps {
			if s.Namespace == ceph.SnapUser {
				out = append(out, name+"@"+s.Name)
			} else {
				out = append(out, name+"@<"+string(s.Namespace)+">")
			}
		}
	}
	for _, n := range names {
		snaps, err := cl.Snapshots(ctx, p.Image(n))
		if errdefs.KindOf(err) == errdefs.ErrNotFound {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		add(n, snaps)
	}
	trash, err := cl.Trash(ctx, p)
	if err != nil {
		return nil, err
	}
	for _, e := range trash {
		snaps, err := cl.SnapshotsOfID(ctx, p, e.ID)
		if errdefs.KindOf(err) == errdefs.ErrNotFound {
			continue
		}
		if err != nil {
			return nil, err
		}
		add("trash:"+e.Name, snaps)
	}
	return out, nil
}

// PoolStored is the pool's "stored" bytes in "ceph df" (user data, before
// replication), as the mgr last heard from the OSD.
func (c *Cluster) PoolStored(ctx context.Context) (int64, error) {
	out, err := c.Ceph(ctx, "df", "--format", "json")
	if err != nil {
		return 0, err
	}
	var df struct {
		Pools []struct {
			Name  string `json:"name"`
			Stats struct {
				Stored int64 `json:"stored"`
			} `json:"stats"`
		} `json:"pools"`
	}
	if err := json.Unmarshal(out, &df); err != nil {
		return 0, fmt.Errorf("ceph df: %w", err)
	}
	for _, p := range df.Pools {
		if p.Name == c.Pool {
			return p.Stats.Stored, nil
		}
	}
	return 0, fmt.Errorf("ceph df does not list pool %s", c.Pool)
}

// AwaitStored polls "ceph df" (the OSD reports its statistics every few
// seconds) until ok accepts the pool's stored bytes, and returns them.
func (c *Cluster) AwaitStored(ctx context.Context, within time.Duration, ok func(int64) bool) (int64, error) {
	deadline := time.Now().Add(within)
	for {
		n, err := c.PoolStored(ctx)
		if err != nil {
			return 0, err
		}
		if ok(n) {
			return n, nil
		}
		if time.Now().After(deadline) {
			return n, fmt.Errorf("pool %s still stores %d bytes after %s", c.Pool, n, within)
		}
		time.Sleep(time.Second)
	}
}

// PoolUsed is "rbd du" of the pool: the bytes its images and their
// snapshots hold, computed by the rbd CLI from the objects themselves.
func (c *Cluster) PoolUsed(ctx context.Context) (int64, error) {
	out, err := c.RBD(ctx, "du", "--format", "json", "--pool", c.Pool)
	if err != nil {
		return 0, err
	}
	var du struct {
		TotalUsedSize int64 `json:"total_used_size"`
	}
	if err := json.Unmarshal(out, &du); err != nil {
		return 0, fmt.Errorf("rbd du: %w", err)
	}
	return du.TotalUsedSize, nil
}

// image opens pool/image for fn through librbd, as the cluster's admin
// (a connection of its own, closed again: its watch goes with it).
func (c *Cluster) image(name string, fn func(*rbd.Image) error) error {
	conn, err := rados.NewConnWithUser(c.User)
	if err != nil {
		return err
	}
	if err := conn.ReadConfigFile(c.Conf); err != nil {
		return err
	}
	if err := conn.Connect(); err != nil {
		return err
	}
	defer conn.Shutdown()
	io, err := conn.OpenIOContext(c.Pool)
	if err != nil {
		return err
	}
	defer io.Destroy()
	img, err := rbd.OpenImage(io, name, rbd.NoSnapshot)
	if err != nil {
		return fmt.Errorf("open %s/%s: %w", c.Pool, name, err)
	}
	defer img.Close()
	return fn(img)
}

// ReadImage reads n bytes at off of pool/image.
func (c *Cluster) ReadImage(_ context.Context, image string, off int64, n int) ([]byte, error) {
	buf := make([]byte, n)
	err := c.image(image, func(img *rbd.Image) error {
		got, err := img.ReadAt(buf, off)
		if err == nil && got != n {
			err = fmt.Errorf("read %d of %d bytes at %d", got, n, off)
		}
		return err
	})
	return buf, err
}

// WriteImage writes data at off of pool/image, flushed.
func (c *Cluster) WriteImage(ctx context.Context, image string, off int64, data []byte) error {
	err := c.image(image, func(img *rbd.Image) error {
		if _, err := img.WriteAt(data, off); err != nil {
			return err
		}
		return img.Flush()
	})
	if err != nil {
		return err
	}
	return c.AwaitNoWatchers(ctx, image, 15*time.Second)
}

// AwaitNoWatchers waits until nobody has the image open.
func (c *Cluster) AwaitNoWatchers(ctx context.Context, image string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		out, err := c.RBD(ctx, "status", "--format", "json", c.Pool+"/"+image)
		if err != nil {
			return err
		}
		if bytes.Contains(out, []byte(`"watchers":[]`)) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("image %s still has watchers after %s: %s", image, within, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// DriverConfig is a driver --config with one rbd instance, rbd/ceph-test,
// on the cluster, mapping with the run's mounter (rbd-fuse under fuseDir
// by default). userID and keyFile serve the RPCs that CSI sends without
// secrets (ListVolumes, GetCapacity, ControllerGetVolume, Probe); calls
// that carry the secrets userID/userKey use those.
func (c *Cluster) DriverConfig(fuseDir string) string {
	return fmt.Sprintf(`defaultBackend: rbd/ceph-test
backends:
  - type: rbd
    name: ceph-test
    rbd:
      clusterID: test
      monitors: [%q]
      pool: %s
      userID: %s
      keyFile: %s
      mounter: %s
      fuseDir: %s
      nodeRegistry: true
`, "v2:"+c.Monitor, c.Pool, c.User, c.KeyFile, c.Mounter, fuseDir)
}

// WriteRandom fills the first n bytes of pool/image with data from a
// generator seeded by seed (every 4 MiB object different, so a copy that
// misplaces or drops one cannot match), flushed. It returns the SHA-256
// of what it wrote.
func (c *Cluster) WriteRandom(ctx context.Context, image string, n int64, seed uint64) (string, error) {
	h := sha256.New()
	err := c.image(image, func(img *rbd.Image) error {
		gen := rand.NewChaCha8(seedOf(seed))
		buf := make([]byte, 4<<20)
		for off := int64(0); off < n; off += int64(len(buf)) {
			chunk := buf[:min(int64(len(buf)), n-off)]
			_, _ = gen.Read(chunk)
			if _, err := img.WriteAt(chunk, off); err != nil {
				return err
			}
			h.Write(chunk)
		}
		return img.Flush()
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), c.AwaitNoWatchers(ctx, image, 15*time.Second)
}

func seedOf(seed uint64) [32]byte {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	return s
}

// Checksum is the SHA-256 of the first n bytes of pool/image.
func (c *Cluster) Checksum(_ context.Context, image string, n int64) (string, error) {
	h := sha256.New()
	err := c.image(image, func(img *rbd.Image) error {
		buf := make([]byte, 4<<20)
		for off := int64(0); off < n; off += int64(len(buf)) {
			chunk := buf[:min(int64(len(buf)), n-off)]
			got, err := img.ReadAt(chunk, off)
			if err != nil {
				return err
			}
			if got != len(chunk) {
				return fmt.Errorf("image %s: read %d of %d bytes at %d", image, got, len(chunk), off)
			}
			h.Write(chunk)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
