package blockdev

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

const probedDev = "/dev/loop3"

func blkidStep() *commandtest.Step {
	return commandtest.Expect("blkid", "-p", "-o", "export", probedDev)
}

// blkid -p -o export output for a device holding one filesystem, as blkid
// 2.38 prints it.
func blkidFilesystem(fsType string) string {
	return "DEVNAME=" + probedDev + "\nUUID=0b5a8a5e-4f4e-4b8e-9d7e-6a0e3f1c2d11\nBLOCK_SIZE=4096\nTYPE=" + fsType + "\nUSAGE=filesystem\n"
}

func TestProbe(t *testing.T) {
	tests := []struct {
		name   string
		step   *commandtest.Step
		want   Signature
		blank  bool
		String string
	}{
		{"nothing found", blkidStep().Exits(2, ""), Signature{}, true, "no signature"},
		{"filesystem", blkidStep().Prints(blkidFilesystem("xfs")), Signature{Type: "xfs", Usage: "filesystem"}, false, "an xfs filesystem"},
		{"btrfs reads with a", blkidStep().Prints(blkidFilesystem("btrfs")), Signature{Type: "btrfs", Usage: "filesystem"}, false, "a btrfs filesystem"},
		{"partition table", blkidStep().Prints("DEVNAME=" + probedDev + "\nPTUUID=x\nPTTYPE=gpt\n"), Signature{PTType: "gpt"}, false, "a gpt partition table"},
		{"swap", blkidStep().Prints("DEVNAME=" + probedDev + "\nVERSION=1\nTYPE=swap\nUSAGE=other\n"), Signature{Type: "swap", Usage: "other"}, false, "a swap signature"},
		{"lines without '=' are ignored", blkidStep().Prints("garbage\nTYPE=ext4\nUSAGE=filesystem\n"), Signature{Type: "ext4", Usage: "filesystem"}, false, "an ext4 filesystem"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sig, err := NewBlkid(command.New(commandtest.New(t, tc.step), nil)).Probe(context.Background(), probedDev)
			if err != nil {
				t.Fatal(err)
			}
			if sig != tc.want {
				t.Errorf("signature = %+v, want %+v", sig, tc.want)
			}
			if sig.Blank() != tc.blank {
				t.Errorf("Blank() = %v, want %v", sig.Blank(), tc.blank)
			}
			if got := sig.String(); got != tc.String {
				t.Errorf("String() = %q, want %q", got, tc.String)
			}
		})
	}
}

// Only exit status 2 with a silent stderr is blank: every other failure is
// an error, so that nothing is ever formatted for want of an answer.
func TestProbeFailuresAreNeverBlank(t *testing.T) {
	tests := []struct {
		name     string
		step     *commandtest.Step
		kind     error // nil: an error of no kind
		mentions string
	}{
		{"exit 2 with a complaint", blkidStep().Exits(2, "blkid: error: /dev/loop3: Permission denied"), nil, "cannot tell what " + probedDev + " holds"},
		{"more than one signature", blkidStep().Exits(8, ""), errdefs.ErrPrecondition, "more than one signature"},
		{"any other exit status", blkidStep().Exits(4, "blkid: usage error"), nil, "cannot tell what " + probedDev + " holds"},
		{"found but unnamed", blkidStep().Prints("DEVNAME=" + probedDev + "\nUUID=x\n"), errdefs.ErrPrecondition, "cannot name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sig, err := NewBlkid(command.New(commandtest.New(t, tc.step), nil)).Probe(context.Background(), probedDev)
			if err == nil {
				t.Fatalf("Probe = %+v, nil; want an error", sig)
			}
			if tc.kind != nil && !errors.Is(err, tc.kind) {
				t.Errorf("error %v is not %v", err, tc.kind)
			}
			if tc.kind == nil && errdefs.KindOf(err) != nil {
				t.Errorf("error %v has kind %v; a failure to read is no verdict on the device", err, errdefs.KindOf(err))
			}
			if !strings.Contains(err.Error(), tc.mentions) {
				t.Errorf("error %q does not mention %q", err, tc.mentions)
			}
		})
	}
}
