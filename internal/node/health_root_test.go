//go:build root

package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/testutil"
)

// The health check on real mounts: a staged and published ext4 is healthy;
// an error the kernel answers with remount-ro, the pod's unmount and the
// stage's unmount are reported, each with its reason.
func TestRealCheckVolumeHealth(t *testing.T) {
	testutil.RequireRoot(t, "attach loop devices and mount them")
	testutil.RequireCommands(t, "losetup", "blkid", "mount", "umount", "mkfs.ext4")
	ctx := context.Background()
	d, _ := realHost()
	dev, _ := loopDevice(t, 64*mib)
	staging := mountPoint(t, d, "globalmount")
	publish := mountPoint(t, d, "mount")
	if _, err := ensureFilesystem(ctx, d, FormatRequest{Device: dev, Filesystem: mustFS(t, "ext4")}); err != nil {
		t.Fatal(err)
	}
	// mkfs.ext4 records "Errors behavior: Continue"; ask for remount-ro.
	if err := d.MountDevice(ctx, dev, staging, "ext4", []string{"errors=remount-ro"}); err != nil {
		t.Fatal(err)
	}
	if err := d.BindMount(ctx, staging, publish, false); err != nil {
		t.Fatal(err)
	}
	check := healthCheck{dev: dev, staging: staging, publish: publish}
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
	d, _ := realHost()
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
	check := healthCheck{dev: dev, staging: realDir(t, "staging"), publish: target, block: true}
	wantHealth(t, d, check)

	detach()
	wantHealth(t, d, check, ReasonDeviceMissing)

	mustUnmount(t, d, target)
	wantHealth(t, d, check, ReasonDeviceMissing, ReasonPublishMountMissing)
}

type healthCheck struct {
	dev, staging, publish string
	block                 bool
}

func wantHealth(t *testing.T, d *LinuxHost, check healthCheck, want ...string) {
	t.Helper()
	v, err := New(d, Options{PathRoots: []string{"/tmp"}})
	if err != nil {
		t.Fatal(err)
	}
	problems, err := v.checkHealth(check.dev, check.staging, check.publish, check.block)
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
