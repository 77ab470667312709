package node

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeKernelFiles points ReadBoot at a boot_id and a /proc/stat written
// here, for the rest of the test.
func fakeKernelFiles(t *testing.T, bootID, stat string) {
	t.Helper()
	dir := t.TempDir()
	oldID, oldStat := bootIDFile, procStatFile
	t.Cleanup(func() { bootIDFile, procStatFile = oldID, oldStat })
	bootIDFile, procStatFile = filepath.Join(dir, "boot_id"), filepath.Join(dir, "stat")
	for path, data := range map[string]string{bootIDFile: bootID, procStatFile: stat} {
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReadBoot(t *testing.T) {
	tests := []struct {
		name, stat string
		want       Boot
		wantErr    string
	}{
		{
			name: "boot ID and btime",
			stat: "cpu  10 0 20 300 0 0 0 0 0 0\nintr 1 2\nctxt 77\nbtime 1795629417\nprocesses 900\n",
			want: Boot{ID: "f98e05e7-741c-4502-9d0a-b9726eb2575f", Time: time.Unix(1795629417, 0).UTC()},
		},
		{
			name:    "no btime line",
			stat:    "cpu  10 0 20 300 0 0 0 0 0 0\n",
			want:    Boot{ID: "f98e05e7-741c-4502-9d0a-b9726eb2575f"},
			wantErr: "has no btime line",
		},
		{
			name:    "btime that is not a number",
			stat:    "btime soon\n",
			want:    Boot{ID: "f98e05e7-741c-4502-9d0a-b9726eb2575f"},
			wantErr: `btime "soon"`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fakeKernelFiles(t, "f98e05e7-741c-4502-9d0a-b9726eb2575f\n", tc.stat)
			got, err := ReadBoot()
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("ReadBoot error = %v, want %q", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("ReadBoot = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The real kernel's files: what the node plugin reads.
func TestReadBootOfThisKernel(t *testing.T) {
	b, err := ReadBoot()
	if err != nil {
		t.Fatal(err)
	}
	if len(b.ID) != 36 || !b.Time.Before(time.Now()) || b.Time.Before(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("ReadBoot = %+v: want a 36-character ID and a boot time in the past", b)
	}
}

func TestEarlierBoot(t *testing.T) {
	booted := time.Date(2026, 11, 25, 18, 21, 10, 0, time.UTC)
	boot := Boot{ID: "this-boot", Time: booted}
	tests := []struct {
		name string
		boot Boot
		rec  StageRecord
		want bool
	}{
		{"written in this boot", boot, StageRecord{BootID: "this-boot", StagedAt: booted.Add(time.Minute)}, false},
		{"written in another boot", boot, StageRecord{BootID: "last-boot", StagedAt: booted.Add(-time.Minute)}, true},
		// The boot ID decides, whatever the clock said.
		{"another boot, clock behind", boot, StageRecord{BootID: "last-boot", StagedAt: booted.Add(time.Hour)}, true},
		{"no boot ID, staged before the boot", boot, StageRecord{StagedAt: booted.Add(-time.Second)}, true},
		{"no boot ID, staged in the boot's first second", boot, StageRecord{StagedAt: booted}, false},
		{"no boot ID, staged after the boot", boot, StageRecord{StagedAt: booted.Add(time.Second)}, false},
		{"the boot ID unreadable: StagedAt decides", Boot{Time: booted}, StageRecord{BootID: "last-boot", StagedAt: booted.Add(-time.Hour)}, true},
		{"nothing to tell by", Boot{}, StageRecord{StagedAt: booted}, false},
		{"no StagedAt", boot, StageRecord{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.boot.EarlierBoot(tc.rec); got != tc.want {
				t.Errorf("EarlierBoot(%+v) with %+v = %v, want %v", tc.rec, tc.boot, got, tc.want)
			}
		})
	}
}

// After a reboot the records of the earlier boot go, unless something is
// mounted at their staging path; this boot's records stay.
func TestForgetEarlierBoots(t *testing.T) {
	booted := time.Date(2026, 11, 25, 18, 21, 10, 0, time.UTC)
	boot := Boot{ID: "this-boot", Time: booted}
	root := filepath.Join(t.TempDir(), "plugins/kubernetes.io/csi")
	staging := func(name string) string { return filepath.Join(root, "spindle.csi.dev", name, "globalmount") }
	records := map[string]StageRecord{
		"current":           {VolumeID: "rbd/ceph/pool/current", BootID: "this-boot", StagedAt: booted.Add(time.Minute)},
		"earlier":           {VolumeID: "rbd/ceph/pool/earlier", BootID: "last-boot", StagedAt: booted.Add(-time.Minute)},
		"earlier-mounted":   {VolumeID: "rbd/ceph/pool/earlier-mounted", BootID: "last-boot", StagedAt: booted.Add(-time.Minute)},
		"old-format-before": {VolumeID: "rbd/ceph/pool/old-before", StagedAt: booted.Add(-time.Hour)},
		"old-format-after":  {VolumeID: "rbd/ceph/pool/old-after", StagedAt: booted.Add(time.Hour)},
	}
	for name, rec := range records {
		if err := os.MkdirAll(staging(name), 0o750); err != nil {
			t.Fatal(err)
		}
		rec.Device, rec.AccessType = "/dev/rbd0", "mount"
		if rec.BootID != "" {
			if err := WriteStageRecord(staging(name), rec); err != nil {
				t.Fatal(err)
			}
			continue
		}
		// As a driver from before boot IDs wrote it (WriteStageRecord
		// would add this boot's).
		rec.Version = stageRecordVersion
		data, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), "bootID") {
			t.Fatalf("an old record has no bootID: %s", data)
		}
		if err := os.WriteFile(StageRecordPath(staging(name)), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	mounts := []Mount{{MountPoint: Resolve(staging("earlier-mounted")), Source: "/dev/rbd0"}}

	forgotten, err := ForgetEarlierBoots(realFiles, root, mounts, boot)
	if err != nil {
		t.Fatal(err)
	}
	var gone []string
	for _, r := range forgotten {
		gone = append(gone, r.Record.VolumeID)
	}
	if strings.Join(gone, " ") != "rbd/ceph/pool/earlier rbd/ceph/pool/old-before" {
		t.Errorf("forgotten = %v, want the earlier boot's unmounted records", gone)
	}
	left, err := FindStageRecords(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, r := range left {
		kept = append(kept, r.Record.VolumeID)
	}
	if strings.Join(kept, " ") != "rbd/ceph/pool/current rbd/ceph/pool/earlier-mounted rbd/ceph/pool/old-after" {
		t.Errorf("records left = %v", kept)
	}
	for _, name := range []string{"earlier", "old-format-before"} {
		if _, err := os.Stat(staging(name)); err != nil {
			t.Errorf("the staging directory is kubelet's and must stay: %v", err)
		}
	}

	// Once forgotten, nothing is left to forget.
	if again, err := ForgetEarlierBoots(realFiles, root, mounts, boot); err != nil || len(again) != 0 {
		t.Errorf("second ForgetEarlierBoots = %v, %v; want nothing", again, err)
	}
}
