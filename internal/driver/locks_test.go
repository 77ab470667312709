package driver

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
)

// isHeld reports whether the driver holds the lock key.
func isHeld(d *Driver, key string) bool { return d.locks.Held(key) }

// waitHeld waits until an operation running in the background holds key;
// done reports the operation's early end, which fails the test.
func waitHeld(t *testing.T, d *Driver, key string, done <-chan error) {
	t.Helper()
	for !isHeld(d, key) {
		select {
		case err := <-done:
			t.Fatalf("operation ended before taking %s: %v", key, err)
		default:
		}
		time.Sleep(time.Millisecond)
	}
}

// holdPoolLock takes the pool's flock, as another process would, so that
// every store operation on the pool waits until release is called.
func holdPoolLock(t *testing.T, dir string) (release func()) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, ".spindle.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
			f.Close()
		})
	}
	t.Cleanup(release)
	return release
}

// A CreateVolume that is in progress makes a second one for the same name
// fail with ABORTED at once, while another name goes ahead.
func TestCreateVolumeConcurrentSameName(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	unlockPool := holdPoolLock(t, e.pools[defaultKey].Dir())

	first := make(chan error, 1)
	var firstResp *csi.CreateVolumeResponse
	go func() {
		resp, err := e.CreateVolume(createReq("pvc-slow"))
		firstResp = resp
		first <- err
	}()
	waitHeld(t, e.d, "create/pvc-slow", first) // now blocked on the pool lock

	_, err := e.CreateVolume(createReq("pvc-slow"))
	wantCode(t, err, codes.Aborted, "volume name pvc-slow", "already in progress")

	other := make(chan error, 1)
	go func() {
		_, err := e.CreateVolume(createReq("pvc-other"))
		other <- err
	}()
	waitHeld(t, e.d, "create/pvc-other", other) // past the driver's lock too

	unlockPool()
	if err := <-first; err != nil {
		t.Fatalf("first CreateVolume: %v", err)
	}
	if err := <-other; err != nil {
		t.Fatalf("CreateVolume of another name: %v", err)
	}
	if isHeld(e.d, "create/pvc-slow") || isHeld(e.d, "create/pvc-other") {
		t.Fatal("locks still held after the operations ended")
	}
	// The refused caller's retry finds the volume the first one made.
	resp, err := e.CreateVolume(createReq("pvc-slow"))
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if resp.GetVolume().GetVolumeId() != firstResp.GetVolume().GetVolumeId() {
		t.Fatalf("retry got %s, first got %s", resp.GetVolume().GetVolumeId(), firstResp.GetVolume().GetVolumeId())
	}
}

// Every node RPC on a volume takes "node/<volume ID>".
func TestNodeOperationsAbortWhileVolumeBusy(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	const busy, idle = "loop/default/pvc-busy", "loop/default/pvc-idle"
	release, err := e.d.locks.Acquire("node/"+busy, "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	dir := t.TempDir()
	stage, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")

	calls := e.nodeRPCs(stage, target)
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			wantCode(t, c.call(busy), codes.Aborted, "volume "+busy, "already in progress")
		})
	}
	// Another volume is not held up: its stage goes on to the backend, which
	// does not know it; its unpublish finds nothing to do.
	wantCode(t, calls[0].call(idle), codes.NotFound, "pvc-idle")
	wantCode(t, calls[3].call(idle), codes.OK)
	if len(e.loops[defaultKey].Calls) != 0 {
		t.Fatalf("loop driver used: %v", e.loops[defaultKey].Calls)
	}
}

// ControllerPublish and ControllerUnpublish take "publish/<volume>/<node>";
// DeleteVolume takes "volume/<volume>".
func TestControllerOperationsAbortWhileBusy(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.registerNodes(t, defaultKey, "node-a", "node-b")
	vol := e.mustCreate(t, createReq("pvc-pub"))

	release, err := e.d.locks.Acquire("publish/"+vol+"/node-a", "test")
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: "node-a", VolumeCapability: mountCap("ext4", snw)})
	wantCode(t, err, codes.Aborted, "volume "+vol+" on node node-a")
	wantCode(t, e.ControllerUnpublish(vol, "node-a"), codes.Aborted, "on node node-a")
	// The same volume on another node is another key.
	e.mustPublish(t, vol, "node-b", mountCap("ext4", snw), false)
	release()
	if got := attachedNodes(e.image(t, vol)); len(got) != 1 || got[0] != "node-b" {
		t.Fatalf("attachments = %v, want [node-b]", got)
	}
	wantCode(t, e.ControllerUnpublish(vol, "node-b"), codes.OK)

	release, err = e.d.locks.Acquire("volume/"+vol, "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	wantCode(t, e.DeleteVolume(vol), codes.Aborted, "volume "+vol)
	e.image(t, vol) // still there
}
