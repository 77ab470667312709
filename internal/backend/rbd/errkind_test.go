package rbd

import (
	"context"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
)

// timedOut is what rbd prints when its monitors do not answer within
// client_mount_timeout: an exit status (110, ETIMEDOUT) that means no kind.
const timedOut = "rbd: couldn't connect to the cluster!\nrbd: error opening pool 'kube': (110) Connection timed out"

// An error of no kind while looking for an existing volume or snapshot (a
// timeout, the driver's own deadline) is that error, never "it exists":
// Create and CreateSnapshot answer it and build nothing.
func TestErrorOfNoKindIsNotExistence(t *testing.T) {
	ctx := context.Background()
	volume := "kube/" + hashedName(volumePrefix, "pvc-1")
	script := commandtest.New(t, commandtest.Expect("rbd", with("info", volume, "--format", "json")...).Exits(110, timedOut))
	inst, _ := kernelInstance(t, MounterKRBD, script)
	_, err := inst.Store.Create(ctx, backend.VolumeSpec{Name: "pvc-1", CapacityBytes: 4 << 20, AccessType: backend.AccessMount, FsType: "ext4"})
	if err == nil || !strings.Contains(err.Error(), "Connection timed out") {
		t.Fatalf("Create while the cluster does not answer = %v; want the timeout", err)
	}

	snapshot := "kube/" + hashedName(snapPrefix, "snap-1")
	script = commandtest.New(t, commandtest.Expect("rbd", with("info", snapshot, "--format", "json")...).Exits(110, timedOut))
	inst, _ = kernelInstance(t, MounterKRBD, script)
	_, err = inst.Snapshots.CreateSnapshot(ctx, backend.SnapshotSpec{Name: "snap-1", SourceImageID: "kube/" + testImage})
	if err == nil || !strings.Contains(err.Error(), "Connection timed out") {
		t.Fatalf("CreateSnapshot while the cluster does not answer = %v; want the timeout", err)
	}
}

// An image Spindle did not make has no metadata, and "rbd image-meta list
// --format json" then prints nothing at all (Ceph 16.2.15): no metadata,
// not an error.
func TestImageWithoutMetadata(t *testing.T) {
	script := commandtest.New(t,
		commandtest.Expect("rbd", with("info", "kube/static-1", "--format", "json")...).Prints(`{"name":"static-1","size":67108864,"features":["layering"]}`),
		commandtest.Expect("rbd", with("image-meta", "list", "kube/static-1", "--format", "json")...).Prints(""),
	)
	inst, _ := kernelInstance(t, MounterKRBD, script)
	s := inst.Store.(*Store)
	info, meta, err := s.read(context.Background(), location{cluster: "c", pool: "kube"}.ref("static-1"))
	if err != nil || info.Size != 64<<20 || len(meta) != 0 {
		t.Fatalf("read = %+v, %v, %v; want the image's size and no metadata", info, meta, err)
	}
}
