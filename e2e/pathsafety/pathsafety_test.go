//go:build root

// Package pathsafety checks, against a running driver on real loop devices
// and mounts, that no Node request can make the node plugin destroy what
// its paths name: every path is confined to the plugin's roots, and only
// what the plugin could have made (an empty directory, an empty file) is
// ever removed.
package pathsafety

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/lifecycle"
)

// world is a running driver whose only allowed root is root, two real
// volumes staged below it (one filesystem, one block), and a directory
// outside the root that holds what a wrong path could reach.
type world struct {
	drv             *harness.Driver
	client          *lifecycle.Client
	root, outside   string
	fsVol, blockVol *lifecycle.Volume
	fsTarget        string // where fsVol is published
	blockDev        string // the block volume's device
	logs            *observer.ObservedLogs
}

const missingVolume = "loop/default/pvc-does-not-exist"

func newWorld(t *testing.T) *world {
	t.Helper()
	base := harness.TempDir(t)
	w := &world{root: filepath.Join(base, "kubelet"), outside: filepath.Join(base, "outside")}
	for _, d := range []string{w.root, w.outside} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	core, logs := observer.New(zapcore.WarnLevel)
	w.logs = logs
	w.drv = harness.Start(t, harness.Options{AllowedPathRoots: []string{w.root}, Logger: zap.New(core)})
	harness.CheckNoLeaks(t, w.drv.PoolDir, base)
	w.client = lifecycle.NewClient(w.drv, nil)
	ctx := context.Background()

	var err error
	w.fsVol, err = w.client.Create(ctx, "pvc-paths-fs", 64<<20, lifecycle.MountCapability("ext4"), nil, filepath.Join(w.root, "staging", "fs", "globalmount"))
	if err != nil {
		t.Fatal(err)
	}
	w.blockVol, err = w.client.Create(ctx, "pvc-paths-block", 64<<20, lifecycle.BlockCapability(), nil, filepath.Join(w.root, "staging", "block", "pv"))
	if err != nil {
		t.Fatal(err)
	}
	w.fsTarget = filepath.Join(w.root, "pods", "owner", "mount")
	for _, v := range []*lifecycle.Volume{w.fsVol, w.blockVol} {
		if err := os.MkdirAll(filepath.Dir(v.StagingPath), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := w.client.ControllerPublish(ctx, v); err != nil {
			t.Fatal(err)
		}
		if err := w.client.Stage(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.client.Publish(ctx, w.fsVol, w.fsTarget, false); err != nil {
		t.Fatal(err)
	}
	rec, err := os.ReadFile(w.blockVol.StagingPath + ".spindle-stage.json")
	if err != nil {
		t.Fatal(err)
	}
	if i := strings.Index(string(rec), `"device": "`); i >= 0 {
		w.blockDev = strings.SplitN(string(rec)[i+len(`"device": "`):], `"`, 2)[0]
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = w.client.Unpublish(ctx, w.fsVol, w.fsTarget)
		for _, v := range []*lifecycle.Volume{w.fsVol, w.blockVol} {
			if err := w.client.Unstage(ctx, v); err != nil {
				t.Errorf("unstage %s: %v", v.ID, err)
			}
			_ = w.client.ControllerUnpublish(ctx, v)
			_ = w.client.Delete(ctx, v)
		}
		if panics := w.logs.FilterMessage("panic in RPC handler").All(); len(panics) > 0 {
			t.Errorf("the driver panicked %d times: %v", len(panics), panics[0].ContextMap())
		}
	})
	return w
}

// victimKind makes one kind of thing at a path.
type victimKind struct {
	name string
	make func(t *testing.T, w *world, path string)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func mknod(t *testing.T, path string, kind uint32, dev uint64) {
	t.Helper()
	if err := unix.Mknod(path, kind|0o600, int(dev)); err != nil {
		t.Fatal(err)
	}
}

var victimKinds = []victimKind{
	{"file with data", func(t *testing.T, _ *world, p string) { writeFile(t, p, "precious data\n") }},
	{"empty file", func(t *testing.T, _ *world, p string) { writeFile(t, p, "") }},
	// A stand-in for /dev/null (the victim) made in the test's
	// directory, and a copy of the block volume's own device node.
	{"character device node", func(t *testing.T, _ *world, p string) { mknod(t, p, unix.S_IFCHR, unix.Mkdev(1, 3)) }},
	{"block device node", func(t *testing.T, w *world, p string) {
		var st unix.Stat_t
		if err := unix.Stat(w.blockDev, &st); err != nil {
			t.Fatal(err)
		}
		mknod(t, p, unix.S_IFBLK, st.Rdev)
	}},
	{"symlink to a file", func(t *testing.T, w *world, p string) {
		target := filepath.Join(w.outside, "linked-file-"+filepath.Base(filepath.Dir(p)))
		writeFile(t, target, "precious data behind a link\n")
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}},
	{"symlink to a directory", func(t *testing.T, w *world, p string) {
		target := filepath.Join(w.outside, "linked-dir-"+filepath.Base(filepath.Dir(p)))
		if err := os.Mkdir(target, 0o750); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(target, "data"), "precious\n")
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}},
	{"non-empty directory", func(t *testing.T, _ *world, p string) {
		if err := os.Mkdir(p, 0o750); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(p, "data"), "precious\n")
	}},
}

// rpc is one Node RPC with the path under test in one of its fields and
// good values everywhere else.
type rpc struct {
	name string
	call func(ctx context.Context, w *world, volumeID, path string) error
}

func mountCap() *csi.VolumeCapability { return lifecycle.MountCapability("ext4") }
func blockCap() *csi.VolumeCapability { return lifecycle.BlockCapability() }

// pc is the publish_context of a staged volume (none for the missing one).
func (w *world) pc(volumeID string) map[string]string {
	switch volumeID {
	case w.fsVol.ID:
		return w.fsVol.PublishContext
	case w.blockVol.ID:
		return w.blockVol.PublishContext
	}
	return nil
}

// staging is where a volume is staged (the filesystem one's for the missing one).
func (w *world) staging(volumeID string) string {
	if volumeID == w.blockVol.ID {
		return w.blockVol.StagingPath
	}
	return w.fsVol.StagingPath
}

var rpcs = []rpc{
	{"NodeStageVolume(mount).staging_target_path", func(ctx context.Context, w *world, id, p string) error {
		_, err := w.drv.Node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: p, VolumeCapability: mountCap(), PublishContext: w.pc(id)})
		return err
	}},
	{"NodeStageVolume(block).staging_target_path", func(ctx context.Context, w *world, id, p string) error {
		_, err := w.drv.Node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: p, VolumeCapability: blockCap(), PublishContext: w.pc(id)})
		return err
	}},
	{"NodeUnstageVolume.staging_target_path", func(ctx context.Context, w *world, id, p string) error {
		_, err := w.drv.Node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: p})
		return err
	}},
	{"NodePublishVolume(mount).target_path", func(ctx context.Context, w *world, id, p string) error {
		_, err := w.drv.Node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: w.staging(id), TargetPath: p, VolumeCapability: mountCap(), PublishContext: w.pc(id)})
		return err
	}},
	{"NodePublishVolume(block).target_path", func(ctx context.Context, w *world, id, p string) error {
		_, err := w.drv.Node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: w.staging(id), TargetPath: p, VolumeCapability: blockCap(), PublishContext: w.pc(id)})
		return err
	}},
	{"NodePublishVolume.staging_target_path", func(ctx context.Context, w *world, id, p string) error {
		target := filepath.Join(w.root, "pods", "fresh-"+fmt.Sprint(time.Now().UnixNano()), "mount")
		_, err := w.drv.Node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: p, TargetPath: target, VolumeCapability: mountCap(), PublishContext: w.pc(id)})
		return err
	}},
	{"NodeUnpublishVolume.target_path", func(ctx context.Context, w *world, id, p string) error {
		_, err := w.drv.Node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: p})
		return err
	}},
	{"NodeGetVolumeStats.volume_path", func(ctx context.Context, w *world, id, p string) error {
		_, err := w.drv.Node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: p})
		return err
	}},
	{"NodeExpandVolume.volume_path", func(ctx context.Context, w *world, id, p string) error {
		_, err := w.drv.Node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: p})
		return err
	}},
	{"NodeExpandVolume.staging_target_path", func(ctx context.Context, w *world, id, p string) error {
		_, err := w.drv.Node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: w.staging(id), StagingTargetPath: p})
		return err
	}},
	{"NodeGetVolumeHealth.staging_target_path", func(ctx context.Context, w *world, id, p string) error {
		_, err := w.drv.Node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: id, StagingTargetPath: p})
		return err
	}},
	{"NodeGetVolumeHealth.volume_publish_path", func(ctx context.Context, w *world, id, p string) error {
		_, err := w.drv.Node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: id, VolumePublishPath: p})
		return err
	}},
}

