package node

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
)

// scriptedHost returns a DataPath whose commands must be exactly steps and
// whose mount table is a file the test owns (empty: nothing mounted), so a
// unit test never reads the host's real mounts.
func scriptedHost(t *testing.T, steps ...*commandtest.Step) (*LinuxHost, *commandtest.Script) {
	t.Helper()
	script := commandtest.New(t, steps...)
	d := NewLinuxHost(command.New(script, nil))
	d.mountInfoPath = writeMountInfo(t, filepath.Join(t.TempDir(), "mountinfo"), "")
	d.deviceSize = fakeDeviceSize
	d.kernel = NewFakeKernelMounts()
	// What the node plugin's programs may do is a fact of the test machine;
	// a unit test that depends on it says what it assumes.
	d.programsHaveCapability = func(uint) (bool, error) { return false, errors.New("capabilities not scripted") }
	return d, script
}

func writeMountInfo(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// fakeDeviceSize stands in for the sysfs lookup: the scripted devices
// (/dev/loop3, ...) are 1 GiB block devices.
func fakeDeviceSize(string) (int64, error) { return 1 << 30, nil }

// Sizes the tests use.
const (
	kib = 1 << 10
	mib = 1 << 20
)
