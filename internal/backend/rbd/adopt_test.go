package rbd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/rbd"
	"github.com/spindle-csi/spindle/internal/backend/rbd/rbdtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// dataObjects counts the RADOS objects that hold pool/image's data.
func dataObjects(ctx context.Context, t *testing.T, cl *rbdtest.Cluster, image string) int {
	t.Helper()
	out, err := cl.RBD(ctx, "info", "--format", "json", cl.Pool+"/"+image)
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Prefix string `json:"block_name_prefix"`
	}
	if err := json.Unmarshal(out, &info); err != nil || info.Prefix == "" {
		t.Fatalf("rbd info %s: %q, %v", image, out, err)
	}
	cmd := exec.CommandContext(ctx, "rados", "-c", cl.Conf, "-p", cl.Pool, "ls")
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	objs, err := cmd.Output()
	if err != nil {
		t.Fatalf("rados ls: %v", err)
	}
	n := 0
	for _, o := range strings.Fields(string(objs)) {
		if strings.HasPrefix(o, info.Prefix+".") {
			n++
		}
	}
	return n
}

// TestAdoptCephCSIImage: an image made as ceph-csi makes one (in the pool,
// with data, no Spindle metadata; its PV names it in volumeAttributes
// imageName) becomes a Spindle volume in place: the dry run writes
// nothing, the adoption writes only metadata (the data objects and the
// data are unchanged), adopting again is idempotent and under another
// name refused (also one that stopped half-written is finished), and the
// adopted volume is snapshotted and restored as any other.
func TestAdoptCephCSIImage(t *testing.T) {
	cl := rbdtest.Require(t)
	inst, s, ctx := controller(t, cl, rbd.Config{}, nil)
	const image = "csi-vol-6b9ffd6d-4f49-4ea2-9e5b-2bb2e3f9fb4a"
	if _, err := cl.RBD(ctx, "create", "--size", "256M", "--image-feature", "layering", cl.Pool+"/"+image); err != nil {
		t.Fatal(err)
	}
	const written = 64 * MiB
	sum, err := cl.WriteRandom(ctx, image, written, 30)
	if err != nil {
		t.Fatal(err)
	}
	objects := dataObjects(ctx, t, cl, image)
	if objects != int(written/(4*MiB)) {
		t.Fatalf("%d data objects after writing 64 MiB, want 16", objects)
	}
	// The PV ceph-csi provisioned for it.
	attrs := map[string]string{"clusterID": "test", "pool": cl.Pool, "imageName": image, "imageFeatures": "layering", "journalPool": cl.Pool}
	id, err := s.StaticImage("0001-0004-test-0000000000000001-6b9ffd6d-4f49-4ea2-9e5b-2bb2e3f9fb4a", attrs)
	if err != nil {
		t.Fatal(err)
	}
	spec := backend.AdoptSpec{ImageID: id, Name: "pvc-4711", AccessType: backend.AccessMount, FsType: "ext4",
		Parameters: map[string]string{"clusterID": "test", "pool": cl.Pool, "imageFeatures": "layering"}, DryRun: true}

	// While ceph-csi has it mapped (a watch, as its node's mapping holds
	// one) the dry run says who has it open, and the adoption is refused.
	// rbd watch holds its watch until a line (or EOF) on its stdin.
	watch := exec.Command("rbd", "watch", cl.Pool+"/"+image, "-c", cl.Conf)
	watch.Env = append(os.Environ(), "LC_ALL=C")
	var watchErr bytes.Buffer
	watch.Stderr = &watchErr
	stdin, err := watch.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	var stopWatch sync.Once
	unwatch := func() { stopWatch.Do(func() { _ = stdin.Close(); _ = watch.Process.Kill(); _ = watch.Wait() }) }
	t.Cleanup(unwatch)
	var openDry *backend.Adopted
	for range 100 {
		if openDry, err = s.Adopt(ctx, spec); err != nil || len(openDry.OpenBy) > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond) // until rbd watch has opened it
	}
	if err != nil || len(openDry.OpenBy) != 1 {
		unwatch() // its stderr is complete once it has ended
		t.Fatalf("dry run while rbd watch has the image open = %+v, %v; want it open by one client (rbd watch: %v %s)", openDry, err, watch.ProcessState, watchErr.String())
	}
	adoption := spec
	adoption.DryRun = false
	_, err = s.Adopt(ctx, adoption)
	testutil.WantKind(t, err, errdefs.ErrPrecondition, "still open by ["+openDry.OpenBy[0]+"]")
	unwatch()
	if err := cl.AwaitNoWatchers(ctx, image, time.Minute); err != nil {
		t.Fatal(err)
	}

	dry, err := s.Adopt(ctx, spec)
	if err != nil {
		t.Fatalf("dry run: %v", err)
	}
	if dry.Image.Name != "pvc-4711" || dry.Image.CapacityBytes != 256*MiB || len(dry.OpenBy) != 0 {
		t.Fatalf("dry run answered %+v", dry)
	}
	if _, err := inst.Store.Get(ctx, id); errdefs.KindOf(err) != errdefs.ErrNotFound {
		t.Fatalf("after the dry run the image is a volume: %v", err)
	}

	// An adoption that stopped between its two writes (the name is
	// written, the volume record not) is finished by the next one.
	if _, err := cl.RBD(ctx, "image-meta", "set", cl.Pool+"/"+image, "spindle.name", "pvc-4711"); err != nil {
		t.Fatal(err)
	}
	spec.DryRun = false
	img, err := s.Adopt(ctx, spec)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	got, err := inst.Store.Get(ctx, id)
	if err != nil || got.Name != "pvc-4711" || got.AccessType != backend.AccessMount || got.FsType != "ext4" || got.CapacityBytes != 256*MiB || got.Formatted {
		t.Fatalf("the adopted volume reads back as %+v, %v", got, err)
	}
	if n := dataObjects(ctx, t, cl, image); n != objects {
		t.Fatalf("%d data objects after the adoption, %d before: data was copied or written", n, objects)
	}
	if after, err := cl.Checksum(ctx, image, written); err != nil || after != sum {
		t.Fatalf("data after the adoption: %s, %v; want %s", after, err, sum)
	}
	again, err := s.Adopt(ctx, spec)
	if err != nil || again.Image.ID != img.Image.ID {
		t.Fatalf("adopting again under the same name = %+v, %v; want the volume", again, err)
	}
	other := spec
	other.Name = "pvc-other"
	_, err = s.Adopt(ctx, other)
	testutil.WantKind(t, err, errdefs.ErrPrecondition, "pvc-4711")

	// Snapshots and restores work on it as on any volume.
	snap, err := inst.Snapshots.CreateSnapshot(ctx, backend.SnapshotSpec{Name: "snap-adopted", SourceImageID: id})
	if err != nil || !snap.ReadyToUse {
		t.Fatalf("snapshot of the adopted volume = %+v, %v", snap, err)
	}
	restored := mustCreate(t, ctx, inst, backend.VolumeSpec{Name: "pvc-restored", CapacityBytes: 256 * MiB, AccessType: backend.AccessMount, FsType: "ext4",
		Source: &backend.ContentSource{SnapshotID: snap.ID}})
	if sumR, err := cl.Checksum(ctx, restored.ID[strings.LastIndex(restored.ID, "/")+1:], written); err != nil || sumR != sum {
		t.Fatalf("the restore of the adopted volume's snapshot holds %s, %v; want %s", sumR, err, sum)
	}
	t.Logf("while rbd watch had it open: the dry run answered open by %v, the adoption was refused", openDry.OpenBy)
	t.Logf("adopted %s (%d data objects, 64 MiB written) in place: objects and data unchanged; snapshot %s restored as %s with the same data", image, objects, snap.ID, restored.ID)

	// An image ceph-csi encrypted (its encryption state in image-meta, as
	// ceph-csi sets it) is refused, and gains no record of Spindle's.
	const encryptedImage = "csi-vol-0c1d5e55-77aa-4c4e-8f5a-0d3b1c9e2f10"
	if _, err := cl.RBD(ctx, "create", "--size", "64M", "--image-feature", "layering", cl.Pool+"/"+encryptedImage); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.RBD(ctx, "image-meta", "set", cl.Pool+"/"+encryptedImage, "rbd.csi.ceph.com/encrypted", "encrypted"); err != nil {
		t.Fatal(err)
	}
	encID, err := s.StaticImage("0001-0004-test-0000000000000001-0c1d5e55-77aa-4c4e-8f5a-0d3b1c9e2f10", map[string]string{"clusterID": "test", "pool": cl.Pool, "imageName": encryptedImage})
	if err != nil {
		t.Fatal(err)
	}
	encSpec := spec
	encSpec.ImageID, encSpec.Name = encID, "pvc-encrypted"
	_, err = s.Adopt(ctx, encSpec)
	testutil.WantKind(t, err, errdefs.ErrPrecondition, "ceph-csi encrypted this image", "rbd.csi.ceph.com/encrypted")
	meta, err := cl.RBD(ctx, "image-meta", "list", cl.Pool+"/"+encryptedImage, "--format", "json")
	if err != nil || strings.Contains(string(meta), "spindle.") {
		t.Fatalf("the refused image's metadata: %s, %v; want no record of Spindle's", meta, err)
	}
}