// fingerprint describes everything below dir (or dir itself): each entry's
// type, inode, device number, size and content, symlink targets, so any
// change shows.
func fingerprint(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	var walk func(p string)
	walk = func(p string) {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			fmt.Fprintf(&b, "%s: %v\n", p, err)
			return
		}
		fmt.Fprintf(&b, "%s: mode=%o ino=%d rdev=%d size=%d", p, st.Mode, st.Ino, st.Rdev, st.Size)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			data, _ := os.ReadFile(p)
			fmt.Fprintf(&b, " data=%q\n", data)
		case unix.S_IFLNK:
			target, _ := os.Readlink(p)
			fmt.Fprintf(&b, " -> %s\n", target)
		case unix.S_IFDIR:
			b.WriteString("\n")
			entries, _ := os.ReadDir(p)
			for _, e := range entries {
				walk(filepath.Join(p, e.Name()))
			}
		default:
			b.WriteString("\n")
		}
	}
	walk(dir)
	return b.String()
}

func codeOf(err error) codes.Code { return status.Code(err) }

// placement puts a victim where a request's path names it, and says which
// directory to fingerprint.
type placement struct {
	name string
	// place makes the victim for case n and returns the request's path
	// and the directory whose content must not change.
	place func(t *testing.T, w *world, n int, kind victimKind) (path, watch string)
}

