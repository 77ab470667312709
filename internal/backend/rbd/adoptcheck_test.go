package rbd

import (
	"context"
	"slices"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/command/commandtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// adoptSpec adopts kube/testImage into a class of this instance's cluster
// with the parameters given.
func adoptSpec(dryRun bool, params map[string]string) backend.AdoptSpec {
	return backend.AdoptSpec{ImageID: "kube/" + testImage, Name: "pvc-1-spindle", AccessType: backend.AccessMount, FsType: "ext4", Parameters: params, DryRun: dryRun}
}

// What "rbd info --format json" prints of an image of ceph-csi's with
// journaling (captured by TestAdoptJournaledImage, Ceph 16.2.15, the size
// made 1 GiB), and of one with layering only: the same without the
// journal and mirroring keys, which only a journaled image has.
const (
	infoLayering  = `{"name":"` + testImage + `","id":"12a1fd5e012d","size":1073741824,"objects":256,"order":22,"object_size":4194304,"snapshot_count":0,"block_name_prefix":"rbd_data.12a1fd5e012d","format":2,"features":["layering"],"op_features":[],"flags":[],"create_timestamp":"Thu Nov 26 17:52:10 2026","access_timestamp":"Thu Nov 26 17:52:10 2026","modify_timestamp":"Thu Nov 26 17:52:10 2026"}`
	infoJournaled = `{"name":"` + testImage + `","id":"12a1fd5e012d","size":1073741824,"objects":256,"order":22,"object_size":4194304,"snapshot_count":0,"block_name_prefix":"rbd_data.12a1fd5e012d","format":2,"features":["layering","exclusive-lock","journaling"],"op_features":[],"flags":[],"create_timestamp":"Thu Nov 26 17:52:10 2026","access_timestamp":"Thu Nov 26 17:52:10 2026","modify_timestamp":"Thu Nov 26 17:52:10 2026","journal":"12a1fd5e012d","mirroring":{"mode":"journal","state":"disabled"}}`
)

// unadopted is "rbd info" (info) and "rbd image-meta list" of an image of
// ceph-csi's: no metadata of Spindle's.
func unadopted(info string) []*commandtest.Step {
	return []*commandtest.Step{
		commandtest.Expect("rbd", with("info", "kube/"+testImage, "--format", "json")...).Prints(info),
		commandtest.Expect("rbd", with("image-meta", "list", "kube/"+testImage, "--format", "json")...).Prints(""),
	}
}

// An image that ceph-csi still has mapped on a node (its workload runs):
// the dry run, which kubectl spindle adopt makes before it scales the
// workload down, answers who has it open (the node's client, not the
// manager's) and writes nothing; the real adoption, made once the
// workload is down, refuses an image still open and writes nothing either.
func TestAdoptOpenImage(t *testing.T) {
	ctx := context.Background()
	const watched = `{"watchers":[{"address":"10.0.0.7:0/3411306950","client":4152,"cookie":1},{"address":"10.0.0.1:0/2511446081","client":4120,"cookie":2}]}`
	open := func() []*commandtest.Step {
		return append(unadopted(infoLayering),
			commandtest.Expect("rbd", with("status", "kube/"+testImage, "--format", "json")...).Prints(watched),
			commandtest.Expect("ceph", with("mgr", "dump", "--format", "json")...).Prints(mgrDumpOutput))
	}
	inst, _ := kernelInstance(t, MounterKRBD, commandtest.New(t, open()...))
	dry, err := inst.Store.(*Store).Adopt(ctx, adoptSpec(true, nil))
	if err != nil {
		t.Fatalf("dry run of an open image: %v", err)
	}
	if !slices.Equal(dry.OpenBy, []string{"10.0.0.7:0/3411306950"}) || dry.Image.Name != "pvc-1-spindle" || dry.Image.CapacityBytes != 1<<30 {
		t.Fatalf("dry run = %+v (image %+v); want the volume, open by the node's client only", dry, dry.Image)
	}

	inst, _ = kernelInstance(t, MounterKRBD, commandtest.New(t, open()...))
	_, err = inst.Store.(*Store).Adopt(ctx, adoptSpec(false, nil))
	testutil.WantKind(t, err, errdefs.ErrPrecondition, "still open by [10.0.0.7:0/3411306950]", "nothing was changed")
}

// An image whose features the class's mounter cannot map (ceph-csi's
// journaling, for krbd) is refused before its watchers are even looked at
// and before anything is written, in a dry run too, naming the feature and
// the mounter; the same image under a class of rbd-nbd is adopted.
func TestAdoptChecksTheImageFeatures(t *testing.T) {
	ctx := context.Background()
	for _, dryRun := range []bool{true, false} {
		inst, _ := kernelInstance(t, MounterKRBD, commandtest.New(t, unadopted(infoJournaled)...))
		_, err := inst.Store.(*Store).Adopt(ctx, adoptSpec(dryRun, map[string]string{ParamMounter: "krbd"}))
		testutil.WantKind(t, err, errdefs.ErrPrecondition, "journaling", "krbd", "rbd-nbd")
	}

	steps := append(unadopted(infoJournaled),
		commandtest.Expect("rbd", with("status", "kube/"+testImage, "--format", "json")...).Prints(`{"watchers":[]}`))
	inst, _ := kernelInstance(t, MounterKRBD, commandtest.New(t, steps...))
	dry, err := inst.Store.(*Store).Adopt(ctx, adoptSpec(true, map[string]string{ParamMounter: "rbd-nbd"}))
	if err != nil || len(dry.OpenBy) != 0 {
		t.Fatalf("dry run of a journaled image into a class of rbd-nbd = %+v, %v", dry, err)
	}
}
