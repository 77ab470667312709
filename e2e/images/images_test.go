//go:build root

// Package images tests the images hack/images.sh assembles: the driver
// image is unpacked and its programs run in a chroot, as a container
// runtime would run them (the root tier: root needed).
package images

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/testutil"
)

// buildImage runs hack/images.sh what into a temporary directory and
// unpacks the tarball it names into root (a new temporary directory), for
// its programs to run in a chroot (root needed).
func buildImage(t *testing.T, what, tarball string) (root string, manifest []map[string]any, config map[string]any) {
	t.Helper()
	testutil.RequireRoot(t, "run the image's programs in a chroot")
	if testing.Short() {
		t.Skip("builds the " + what + " image (-short)")
	}
	dir := t.TempDir()
	cmd := exec.Command("../../hack/images.sh", what)
	cmd.Env = append(os.Environ(), "IMAGES_DIR="+dir, "TAG=test")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/images.sh %s: %v\n%s", what, err, out)
	}
	root = t.TempDir()
	manifest, config = unpack(t, filepath.Join(dir, tarball), root)
	return root, manifest, config
}

// unpack extracts the image's manifest, config and its one layer into root.
func unpack(t *testing.T, image, root string) (manifest []map[string]any, config map[string]any) {
	t.Helper()
	f, err := os.Open(image)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	members := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		members[h.Name] = data
	}
	if err := json.Unmarshal(members["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("manifest.json: %v %s", err, members["manifest.json"])
	}
	if err := json.Unmarshal(members[manifest[0]["Config"].(string)], &config); err != nil {
		t.Fatalf("image config: %v", err)
	}
	layers := manifest[0]["Layers"].([]any)
	if len(layers) != 1 {
		t.Fatalf("layers %v, want one", layers)
	}
	cmd := exec.Command("tar", "-x", "-C", root)
	cmd.Stdin = strings.NewReader(string(members[layers[0].(string)]))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("unpack the layer: %v %s", err, out)
	}
	return manifest, config
}

