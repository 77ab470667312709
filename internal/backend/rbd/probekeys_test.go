//go:build cgo && ceph

package rbd_test

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend/rbd"
	"github.com/spindle-csi/spindle/internal/backend/rbd/rbdtest"
)

// krbd's stage check (a key of cipher aes256k on a kernel before Linux
// 7.0 is refused before the map) rests on which kernels can decode such a
// key. On a real kernel (`make vmtest` runs this in its guests, after the
// probe has loaded rbd) the kernel itself is asked: a key it cannot
// decode is refused at once with EINVAL ("libceph: secret too big 32" on
// 6.1); one it can decode gets as far as connecting, to a monitor nobody
// serves, and fails there.
func TestKernelDecodesTheKeysItIsSaidTo(t *testing.T) {
	cl := rbdtest.Require(t)
	if cl.Mounter != rbd.MounterKRBD {
		t.Skipf("the %s mounter does not hand keys to the kernel (%s=krbd does)", cl.Mounter, rbdtest.EnvMounter)
	}
	const add = "/sys/bus/rbd/add_single_major"
	if _, err := os.Stat(add); err != nil {
		t.Skipf("%s: %v (the rbd module is not loaded: run this after TestProbeLoadsTheModuleOnARealKernel)", add, err)
	}
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	release := strings.TrimSpace(string(b))
	for _, k := range []struct {
		cipher, key string
		decodes     bool
	}{
		// ceph-authtool --gen-print-key --key-type aes256k / aes, Ceph 20.2.4.
		{"aes256k", "AgCK+wtrpXvfFiAAM/LlJ3y5JA9VWMTDByKxtnNmLr5/FqP7I955vh1qOHU=", rbd.KernelTakesAES256K(release)},
		{"aes", "AQCK+wtrx3djDRAAvFH2jtQvuI0Yl5FO9Wt1tg==", true},
	} {
		err := os.WriteFile(add, []byte("127.0.0.1:1 name=spindle-probe,secret="+k.key+",mount_timeout=1 nopool noimage -"), 0)
		if err == nil {
			t.Fatalf("Linux %s mapped an image of a monitor nobody serves", release)
		}
		if decoded := !errors.Is(err, syscall.EINVAL); decoded != k.decodes {
			t.Errorf("Linux %s, a key of cipher %s: the map failed with %v; the driver holds that this kernel decodes such keys: %v", release, k.cipher, err, k.decodes)
		} else {
			t.Logf("Linux %s, a key of cipher %s: decoded %v (%v)", release, k.cipher, decoded, err)
		}
	}
}
