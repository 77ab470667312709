package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	utilexec "k8s.io/utils/exec"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
)

// hookedExec passes every command to a Script and, before it does, calls
// before with the command. Tests use it to change the fake mount table the
// way the kernel would when umount runs, which a Script alone cannot do.
type hookedExec struct {
	*commandtest.Script
	before func(name string, args []string)
}

func (h *hookedExec) CommandContext(ctx context.Context, name string, args ...string) utilexec.Cmd {
	if h.before != nil {
		h.before(name, args)
	}
	return h.Script.CommandContext(ctx, name, args...)
}

// scriptedDataPath returns a DataPath whose commands must be exactly steps and
// whose mount table is a file the test owns (empty: nothing mounted), so a
// unit test never reads the host's real mounts.
func scriptedDataPath(t *testing.T, steps ...*commandtest.Step) (*DataPath, *commandtest.Script) {
	t.Helper()
	script := commandtest.New(t, steps...)
	d := New(command.New(script, nil))
	d.mountInfoPath = writeMountInfo(t, filepath.Join(t.TempDir(), "mountinfo"), "")
	d.deviceSize = fakeDeviceSize
	return d, script
}

// hookedDataPath is scriptedDataPath with a hook run before each command.
func hookedDataPath(t *testing.T, mountInfo string, before func(name string, args []string), steps ...*commandtest.Step) (*DataPath, *commandtest.Script) {
	t.Helper()
	script := commandtest.New(t, steps...)
	d := New(command.New(&hookedExec{Script: script, before: before}, nil))
	d.mountInfoPath = mountInfo
	d.deviceSize = fakeDeviceSize
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