var placements = []placement{
	{"below the root", func(t *testing.T, w *world, n int, kind victimKind) (string, string) {
		dir := filepath.Join(w.root, "cases", fmt.Sprint(n))
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		kind.make(t, w, filepath.Join(dir, "victim"))
		return filepath.Join(dir, "victim"), dir
	}},
}

// escapes are paths that leave the root; the victim is a file with data
// outside it.
var escapes = []placement{
	{"outside the roots", func(t *testing.T, w *world, n int, _ victimKind) (string, string) {
		dir := filepath.Join(w.outside, fmt.Sprint(n))
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, "victim"), "precious\n")
		return filepath.Join(dir, "victim"), dir
	}},
	{"'..' traversal out of the root", func(t *testing.T, w *world, n int, _ victimKind) (string, string) {
		dir := filepath.Join(w.outside, fmt.Sprint(n))
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(w.root, "cases", fmt.Sprint(n)), 0o750); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, "victim"), "precious\n")
		rel, _ := filepath.Rel(filepath.Join(w.root, "cases", fmt.Sprint(n)), filepath.Join(dir, "victim"))
		return filepath.Join(w.root, "cases", fmt.Sprint(n)) + "/" + rel, dir
	}},
	{"a symlinked parent leading out of the root", func(t *testing.T, w *world, n int, _ victimKind) (string, string) {
		dir := filepath.Join(w.outside, fmt.Sprint(n))
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, "victim"), "precious\n")
		link := filepath.Join(w.root, "cases", fmt.Sprint(n), "escape")
		if err := os.MkdirAll(filepath.Dir(link), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(dir, link); err != nil {
			t.Fatal(err)
		}
		return filepath.Join(link, "victim"), dir
	}},
}

