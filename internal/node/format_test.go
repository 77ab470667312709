package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

const (
	testDev    = "/dev/loop3"
	testTarget = "/var/lib/kubelet/plugins/kubernetes.io/csi/spindle.csi.dev/abc/globalmount"
)

// Command lines as the Script reports them in Ran().
var (
	blkidLine     = "blkid -p -o export " + testDev
	ext4MkfsArgs  = []string{"-q", "-b", "4096", "-m", "0", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1"}
	xfsMkfsArgs   = []string{"-q", "-K", "-s", "size=4096"}
	btrfsMkfsArgs = []string{"-q", "-K"}
)

func blkid() *commandtest.Step { return commandtest.Expect("blkid", "-p", "-o", "export", testDev) }

func mkfs(fs string, args ...string) *commandtest.Step {
	return commandtest.Expect("mkfs."+fs, args...)
}

func join(parts ...[]string) []string { return slices.Concat(parts...) }

// blkid -p -o export output for a device holding one filesystem, as blkid
// 2.38 prints it.
func blkidFilesystem(fsType string) string {
	return "DEVNAME=" + testDev + "\nUUID=0b5a8a5e-4f4e-4b8e-9d7e-6a0e3f1c2d11\nBLOCK_SIZE=4096\nTYPE=" + fsType + "\nUSAGE=filesystem\n"
}

func mustFS(t *testing.T, name string) blockdev.Filesystem {
	t.Helper()
	fs, err := blockdev.LookupFilesystem(name)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// TestStageFilesystem drives the whole stage step (probe, format, record,
// mount) through scripted commands and checks the exact command lines, and
// where the "formatted" record falls among them.
func TestStageFilesystem(t *testing.T) {
	errStore := errors.New("image store: write metadata: no space left on device")
	tests := []struct {
		name             string
		fs               string
		alreadyFormatted bool
		readOnly         bool
		mkfsOptions      []string
		mountOptions     []string
		steps            []*commandtest.Step
		recordErr        error

		wantFormatted bool
		// wantRecordedAfter lists the commands that must have run, and no
		// others, when recordFormatted is called; nil: it must not be called.
		wantRecordedAfter []string
		wantKind          error // nil: success expected unless wantErr is set
		wantErr           []string
	}{
		{
			name:         "blank device gets ext4 with the default and the StorageClass options, then mounts",
			fs:           "ext4",
			mkfsOptions:  []string{"-b", "4096", "-L", "data"},
			mountOptions: []string{"noatime", "discard"},
			steps: []*commandtest.Step{
				blkid().Exits(2, ""),
				mkfs("ext4", join(ext4MkfsArgs, []string{"-b", "4096", "-L", "data", testDev})...),
				commandtest.Expect("mount", "-t", "ext4", "-o", "noatime,discard", testDev, testTarget),
			},
			wantFormatted:     true,
			wantRecordedAfter: []string{blkidLine, "mkfs.ext4 " + strings.Join(join(ext4MkfsArgs, []string{"-b", "4096", "-L", "data", testDev}), " ")},
		},
		{
			name:         "blank device gets xfs and mounts with nouuid",
			fs:           "xfs",
			mountOptions: []string{"nouuid"},
			steps: []*commandtest.Step{
				blkid().Exits(2, ""),
				mkfs("xfs", join(xfsMkfsArgs, []string{testDev})...),
				commandtest.Expect("mount", "-t", "xfs", "-o", "nouuid", testDev, testTarget),
			},
			wantFormatted:     true,
			wantRecordedAfter: []string{blkidLine, "mkfs.xfs " + strings.Join(join(xfsMkfsArgs, []string{testDev}), " ")},
		},
		{
			name: "blank device gets btrfs; no mount options means no -o",
			fs:   "btrfs",
			steps: []*commandtest.Step{
				blkid().Exits(2, ""),
				mkfs("btrfs", join(btrfsMkfsArgs, []string{testDev})...),
				commandtest.Expect("mount", "-t", "btrfs", testDev, testTarget),
			},
			wantFormatted:     true,
			wantRecordedAfter: []string{blkidLine, "mkfs.btrfs -q -K " + testDev},
		},
		{
			name: "requested filesystem already there and the store does not know: record, size check, mount, no mkfs",
			fs:   "ext4",
			steps: []*commandtest.Step{
				blkid().Prints(blkidFilesystem("ext4")),
				sizeStep(t, "ext4", 1<<30), // fills the 1 GiB device
				commandtest.Expect("mount", "-t", "ext4", testDev, testTarget),
			},
			wantRecordedAfter: []string{blkidLine},
		},
		{
			// ControllerExpandVolume while nobody had the volume staged.
			name:             "ext4 smaller than its device: checked and grown offline before the mount",
			fs:               "ext4",
			alreadyFormatted: true,
			steps: []*commandtest.Step{
				blkid().Prints(blkidFilesystem("ext4")),
				sizeStep(t, "ext4", 512<<20),
				e2fsck(),
				resize2fs(),
				commandtest.Expect("mount", "-t", "ext4", testDev, testTarget),
			},
		},
		{
			name:             "xfs smaller than its device: grown once mounted",
			fs:               "xfs",
			alreadyFormatted: true,
			mountOptions:     []string{"nouuid"},
			steps: []*commandtest.Step{
				blkid().Prints(blkidFilesystem("xfs")),
				commandtest.Expect("mount", "-t", "xfs", "-o", "nouuid", testDev, testTarget),
				sizeStep(t, "xfs", 512<<20),
				commandtest.Expect("xfs_growfs", testTarget),
			},
		},
		{
			name:             "btrfs that fills its device: size check only",
			fs:               "btrfs",
			alreadyFormatted: true,
			steps: []*commandtest.Step{
				blkid().Prints(blkidFilesystem("btrfs")),
				commandtest.Expect("mount", "-t", "btrfs", testDev, testTarget),
				sizeStep(t, "btrfs", 1<<30),
			},
		},
		{
			name:             "requested filesystem already there and recorded: mount only",
			fs:               "xfs",
			alreadyFormatted: true,
			mountOptions:     []string{"nouuid", "ro"},
			readOnly:         true,
			steps: []*commandtest.Step{
				blkid().Prints(blkidFilesystem("xfs")),
				commandtest.Expect("mount", "-t", "xfs", "-o", "nouuid,ro", testDev, testTarget),
			},
		},
		{
			name:     "xfs found when ext4 asked: refused untouched",
			fs:       "ext4",
			steps:    []*commandtest.Step{blkid().Prints(blkidFilesystem("xfs"))},
			wantKind: errdefs.ErrPrecondition,
			wantErr:  []string{testDev, "xfs filesystem", "not ext4", "untouched"},
		},
		{
			name:             "ext3 found when ext4 asked: refused even though the store says formatted",
			fs:               "ext4",
			alreadyFormatted: true,
			steps:            []*commandtest.Step{blkid().Prints(blkidFilesystem("ext3"))},
			wantKind:         errdefs.ErrPrecondition,
			wantErr:          []string{"ext3 filesystem"},
		},
		{
			name: "GPT partition table: refused",
			fs:   "ext4",
			steps: []*commandtest.Step{
				blkid().Prints("DEVNAME=" + testDev + "\nPTUUID=5e1f6a2b-8c3d-4e5f-a6b7-c8d9e0f1a2b3\nPTTYPE=gpt\n"),
			},
			wantKind: errdefs.ErrPrecondition,
			wantErr:  []string{"gpt partition table"},
		},
		{
			name: "DOS partition table: refused",
			fs:   "xfs",
			steps: []*commandtest.Step{
				blkid().Prints("DEVNAME=" + testDev + "\nPTUUID=1c2d3e4f\nPTTYPE=dos\n"),
			},
			wantKind: errdefs.ErrPrecondition,
			wantErr:  []string{"dos partition table"},
		},
		{
			name: "LVM physical volume: refused, named",
			fs:   "ext4",
			steps: []*commandtest.Step{
				blkid().Prints("DEVNAME=" + testDev + "\nUUID=Xc2d3e-4f5g\nVERSION=LVM2 001\nTYPE=LVM2_member\nUSAGE=raid\n"),
			},
			wantKind: errdefs.ErrPrecondition,
			wantErr:  []string{"LVM2_member signature"},
		},
		{
			name:     "signature blkid cannot name: refused, not taken for blank",
			fs:       "ext4",
			steps:    []*commandtest.Step{blkid().Prints("DEVNAME=" + testDev + "\nSBMAGIC=XFSB\n")},
			wantKind: errdefs.ErrPrecondition,
			wantErr:  []string{"cannot name", "SBMAGIC=XFSB"},
		},
		{
			name:     "ambivalent probe (exit 8): refused",
			fs:       "ext4",
			steps:    []*commandtest.Step{blkid().Exits(8, "blkid: /dev/loop3: ambivalent result (probably more filesystems on the device, use wipefs(8) to see more details)")},
			wantKind: errdefs.ErrPrecondition,
			wantErr:  []string{"more than one signature", "ambivalent result"},
		},
		{
			name:    "blkid usage error (exit 4): error, no mkfs",
			fs:      "ext4",
			steps:   []*commandtest.Step{blkid().Exits(4, "blkid: unrecognized option '-p'")},
			wantErr: []string{"cannot tell what " + testDev + " holds", "unrecognized option"},
		},
		{
			name:    "blkid exit 1: error, no mkfs",
			fs:      "ext4",
			steps:   []*commandtest.Step{blkid().Exits(1, "blkid: something odd")},
			wantErr: []string{"cannot tell what " + testDev + " holds", "something odd"},
		},
		{
			name:    "blkid cannot start: error, no mkfs",
			fs:      "ext4",
			steps:   []*commandtest.Step{blkid().FailsToStart(errors.New(`exec: "blkid": executable file not found in $PATH`))},
			wantErr: []string{"cannot tell what " + testDev + " holds", "executable file not found"},
		},
		{
			// blkid -p exits 2 ("nothing found") also when it cannot open
			// the device; only a silent exit 2 means blank.
			name:    "blkid exit 2 with an open error: error, no mkfs",
			fs:      "ext4",
			steps:   []*commandtest.Step{blkid().Exits(2, "blkid: error: /dev/loop3: Permission denied")},
			wantErr: []string{"cannot tell what " + testDev + " holds", "Permission denied"},
		},
		{
			name:             "store says formatted but the device reads blank: refused, no mkfs",
			fs:               "ext4",
			alreadyFormatted: true,
			steps:            []*commandtest.Step{blkid().Exits(2, "")},
			wantKind:         errdefs.ErrPrecondition,
			wantErr:          []string{"formatted before", "refusing to format it again"},
		},
		{
			name:     "read-only blank device: refused, no mkfs",
			fs:       "xfs",
			readOnly: true,
			steps:    []*commandtest.Step{blkid().Exits(2, "")},
			wantKind: errdefs.ErrPrecondition,
			wantErr:  []string{"read-only", "cannot be formatted"},
		},
		{
			name: "mkfs fails: error carries stderr, nothing recorded, no mount",
			fs:   "ext4",
			steps: []*commandtest.Step{
				blkid().Exits(2, ""),
				mkfs("ext4", join(ext4MkfsArgs, []string{testDev})...).Exits(1, "mke2fs: Device size reported to be zero."),
			},
			wantErr: []string{"create ext4 filesystem on " + testDev, "Device size reported to be zero"},
		},
		{
			name: "recording the format fails: no mount",
			fs:   "ext4",
			steps: []*commandtest.Step{
				blkid().Exits(2, ""),
				mkfs("ext4", join(ext4MkfsArgs, []string{testDev})...),
			},
			recordErr:         errStore,
			wantFormatted:     true,
			wantRecordedAfter: []string{blkidLine, "mkfs.ext4 " + strings.Join(join(ext4MkfsArgs, []string{testDev}), " ")},
			wantErr:           []string{"record that " + testDev + " holds ext4", "no space left on device"},
		},
		{
			name: "mount fails after mkfs: formatted reported, error carries stderr",
			fs:   "ext4",
			steps: []*commandtest.Step{
				blkid().Exits(2, ""),
				mkfs("ext4", join(ext4MkfsArgs, []string{testDev})...),
				commandtest.Expect("mount", "-t", "ext4", testDev, testTarget).Exits(32, "mount: "+testTarget+": mount point does not exist."),
			},
			wantFormatted:     true,
			wantRecordedAfter: []string{blkidLine, "mkfs.ext4 " + strings.Join(join(ext4MkfsArgs, []string{testDev}), " ")},
			wantErr:           []string{"mount " + testDev + " on " + testTarget, "mount point does not exist"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, script := scriptedHost(t, tc.steps...)
			var recorded [][]string
			record := func(ctx context.Context) error {
				recorded = append(recorded, script.Ran())
				return tc.recordErr
			}
			req := FormatRequest{
				Device: testDev, Filesystem: mustFS(t, tc.fs), MkfsOptions: tc.mkfsOptions,
				AlreadyFormatted: tc.alreadyFormatted, ReadOnly: tc.readOnly,
			}
			formatted, err := stageFilesystem(context.Background(), d, req, testTarget, tc.mountOptions, record)

			wantFail := tc.wantKind != nil || len(tc.wantErr) > 0
			switch {
			case wantFail && err == nil:
				t.Fatalf("StageFilesystem succeeded, want an error")
			case !wantFail && err != nil:
				t.Fatalf("StageFilesystem: %v", err)
			}
			if tc.wantKind != nil && !errors.Is(err, tc.wantKind) {
				t.Errorf("error %q is not of kind %q", err, tc.wantKind)
			}
			if tc.wantKind == nil && err != nil && errors.Is(err, errdefs.ErrPrecondition) {
				// A broken tool or a failed write is not the caller's fault
				// and must not read as "the device holds something else".
				t.Errorf("error %q must not be a precondition failure", err)
			}
			for _, s := range tc.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			if formatted != tc.wantFormatted {
				t.Errorf("formatted = %v, want %v", formatted, tc.wantFormatted)
			}
			switch {
			case tc.wantRecordedAfter == nil && len(recorded) > 0:
				t.Errorf("recordFormatted called (after %q), want it not called", recorded[0])
			case tc.wantRecordedAfter != nil && len(recorded) != 1:
				t.Errorf("recordFormatted called %d times, want once", len(recorded))
			case tc.wantRecordedAfter != nil && !slices.Equal(recorded[0], tc.wantRecordedAfter):
				t.Errorf("recordFormatted called after\n  %q\nwant after exactly\n  %q", recorded[0], tc.wantRecordedAfter)
			}
			// The Script has already checked that exactly the steps ran;
			// restate the safety property so a wrong table cannot hide it.
			if err != nil {
				refused := errors.Is(err, errdefs.ErrPrecondition) || strings.HasPrefix(err.Error(), "cannot tell")
				for _, line := range script.Ran() {
					if refused && strings.HasPrefix(line, "mkfs") {
						t.Errorf("%q ran although the device was refused or could not be probed", line)
					}
					if strings.HasPrefix(line, "mount") && !strings.HasPrefix(err.Error(), "mount ") {
						t.Errorf("%q ran although an earlier step failed", line)
					}
				}
			}
		})
	}
}

// TestEnsureFilesystem checks the format decision on its own: it never
// mounts and never records.
func TestEnsureFilesystem(t *testing.T) {
	tests := []struct {
		name          string
		req           FormatRequest
		steps         []*commandtest.Step
		wantFormatted bool
		wantKind      error
	}{
		{
			name: "blank: mkfs with options after the defaults and the device last",
			req:  FormatRequest{Device: testDev, Filesystem: mustFS(t, "xfs"), MkfsOptions: []string{"-m", "reflink=1"}},
			steps: []*commandtest.Step{
				blkid().Exits(2, ""),
				mkfs("xfs", "-q", "-K", "-s", "size=4096", "-m", "reflink=1", testDev),
			},
			wantFormatted: true,
		},
		{
			name:  "holds the filesystem: nothing to do",
			req:   FormatRequest{Device: testDev, Filesystem: mustFS(t, "btrfs")},
			steps: []*commandtest.Step{blkid().Prints(blkidFilesystem("btrfs"))},
		},
		{
			name:     "holds another filesystem: refused",
			req:      FormatRequest{Device: testDev, Filesystem: mustFS(t, "btrfs")},
			steps:    []*commandtest.Step{blkid().Prints(blkidFilesystem("ext4"))},
			wantKind: errdefs.ErrPrecondition,
		},
		{
			// TYPE alone is not enough: a swap area or a RAID member
			// named like a filesystem is still not one.
			name:     "type matches but usage is not filesystem: refused",
			req:      FormatRequest{Device: testDev, Filesystem: mustFS(t, "ext4")},
			steps:    []*commandtest.Step{blkid().Prints("DEVNAME=" + testDev + "\nTYPE=ext4\nUSAGE=other\n")},
			wantKind: errdefs.ErrPrecondition,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := scriptedHost(t, tc.steps...)
			formatted, err := ensureFilesystem(context.Background(), d, tc.req)
			if tc.wantKind != nil {
				if !errors.Is(err, tc.wantKind) {
					t.Fatalf("err = %v, want kind %v", err, tc.wantKind)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if formatted != tc.wantFormatted {
				t.Errorf("formatted = %v, want %v", formatted, tc.wantFormatted)
			}
		})
	}
}

// blkid exits 2, silently, for paths it could not really probe (no such
// device, a zero-sized detached loop device): such a "blank" must never
// reach mkfs.
func TestEnsureFilesystemRefusesWhatIsNoUsableDevice(t *testing.T) {
	tests := []struct {
		name string
		size func(string) (int64, error)
	}{
		{"not a block device", func(p string) (int64, error) { return 0, fmt.Errorf("%s is not a block device", p) }},
		{"zero-sized device", func(string) (int64, error) { return 0, nil }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := scriptedHost(t, blkid().Exits(2, "")) // and nothing after it: no mkfs
			d.deviceSize = tc.size
			formatted, err := ensureFilesystem(context.Background(), d, FormatRequest{Device: testDev, Filesystem: mustFS(t, "ext4")})
			if !errors.Is(err, errdefs.ErrPrecondition) || formatted {
				t.Fatalf("formatted=%v err=%v, want a precondition failure and no mkfs", formatted, err)
			}
			if !strings.Contains(err.Error(), testDev) {
				t.Fatalf("error %q does not name the device", err)
			}
		})
	}
}
