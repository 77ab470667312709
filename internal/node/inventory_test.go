package node

import (
	"github.com/spindle-csi/spindle/internal/backend"

	"os"
	"path/filepath"
	"testing"
)

// FindStageRecords finds the records kubelet's staging paths leave (a
// filesystem volume's beside its globalmount, a block volume's beside its
// staging file), and never looks inside a mount point or too deep.
func TestFindStageRecords(t *testing.T) {
	root := filepath.Join(t.TempDir(), "plugins/kubernetes.io/csi")
	fsStaging := filepath.Join(root, "spindle.csi.dev/0abc/globalmount")
	blockStaging := filepath.Join(root, "volumeDevices/staging/pvc-block")
	// A record inside a mounted volume (a pod wrote it, or a nested
	// kubelet dir): it describes nothing on this node.
	inMount := filepath.Join(root, "spindle.csi.dev/0def/globalmount/data/globalmount")
	tooDeep := filepath.Join(root, "a/b/c/d/globalmount")
	for _, p := range []string{fsStaging, filepath.Dir(blockStaging), inMount, tooDeep, filepath.Join(root, "spindle.csi.dev/0bad")} {
		if err := os.MkdirAll(p, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	for staging, id := range map[string]string{
		fsStaging: "loop/default/pvc-fs", blockStaging: "loop/default/pvc-block",
		inMount: "loop/default/pvc-inside", tooDeep: "loop/default/pvc-deep",
	} {
		if err := WriteStageRecord(staging, StageRecord{VolumeID: id, Device: "/dev/loop9", AccessType: "mount"}); err != nil {
			t.Fatal(err)
		}
	}
	// An unreadable record counts as none, as ReadStageRecord has it.
	if err := os.WriteFile(StageRecordPath(filepath.Join(root, "spindle.csi.dev/0bad/globalmount")), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	mounts := []Mount{{MountPoint: Resolve(filepath.Join(root, "spindle.csi.dev/0def/globalmount"))}}

	got, err := FindStageRecords(root, mounts)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range got {
		ids = append(ids, r.Record.VolumeID+"@"+r.StagingPath)
	}
	want := []string{"loop/default/pvc-fs@" + fsStaging, "loop/default/pvc-block@" + blockStaging}
	if len(ids) != 2 || ids[0] != want[0] || ids[1] != want[1] {
		t.Errorf("FindStageRecords = %v, want %v", ids, want)
	}

	if got, err := FindStageRecords(filepath.Join(t.TempDir(), "none"), nil); err != nil || len(got) != 0 {
		t.Errorf("FindStageRecords of a missing root = %v, %v; want none and no error", got, err)
	}
}

func TestStagingMountState(t *testing.T) {
	w := newWorld(t)
	a := w.newVolume("pvc-a", backend.AccessMount, backend.SingleNodeWriter, false)
	b := w.newVolume("pvc-b", backend.AccessMount, backend.SingleNodeWriter, false)
	w.mustStage(a)
	w.mustStage(b)
	w.mustPublish(b, a.target, false) // b's filesystem at a path of a's
	tests := []struct {
		name, path, device, want string
	}{
		{"the device", a.staging, "/dev/loop0", MountStateMounted},
		{"another device", a.target, "/dev/loop0", MountStateWrongDevice},
		{"nothing mounted", "/var/lib/kubelet/none", "/dev/loop0", MountStateMissing},
		{"a device that is gone, named by the mount", a.staging, "/dev/loop7", MountStateWrongDevice},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := w.v.stagingMountState(tt.path, tt.device); got != tt.want {
				t.Errorf("stagingMountState = %s, want %s", got, tt.want)
			}
		})
	}
	w.host.KillMount(b.staging)
	if got := w.v.stagingMountState(b.staging, "/dev/loop1"); got != MountStateDead {
		t.Errorf("stagingMountState of a dead mount = %s", got)
	}
}