// expected is the answer to rpc for a victim of kind below the root, for
// the staged volume or the missing one. The rules: a symlink is never
// followed (FAILED_PRECONDITION); the read-only RPCs find no mount of the
// volume there (NOT_FOUND) or report its health; NodeExpandVolume only
// validates its staging path; unpublish removes an empty file (a block
// target it may have made) and a block publish binds onto one; unstaging a
// volume that is staged nowhere is done. Everything else is refused with
// FAILED_PRECONDITION before anything is touched.
func expected(rpcName, vol, kind string) codes.Code {
	switch {
	case strings.HasPrefix(kind, "symlink"):
		return codes.FailedPrecondition
	case strings.HasPrefix(rpcName, "NodeGetVolumeStats"), rpcName == "NodeExpandVolume.volume_path":
		return codes.NotFound
	case rpcName == "NodeExpandVolume.staging_target_path" && vol == "missing":
		return codes.NotFound
	case strings.HasPrefix(rpcName, "NodeGetVolumeHealth"), rpcName == "NodeExpandVolume.staging_target_path":
		return codes.OK
	case strings.HasPrefix(rpcName, "NodeUnpublishVolume") && kind == "empty file":
		return codes.OK
	case strings.HasPrefix(rpcName, "NodePublishVolume(block)") && vol == "staged" && kind == "empty file":
		return codes.OK
	case strings.HasPrefix(rpcName, "NodeUnstageVolume") && vol == "missing" && kind == "non-empty directory":
		return codes.OK
	}
	return codes.FailedPrecondition
}

// TestNodeRPCsOnHostilePaths sends every Node RPC, for a staged volume and
// for one that does not exist, a path naming each kind of thing the plugin
// did not make, and paths that leave its root, and checks the answer's
// code and that the victim is exactly as it was.
func TestNodeRPCsOnHostilePaths(t *testing.T) {
	w := newWorld(t)
	n := 0
	for _, r := range rpcs {
		for _, vol := range []string{"staged", "missing"} {
			id := missingVolume
			if vol == "staged" {
				id = w.fsVol.ID
				if strings.Contains(r.name, "(block)") {
					id = w.blockVol.ID
				}
			}
			type tcase struct {
				name  string
				kind  victimKind
				place placement
				want  codes.Code
			}
			var cases []tcase
			for _, kind := range victimKinds {
				cases = append(cases, tcase{kind.name, kind, placements[0], expected(r.name, vol, kind.name)})
			}
			for _, pl := range escapes {
				cases = append(cases, tcase{pl.name, victimKinds[0], pl, codes.InvalidArgument})
			}
			for _, tc := range cases {
				n++
				t.Run(r.name+"/"+vol+"/"+tc.name, func(t *testing.T) {
					path, watch := tc.place.place(t, w, n, tc.kind)
					// The victim's directory, and everything outside the root
					// (where symlinks and escapes lead).
					before := fingerprint(t, watch) + fingerprint(t, w.outside)
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					err := r.call(ctx, w, id, path)
					if got := codeOf(err); got != tc.want {
						t.Fatalf("code %s, want %s: %v", got, tc.want, err)
					}
					if tc.want == codes.InvalidArgument && !strings.Contains(err.Error(), "not below an allowed root") && !strings.Contains(err.Error(), "clean path") {
						t.Errorf("the error does not say the path leaves the roots: %v", err)
					}
					if tc.want == codes.FailedPrecondition && !strings.Contains(err.Error(), "staged") && !strings.Contains(err.Error(), filepath.Base(path)) {
						t.Errorf("the error names neither the path nor the volume's state: %v", err)
					}
					if tc.want == codes.OK && strings.HasPrefix(r.name, "NodePublishVolume(block)") {
						// A real publish onto the empty file: take it back,
						// which removes the file as a block target.
						if _, err := w.drv.Node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: path}); err != nil {
							t.Fatalf("unpublish: %v", err)
						}
					}
					after := fingerprint(t, watch) + fingerprint(t, w.outside)
					removable := tc.kind.name == "empty file" && tc.want == codes.OK &&
						(strings.HasPrefix(r.name, "NodeUnpublishVolume") || strings.HasPrefix(r.name, "NodePublishVolume(block)"))
					if removable {
						if _, err := os.Lstat(path); !os.IsNotExist(err) {
							t.Errorf("the empty file is still there after unpublish: %v", err)
						}
						return
					}
					if after != before {
						t.Errorf("the victim changed:\nbefore:\n%s\nafter:\n%s", before, after)
					}
				})
			}
		}
	}
}
