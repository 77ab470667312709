package node

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

func TestStageRecordPath(t *testing.T) {
	tests := []struct{ staging, want string }{
		{"/var/lib/kubelet/plugins/kubernetes.io/csi/spindle.csi.dev/0a1b/globalmount", "/var/lib/kubelet/plugins/kubernetes.io/csi/spindle.csi.dev/0a1b/globalmount.spindle-stage.json"},
		{"/var/lib/kubelet/plugins/kubernetes.io/csi/spindle.csi.dev/0a1b/globalmount/", "/var/lib/kubelet/plugins/kubernetes.io/csi/spindle.csi.dev/0a1b/globalmount.spindle-stage.json"},
		// Block staging paths share one parent; the name keeps them apart.
		{"/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/staging/pvc-1", "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/staging/pvc-1.spindle-stage.json"},
		{"/a//b/../c", "/a/c.spindle-stage.json"},
	}
	for _, tc := range tests {
		if got := StageRecordPath(tc.staging); got != tc.want {
			t.Errorf("StageRecordPath(%q) = %q, want %q", tc.staging, got, tc.want)
		}
	}
}

func TestStageRecordRoundTrip(t *testing.T) {
	staging := filepath.Join(t.TempDir(), "globalmount")
	// Kubelet creates the staging directory; the record must not go inside,
	// where the mount would hide it.
	if err := os.Mkdir(staging, 0o750); err != nil {
		t.Fatal(err)
	}

	if _, err := ReadStageRecord(staging); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("ReadStageRecord before any write = %v, want not found", err)
	}

	rec := StageRecord{VolumeID: "loop/default/pvc-1", Device: "/dev/loop3", AccessType: "mount", FsType: "xfs", ReadOnly: true}
	if err := WriteStageRecord(staging, rec); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(staging)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("the staging directory holds %v; the record belongs beside it", entries)
	}
	st, err := os.Stat(filepath.Join(filepath.Dir(staging), "globalmount.spindle-stage.json"))
	if err != nil {
		t.Fatalf("record not beside the staging path: %v", err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("record mode = %v, want 0600", st.Mode().Perm())
	}

	got, err := ReadStageRecord(staging)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 1 {
		t.Errorf("version = %d, want 1", got.Version)
	}
	if got.StagedAt.IsZero() {
		t.Error("StagedAt was not filled in")
	}
	boot, err := ReadBoot()
	if err != nil {
		t.Fatal(err)
	}
	if got.BootID == "" || got.BootID != boot.ID {
		t.Errorf("BootID = %q, want this boot's %q", got.BootID, boot.ID)
	}
	want := rec
	want.Version, want.StagedAt, want.BootID = got.Version, got.StagedAt, got.BootID
	if *got != want {
		t.Errorf("read back %+v, want %+v", *got, want)
	}

	// A given StagedAt is kept, and a rewrite replaces the record.
	at := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	rec2 := StageRecord{VolumeID: "loop/default/pvc-1", Device: "/dev/loop4", AccessType: "block", StagedAt: at}
	if err := WriteStageRecord(staging+"/", rec2); err != nil {
		t.Fatal(err)
	}
	got, err = ReadStageRecord(staging)
	if err != nil {
		t.Fatal(err)
	}
	if got.Device != "/dev/loop4" || got.AccessType != "block" || got.FsType != "" || !got.StagedAt.Equal(at) {
		t.Errorf("after rewrite read %+v", *got)
	}
	// No temporary files left behind by the atomic write.
	siblings, _ := os.ReadDir(filepath.Dir(staging))
	if len(siblings) != 2 {
		t.Errorf("directory holds %d entries, want the staging dir and the record: %v", len(siblings), siblings)
	}

	if err := RemoveStageRecord(staging); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadStageRecord(staging); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("ReadStageRecord after remove = %v, want not found", err)
	}
	if err := RemoveStageRecord(staging); err != nil {
		t.Errorf("removing a missing record must succeed: %v", err)
	}
	if _, err := os.Stat(staging); err != nil {
		t.Errorf("removing the record touched the staging path: %v", err)
	}
}

// A record torn by a power loss describes mounts and devices the power loss
// removed too: it reads as no record (so a block publish asks for a new
// stage), with a message that names the file.
func TestReadStageRecordCorrupt(t *testing.T) {
	staging := filepath.Join(t.TempDir(), "globalmount")
	if err := os.WriteFile(StageRecordPath(staging), []byte("{\"version\": 1, \"device\": "), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := ReadStageRecord(staging)
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("ReadStageRecord of a torn record = %v, want a not-found error", err)
	}
	if !strings.Contains(err.Error(), "unreadable") || !strings.Contains(err.Error(), StageRecordPath(staging)) {
		t.Errorf("error %q should say the record at its path is unreadable", err)
	}
}