// SetEncryption (key rotation) rewrites an encrypted volume's record in
// place, on a volume created with the driver's encryption keys among its
// parameters (the store reads past them).
func TestSetEncryption(t *testing.T) {
	cl := rbdtest.Require(t)
	inst, _, ctx := controller(t, cl, rbd.Config{}, nil)
	enc := &backend.Encryption{KMSID: "secrets", KeyOwner: "volume/pvc-enc", WrappedKey: "wrapped-1"}
	img := mustCreate(t, ctx, inst, backend.VolumeSpec{Name: "pvc-enc", CapacityBytes: 64 * MiB, AccessType: backend.AccessBlock, Encryption: enc,
		Parameters: map[string]string{"pool": cl.Pool, "encrypted": "true", "encryptionKMSID": "secrets"}})
	keeper := inst.Store.(backend.EncryptionKeeper)
	next := enc.Clone()
	next.NextWrappedKey = "wrapped-2"
	if err := keeper.SetEncryption(ctx, img.ID, next); err != nil {
		t.Fatalf("SetEncryption: %v", err)
	}
	got, err := inst.Store.Get(ctx, img.ID)
	if err != nil || got.Encryption == nil || got.Encryption.WrappedKey != "wrapped-1" || got.Encryption.NextWrappedKey != "wrapped-2" || got.Name != "pvc-enc" || got.Parameters["encrypted"] != "true" {
		t.Fatalf("after SetEncryption: %+v (encryption %+v), %v", got, got.Encryption, err)
	}
	err = keeper.SetEncryption(ctx, cl.Pool+"/csi-vol-00000000000000000000000000000000", next)
	testutil.WantKind(t, err, errdefs.ErrNotFound, "does not exist")
}

