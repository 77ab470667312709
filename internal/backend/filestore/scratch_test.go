package filestore

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/testutil"
)

// scratchSizes are at least what mkfs accepts and what the tests copy (the
// backing files are sparse, so they cost next to nothing).
var scratchSizes = map[string]int64{"xfs": 512 << 20, "btrfs": 256 << 20, "ext4": 256 << 20, "tmpfs": 256 << 20}

var mkfsArgs = map[string][]string{
	"xfs":   {"-q", "-m", "reflink=1"},
	"btrfs": {"-q"},
	"ext4":  {"-q", "-F"},
}

// scratchFS mounts a fresh filesystem of type fstype of size bytes (0:
// scratchSizes) for the test; see testutil.ScratchFilesystem.
func scratchFS(t *testing.T, fstype string, size int64) string {
	t.Helper()
	if size == 0 {
		size = scratchSizes[fstype]
	}
	return testutil.ScratchFilesystem(t, fstype, size, mkfsArgs[fstype]...)
}

// allocated is how many bytes of the file the filesystem has allocated.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}