func TestDriverImageRuns(t *testing.T) {
	root, manifest, config := buildImage(t, "driver", "spindle.tar")
	if tags := manifest[0]["RepoTags"].([]any); len(tags) != 1 || tags[0] != "local.test/spindle:test" {
		t.Errorf("RepoTags %v, want [local.test/spindle:test]", tags)
	}
	if ep := config["config"].(map[string]any)["Entrypoint"].([]any); len(ep) != 1 || ep[0] != "/usr/local/bin/spindle" {
		t.Errorf("Entrypoint %v, want [/usr/local/bin/spindle]", ep)
	}
	// A file image to format: what the node plugin does to a loop device.
	if err := os.WriteFile(filepath.Join(root, "tmp", "img"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(root, "tmp", "img"), 512<<20); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string // in the output
	}{
		{[]string{"/usr/local/bin/spindle", "--version"}, ""},
		{[]string{"/usr/local/bin/spindle", "--help"}, "-plugin-registration-dir"},
		{[]string{"mkfs.ext4", "-V"}, "mke2fs"},
		{[]string{"blkid", "-V"}, "blkid from util-linux"},
		{[]string{"losetup", "--version"}, "losetup from util-linux"},
		{[]string{"mount", "--version"}, "mount from util-linux"},
		{[]string{"findmnt", "--version"}, "findmnt from util-linux"},
		{[]string{"mkfs.xfs", "-V"}, "mkfs.xfs version"},
		{[]string{"xfs_growfs", "-V"}, "xfs_growfs version"},
		{[]string{"xfs_info", "-V"}, "xfs_info version"}, // a shell script: /bin/sh resolves
		{[]string{"mkfs.btrfs", "--version"}, "mkfs.btrfs"},
		{[]string{"btrfs", "--version"}, "btrfs-progs"},
		{[]string{"resize2fs"}, "Usage: resize2fs"},
		{[]string{"e2fsck", "-V"}, "e2fsck"},
		// The kernel attach paths' tools.
		{[]string{"iscsiadm", "--version"}, "iscsiadm version"},
		// Ceph 20's client, which logs in to Tentacle's default keys.
		{[]string{"rbd", "--version"}, "ceph version 20.2."},
		{[]string{"rbd-nbd", "--version"}, "ceph version 20.2."},
		// rbd-nbd creates /var/run/ceph at start (and aborts without
		// /var/run).
		{[]string{"sh", "-c", "cd /var/run && test -d /run && echo var-run-ok"}, "var-run-ok"},
		// The rbd-fuse mounter's and the iSCSI userspace attacher's server,
		// whose rbd and iscsi drivers are modules: every library they
		// link is in the image.
		{[]string{"qemu-storage-daemon", "--version"}, "qemu-storage-daemon version"},
		{[]string{"/lib64/ld-linux-x86-64.so.2", "--list", "/usr/lib/x86_64-linux-gnu/qemu/block-rbd.so"}, "librbd.so.1 =>"},
		{[]string{"/lib64/ld-linux-x86-64.so.2", "--list", "/usr/lib/x86_64-linux-gnu/qemu/block-iscsi.so"}, "libiscsi.so"},
		// The driver's own Ceph client.
		{[]string{"/lib64/ld-linux-x86-64.so.2", "--list", "/usr/local/bin/spindle"}, "librados.so.2 =>"},
		{[]string{"modprobe", "--version"}, "kmod version"},
		{[]string{"tgtadm", "--version"}, "1.0."},
		// rbd trash mv runs /bin/date for its --expires-at ("now").
		{[]string{"/bin/date", "-d", "now", "+%s"}, "1"},
		// Encrypted volumes.
		{[]string{"cryptsetup", "--version"}, "cryptsetup 2."},
		{[]string{"dmsetup", "--version"}, "Library version"},
		// Formatting uses /etc/mke2fs.conf; blkid then sees the filesystem.
		{[]string{"mkfs.ext4", "-F", "-q", "/tmp/img"}, ""},
		{[]string{"blkid", "-p", "-o", "export", "/tmp/img"}, "TYPE=ext4"},
		{[]string{"dumpe2fs", "-h", "/tmp/img"}, "Block size:               4096"},
		{[]string{"mkfs.xfs", "-f", "-q", "/tmp/img"}, ""},
		{[]string{"blkid", "-p", "-o", "export", "/tmp/img"}, "TYPE=xfs"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			cmd := exec.Command("chroot", append([]string{root}, c.args...)...)
			cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
			out, err := cmd.CombinedOutput()
			// resize2fs without arguments prints its usage and exits 1.
			if err != nil && c.args[0] != "resize2fs" {
				t.Fatalf("chroot %s: %v\n%s", strings.Join(c.args, " "), err, out)
			}
			if !strings.Contains(string(out), c.want) {
				t.Fatalf("output does not contain %q:\n%s", c.want, out)
			}
			// ld.so --list: every library the module or binary links
			// resolves inside the image (the image has no grep).
			if len(c.args) > 1 && c.args[1] == "--list" && strings.Contains(string(out), "not found") {
				t.Fatalf("a library is missing from the image:\n%s", out)
			}
		})
	}
}

// TestPostgresImageRuns: the multi-node tests' database image runs as user
// 999, and its server, initdb, psql and pgbench find their libraries.
func TestPostgresImageRuns(t *testing.T) {
	root, _, config := buildImage(t, "postgres", "postgres.tar")
	if user := config["config"].(map[string]any)["User"]; user != "999:999" {
		t.Errorf("User %v, want 999:999 (PostgreSQL refuses to run as root)", user)
	}
	for _, f := range []string{"usr/share/postgresql/15/postgres.bki", "usr/lib/postgresql/15/lib/plpgsql.so", "usr/share/zoneinfo/UTC"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("initdb needs /%s: %v", f, err)
		}
	}
	for _, p := range []string{"postgres", "initdb", "psql", "pgbench", "pg_isready", "locale", "rm", "cat", "sleep"} {
		out, err := exec.Command("chroot", root, p, "--version").CombinedOutput()
		want := "(PostgreSQL) 15."
		switch p {
		case "locale":
			want = "(Debian GLIBC" // initdb runs it
		case "rm", "cat", "sleep": // the e2e pods' scripts run them
			want = "(GNU coreutils)"
		}
		if err != nil || !strings.Contains(string(out), want) {
			t.Errorf("chroot %s --version: %v\n%s", p, err, out)
		}
	}
}