// TestAdoptJournaledImage: an image of ceph-csi's with journaling (which
// krbd cannot map) is not adopted into a class of krbd, dry run or not,
// and nothing is written to it; into a class of rbd-nbd it is.
func TestAdoptJournaledImage(t *testing.T) {
	cl := rbdtest.Require(t)
	_, s, ctx := controller(t, cl, rbd.Config{}, nil)
	const image = "csi-vol-0d5c7a3e-journaled"
	if _, err := cl.RBD(ctx, "create", "--size", "64M", "--image-feature", "layering,exclusive-lock,journaling", cl.Pool+"/"+image); err != nil {
		t.Fatal(err)
	}
	info, err := cl.RBD(ctx, "info", "--format", "json", cl.Pool+"/"+image)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rbd info --format json: %s", info)
	id, err := s.StaticImage("0001-0004-test-0000000000000001-0d5c7a3e", map[string]string{"clusterID": "test", "pool": cl.Pool, "imageName": image})
	if err != nil {
		t.Fatal(err)
	}
	spec := backend.AdoptSpec{ImageID: id, Name: "pvc-journaled", AccessType: backend.AccessMount, FsType: "ext4",
		Parameters: map[string]string{"clusterID": "test", "pool": cl.Pool, "mounter": "krbd"}}
	var refused error
	for _, dryRun := range []bool{true, false} {
		spec.DryRun = dryRun
		_, refused = s.Adopt(ctx, spec)
		testutil.WantKind(t, refused, errdefs.ErrPrecondition, "journaling", "krbd")
	}
	if meta, err := cl.RBD(ctx, "image-meta", "list", "--format", "json", cl.Pool+"/"+image); err != nil || len(strings.TrimSpace(string(meta))) != 0 {
		t.Fatalf("the refused image has metadata %q, %v", meta, err)
	}
	spec.Parameters["mounter"] = "rbd-nbd"
	got, err := s.Adopt(ctx, spec)
	if err != nil || got.Image.Name != "pvc-journaled" {
		t.Fatalf("adopting it into a class of rbd-nbd = %+v, %v", got, err)
	}
	t.Logf("refused for krbd: %v", refused)
}
