package blockdev

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

func TestLookupFilesystem(t *testing.T) {
	for _, name := range []string{"ext4", "xfs", "btrfs"} {
		fs, err := LookupFilesystem(name)
		if err != nil {
			t.Fatalf("LookupFilesystem(%q): %v", name, err)
		}
		if fs.Name != name || fs.MkfsCommand(nil, "/dev/x").Name != "mkfs."+name || fs.MinBytes <= 0 {
			t.Errorf("LookupFilesystem(%q) = %+v", name, fs)
		}
	}
	if fs, err := LookupFilesystem(""); err != nil || fs.Name != DefaultFsType {
		t.Errorf("LookupFilesystem(\"\") = %+v, %v; want the default, %s", fs, err, DefaultFsType)
	}
	if _, err := FilesystemNamed(""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("FilesystemNamed(\"\") = %v, want an invalid argument: a filesystem on a device has a name", err)
	}

	for _, name := range []string{"ntfs", "ext4 ", "vfat"} {
		_, err := LookupFilesystem(name)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("LookupFilesystem(%q) = %v, want an invalid argument", name, err)
			continue
		}
		// The caller must learn what to use instead.
		for _, supported := range []string{"btrfs", "ext4", "xfs"} {
			if !strings.Contains(err.Error(), supported) {
				t.Errorf("error %q does not list %q", err, supported)
			}
		}
	}
}

func TestSupportedFilesystemsSorted(t *testing.T) {
	if got, want := SupportedFilesystems(), []string{"btrfs", "ext4", "xfs"}; !slices.Equal(got, want) {
		t.Errorf("SupportedFilesystems() = %q, want %q", got, want)
	}
}

func TestMountOptions(t *testing.T) {
	tests := []struct {
		fs       string
		flags    []string
		readOnly bool
		want     []string
	}{
		{"xfs", nil, false, []string{"nouuid"}},
		{"xfs", nil, true, []string{"nouuid", "ro"}},
		{"xfs", []string{"noatime", "nouuid"}, false, []string{"nouuid", "noatime"}},
		{"xfs", []string{"ro", "noatime"}, true, []string{"nouuid", "ro", "noatime"}},
		{"ext4", nil, false, nil},
		{"ext4", []string{"noatime", "noatime", "discard"}, false, []string{"noatime", "discard"}},
		{"ext4", nil, true, []string{"ro"}},
		{"btrfs", []string{"compress=zstd"}, true, []string{"compress=zstd", "ro"}},
	}
	for _, tc := range tests {
		got := mustFS(t, tc.fs).MountOptions(tc.flags, tc.readOnly)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s.MountOptions(%q, %v) = %q, want %q", tc.fs, tc.flags, tc.readOnly, got, tc.want)
		}
	}
	// MountOptions must not write into the table's own slice: a later call
	// for another volume would inherit this one's flags.
	xfs := mustFS(t, "xfs")
	_ = xfs.MountOptions([]string{"noatime", "largeio"}, true)
	if got := mustFS(t, "xfs").MountOptions(nil, false); !slices.Equal(got, []string{"nouuid"}) {
		t.Errorf("after another call, xfs.MountOptions(nil, false) = %q, want [nouuid]", got)
	}
}

func mustFS(t *testing.T, name string) Filesystem {
	t.Helper()
	fs, err := LookupFilesystem(name)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// The mkfs command line is the filesystem's arguments, the StorageClass's
// options, then the device; building it never writes into the table.
func TestMkfsCommand(t *testing.T) {
	tests := []struct {
		fs      string
		options []string
		want    []string
	}{
		{"ext4", nil, []string{"-q", "-b", "4096", "-m", "0", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1", "/dev/loop3"}},
		{"xfs", []string{"-m", "reflink=1"}, []string{"-q", "-K", "-s", "size=4096", "-m", "reflink=1", "/dev/loop3"}},
		{"btrfs", []string{"-L", "data"}, []string{"-q", "-K", "-L", "data", "/dev/loop3"}},
	}
	for _, tc := range tests {
		cmd := mustFS(t, tc.fs).MkfsCommand(tc.options, "/dev/loop3")
		if cmd.Name != "mkfs."+tc.fs || !slices.Equal(cmd.Args, tc.want) {
			t.Errorf("%s: MkfsCommand = %s %q, want mkfs.%s %q", tc.fs, cmd.Name, cmd.Args, tc.fs, tc.want)
		}
		cmd.Args[0] = "changed"
		if again := mustFS(t, tc.fs).MkfsCommand(tc.options, "/dev/loop3"); !slices.Equal(again.Args, tc.want) {
			t.Errorf("%s: a caller's change to the command reached the table: %q", tc.fs, again.Args)
		}
	}
}
