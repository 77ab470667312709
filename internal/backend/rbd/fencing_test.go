//go:build cgo && ceph

package rbd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	utilexec "k8s.io/utils/exec"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/rbd"
	"github.com/spindle-csi/spindle/internal/backend/rbd/rbdtest"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// newNode builds an instance "test" on the cluster as one node sees it:
// the rbd-fuse mounter (qemu-storage-daemon's FUSE export + loop) under a
// directory of its own.
func newNode(t *testing.T, cl *rbdtest.Cluster, fencing bool) *backend.Instance {
	t.Helper()
	inst, err := rbd.New("test", rbd.Config{
		ClusterID: "test",
		Monitors:  []string{"v2:" + cl.Monitor},
		Pool:      cl.Pool,
		Mounter:   rbd.MounterFuse,
		FuseDir:   filepath.Join(t.TempDir(), "fuse"),
		StateDir:  filepath.Join(t.TempDir(), "state"),
		UserID:    cl.User,
		KeyFile:   cl.KeyFile,
		Fencing:   fencing,
	}, command.New(utilexec.New(), nil))
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

// blocklistedSince is what the blocklist holds that before did not.
func blocklistedSince(t *testing.T, cl *rbdtest.Cluster, before []string) []string {
	t.Helper()
	var added []string
	for _, a := range blocklist(t, cl) {
		if !slices.Contains(before, a) {
			added = append(added, a)
		}
	}
	return added
}

// blocklist is "ceph osd blocklist ls": the blocklisted client addresses.
func blocklist(t *testing.T, cl *rbdtest.Cluster) []string {
	t.Helper()
	out, err := cl.Ceph(context.Background(), "osd", "blocklist", "ls", "--format", "json")
	if err != nil {
		t.Fatal(err)
	}
	// The JSON is on stdout, "listed N entries" on stderr after it.
	out, _, _ = bytes.Cut(out, []byte("\nlisted"))
	out = bytes.TrimSuffix(bytes.TrimSpace(out), []byte("listed 0 entries"))
	var entries []struct {
		Addr string `json:"addr"`
	}
	if err := json.NewDecoder(bytes.NewReader(out)).Decode(&entries); err != nil {
		t.Fatalf("ceph osd blocklist ls: %v: %q", err, out)
	}
	var addrs []string
	for _, e := range entries {
		addrs = append(addrs, e.Addr)
	}
	return addrs
}

func watcherAddrs(t *testing.T, cl *rbdtest.Cluster, image string) []string {
	t.Helper()
	out, err := cl.RBD(context.Background(), "status", "--format", "json", cl.Pool+"/"+image)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Watchers []struct {
			Address string `json:"address"`
		} `json:"watchers"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, w := range st.Watchers {
		addrs = append(addrs, w.Address)
	}
	return addrs
}

// run runs a command with a deadline and LC_ALL=C.
func run(timeout time.Duration, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return errors.New(name + " " + strings.Join(args, " ") + ": " + err.Error() + ": " + strings.TrimSpace(string(out)))
	}
	return nil
}

// serverPIDs lists the qemu-storage-daemon processes serving a file under
// dir: the ones this test's attacher started.
func serverPIDs(dir string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) == 0 || filepath.Base(args[0]) != "qemu-storage-daemon" {
			continue
		}
		for _, a := range args {
			if strings.Contains(a, "mountpoint="+dir+"/") {
				var pid int
				if _, err := fmt.Sscan(e.Name(), &pid); err == nil {
					pids = append(pids, pid)
				}
			}
		}
	}
	return pids
}

// lostNode is node A: it maps the volume with the rbd-fuse mounter, writes
// data to it and is then "lost": its attachment is revoked as a
// force-detach does (ControllerUnpublish while its client still watches
// the image). Its cleanup tears the mapping down by hand, since a fenced
// server may no longer answer: loop device detached, the FUSE export
// unmounted lazily as the fallback, its process killed.
func lostNode(t *testing.T, cl *rbdtest.Cluster, a *backend.Instance, id string, data []byte) (device, watcher string) {
	t.Helper()
	ctx := context.Background()
	pc, err := a.Exporter.Publish(ctx, id, backend.Attachment{NodeID: "node-a", AccessMode: backend.SingleNodeWriter})
	if err != nil {
		t.Fatal(err)
	}
	dev, err := a.Attacher.Attach(ctx, backend.AttachRequest{ImageID: id, NodeID: "node-a", PublishContext: pc})
	if err != nil {
		t.Fatal(err)
	}
	// The loop device's file is <pool dir>/<image>/<image>.
	poolDir := filepath.Dir(filepath.Dir(mountOfLoop(t, dev.Path)))
	t.Cleanup(func() {
		// The node comes back and unstages: the attacher's own detach,
		// with a deadline, since a fenced server answers nothing.
		done := make(chan error, 1)
		go func() { done <- a.Attacher.Detach(context.Background(), id, dev.Path) }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("node A: detach: %v", err)
			}
		case <-time.After(45 * time.Second):
			t.Errorf("node A: detach did not return in 45 s")
			_ = run(10*time.Second, "losetup", "-d", dev.Path)
		}
		// The fallback for what the detach left: lazy unmounts (which,
		// unlike umount(8), never ask the server), and the test's own
		// servers, blocklisted, killed.
		files, _ := filepath.Glob(filepath.Join(poolDir, "*", "*"))
		for _, m := range files {
			if err := run(5*time.Second, "fusermount3", "-u", "-z", m); err != nil && !strings.Contains(err.Error(), "not found in") {
				t.Logf("node A: %v", err)
			}
		}
		for _, pid := range serverPIDs(poolDir) {
			t.Logf("node A: qemu-storage-daemon %d still runs after the detach; killing it", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	writeDevice(t, dev.Path, data)
	w := watcherAddrs(t, cl, imageIn(t, cl, id))
	if len(w) != 1 {
		t.Fatalf("node A mapped the image; watchers %v, want node A's client alone", w)
	}
	if err := a.Exporter.Unpublish(ctx, id, "node-a"); err != nil {
		t.Fatal(err)
	}
	return dev.Path, w[0]
}

// mountOfLoop is the FUSE file a loop device is bound to.
func mountOfLoop(t *testing.T, dev string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func writeDevice(t *testing.T, dev string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func readDevice(t *testing.T, dev string, n int) []byte {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

func createVolume(t *testing.T, cl *rbdtest.Cluster, inst *backend.Instance, name string) string {
	t.Helper()
	wipe := func() {
		if err := cl.Wipe(context.Background()); err != nil {
			t.Errorf("empty pool %s: %v", cl.Pool, err)
		}
	}
	wipe()
	t.Cleanup(wipe)
	img, err := inst.Store.Create(context.Background(), backend.VolumeSpec{Name: name, CapacityBytes: 16 << 20, AccessType: backend.AccessBlock})
	if err != nil {
		t.Fatal(err)
	}
	return img.ID
}

// TestFencingHandsALostNodesVolumeOver: with fencing on, publishing the
// volume of a lost, force-detached node A to node B blocklists A's client,
// and B stages it and reads A's data.
func TestFencingHandsALostNodesVolumeOver(t *testing.T) {
	cl := rbdtest.Require(t)
	ctx := context.Background()
	// A cluster shared with other packages (make test-ceph) may hold
	// their entries: only what this test adds counts.
	before := blocklist(t, cl)
	a, b := newNode(t, cl, true), newNode(t, cl, true)
	id := createVolume(t, cl, a, "pvc-fenced")
	data := bytes.Repeat([]byte("spindle fencing\n"), 4096)
	// Cleanups run last first: node B lets go, node A's mapping is torn
	// down, then A's client leaves the blocklist and the pool is emptied.
	var watcher string
	t.Cleanup(func() {
		if watcher == "" {
			return
		}
		if _, err := cl.Ceph(context.Background(), "osd", "blocklist", "rm", watcher); err != nil {
			t.Errorf("remove the blocklist entry: %v", err)
		}
		if got := blocklistedSince(t, cl, before); len(got) != 0 {
			t.Errorf("blocklist after the test: %v", got)
		}
	})
	t0 := time.Now()
	_, watcher = lostNode(t, cl, a, id, data)
	nodeA := time.Since(t0)

	t1 := time.Now()
	pc, err := b.Exporter.Publish(ctx, id, backend.Attachment{NodeID: "node-b", AccessMode: backend.SingleNodeWriter})
	if err != nil {
		t.Fatalf("publish to node B with fencing on: %v", err)
	}
	fence := time.Since(t1)
	if got := blocklistedSince(t, cl, before); len(got) != 1 || got[0] != watcher {
		t.Fatalf("blocklist after publishing to node B = %v; want node A's client %s alone", got, watcher)
	}
	if w := watcherAddrs(t, cl, imageIn(t, cl, id)); len(w) != 0 {
		t.Fatalf("the publish returned while the image still has watchers %v", w)
	}
	t2 := time.Now()
	dev, err := b.Attacher.Attach(ctx, backend.AttachRequest{ImageID: id, NodeID: "node-b", PublishContext: pc})
	if err != nil {
		t.Fatalf("stage on node B after fencing node A: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Attacher.Detach(context.Background(), id, dev.Path); err != nil {
			t.Errorf("node B: detach: %v", err)
		}
		if err := b.Exporter.Unpublish(context.Background(), id, "node-b"); err != nil {
			t.Errorf("node B: unpublish: %v", err)
		}
	})
	stage := time.Since(t2)
	if got := readDevice(t, dev.Path, len(data)); !bytes.Equal(got, data) {
		t.Fatalf("node B reads %.40q..., not what node A wrote", got)
	}
	t.Logf("fencing on: node A map+write %s, publish to B with fencing (blocklist %s) %s, stage on B %s",
		nodeA.Round(time.Millisecond), watcher, fence.Round(time.Millisecond), stage.Round(time.Millisecond))
}

// TestNoFencingRefusesTheSecondWriter: with fencing off the same publish
// succeeds, blocklists nothing, and node B's stage is refused with
// FAILED_PRECONDITION naming node A's client.
func TestNoFencingRefusesTheSecondWriter(t *testing.T) {
	cl := rbdtest.Require(t)
	ctx := context.Background()
	before := blocklist(t, cl)
	a, b := newNode(t, cl, false), newNode(t, cl, false)
	id := createVolume(t, cl, a, "pvc-unfenced")
	devA, watcher := lostNode(t, cl, a, id, []byte("node A's data"))

	pc, err := b.Exporter.Publish(ctx, id, backend.Attachment{NodeID: "node-b", AccessMode: backend.SingleNodeWriter})
	if err != nil {
		t.Fatalf("publish to node B with fencing off: %v", err)
	}
	t.Cleanup(func() { _ = b.Exporter.Unpublish(context.Background(), id, "node-b") })
	if got := blocklistedSince(t, cl, before); len(got) != 0 {
		t.Fatalf("fencing is off, yet the blocklist holds %v", got)
	}
	dev, err := b.Attacher.Attach(ctx, backend.AttachRequest{ImageID: id, NodeID: "node-b", PublishContext: pc})
	if errdefs.KindOf(err) != errdefs.ErrPrecondition || !strings.Contains(err.Error(), watcher) {
		if dev != nil {
			_ = b.Attacher.Detach(ctx, id, dev.Path)
		}
		t.Fatalf("stage on node B while node A's client %s still watches the image = %v, %v; want FAILED_PRECONDITION naming it", watcher, dev, err)
	}
	if devs, err := b.Attacher.Devices(ctx, id); err != nil || len(devs) != 0 {
		t.Fatalf("node B after the refused stage has devices %v (%v); want none", devs, err)
	}
	// Node A, not fenced, still answers: its own detach (the cleanup
	// above) works.
	_ = devA
}
