package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// The node side's decisions, state by state, on an in-memory host: what a
// request leaves on the node (mounts, devices, records, the image's
// "formatted" flag) is what is checked.

func countCalls(calls []string, prefix string) int {
	n := 0
	for _, c := range calls {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

// A filesystem volume's whole life: formatted at the first stage only,
// mounted, published twice, unpublished, unstaged and staged again, with
// nothing left behind; and no request reads the whole mount table.
func TestFilesystemLifecycle(t *testing.T) {
	for _, fsType := range []string{"ext4", "xfs", "btrfs"} {
		t.Run(fsType, func(t *testing.T) {
			w := newWorld(t)
			ctx := context.Background()
			tv := w.newVolume("pvc-life-"+fsType, backend.AccessMount, backend.SingleNodeWriter, false)
			req := w.stageReq(tv)
			req.FsType = fsType
			for i := 0; i < 2; i++ { // the second is a retry
				if err := w.v.Stage(ctx, req); err != nil {
					t.Fatalf("Stage #%d: %v", i+1, err)
				}
			}
			info, _ := w.host.Stat(tv.staging)
			if !info.MountRoot || info.FsType != fsType {
				t.Fatalf("staging path after Stage: %+v, want a %s mount", info, fsType)
			}
			if got := countCalls(w.loops.Calls, "attach"); got != 1 {
				t.Errorf("%d attaches for two stages, want 1", got)
			}
			img, err := w.pool.Get(ctx, tv.Image)
			if err != nil || !img.Formatted || img.FsType != fsType {
				t.Fatalf("image after the first stage: %+v, %v; want formatted %s", img, err, fsType)
			}
			rec, err := readStageRecord(w.host, tv.staging)
			if err != nil || rec.VolumeID != tv.ID || rec.Device != "/dev/loop0" || rec.FsType != fsType || rec.Publishes == nil {
				t.Fatalf("stage record %+v, %v", rec, err)
			}

			second := tv.target + "-2"
			w.mustPublish(tv, tv.target, false)
			w.mustPublish(tv, tv.target, false) // a retry
			w.mustPublish(tv, second, true)
			for _, target := range []string{tv.target, second} {
				ti, _ := w.host.Stat(target)
				if !ti.MountRoot || ti.Dev != info.Dev || ti.Ino != info.Ino {
					t.Fatalf("%s is %+v, want a bind of the staging mount %+v", target, ti, info)
				}
				if ti.ReadOnly != (target == second) {
					t.Errorf("%s read-only %t", target, ti.ReadOnly)
				}
			}
			err = w.v.Unstage(ctx, tv.Volume, tv.staging)
			wantKind(t, err, errPrecondition, "still published at")
			for _, target := range []string{tv.target, second} {
				if err := w.v.Unpublish(ctx, tv.Volume, target); err != nil {
					t.Fatalf("Unpublish %s: %v", target, err)
				}
				if w.host.Exists(target) {
					t.Errorf("%s left behind", target)
				}
			}
			if err := w.v.Unstage(ctx, tv.Volume, tv.staging); err != nil {
				t.Fatal(err)
			}
			if s := w.state(); len(s.mounts)+len(s.devices)+len(s.records) != 0 {
				t.Fatalf("left behind: %+v", s)
			}

			// Staged again, on another device: mounted, never formatted again.
			if err := w.v.Stage(ctx, req); err != nil {
				t.Fatal(err)
			}
			if got := countCalls(w.host.Calls, "mkfs"); got != 1 {
				t.Errorf("mkfs ran %d times, want once", got)
			}
			if err := w.v.Unstage(ctx, tv.Volume, tv.staging); err != nil {
				t.Fatal(err)
			}
			if got := countCalls(w.host.Calls, "mounts"); got != 0 {
				t.Errorf("the requests read the whole mount table %d times, want never: %q", got, w.host.Calls)
			}
		})
	}
}

// A block volume: the stage attaches and records only; a publish binds the
// device; a read-only publish gets a read-only device of its own, released
// with its last publish.
func TestBlockLifecycle(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	tv := w.newVolume("pvc-block", backend.AccessBlock, backend.SingleNodeWriter, false)
	w.mustStage(tv)
	if info, _ := w.host.Stat(tv.staging); info.Exists {
		t.Fatalf("a block stage made something at the staging path: %+v", info)
	}
	w.mustPublish(tv, tv.target, false)
	roTarget := tv.target + "-ro"
	w.mustPublish(tv, roTarget, true)
	w.mustPublish(tv, roTarget, true) // a retry: no second view
	rw, _ := w.host.Stat(tv.target)
	ro, _ := w.host.Stat(roTarget)
	if !rw.IsBlockDevice() || rw.Rdev != (DevNum{7, 0}) {
		t.Fatalf("read-write target %+v, want /dev/loop0 bound", rw)
	}
	if !ro.IsBlockDevice() || ro.Rdev != (DevNum{7, 1}) || !w.loops.Devices["/dev/loop1"].ReadOnly {
		t.Fatalf("read-only target %+v, want a read-only /dev/loop1 of its own", ro)
	}
	err := w.v.Publish(ctx, w.publishReq(tv, roTarget, false))
	wantKind(t, err, errdefs.ErrAlreadyExists, "read-only=true")

	if err := w.v.Unpublish(ctx, tv.Volume, roTarget); err != nil {
		t.Fatal(err)
	}
	if _, ok := w.loops.Devices["/dev/loop1"]; ok {
		t.Error("the read-only view outlived its last publish")
	}
	if _, ok := w.loops.Devices["/dev/loop0"]; !ok {
		t.Fatal("unpublishing the read-only view took the staged device")
	}
	wantKind(t, w.v.Unstage(ctx, tv.Volume, tv.staging), errPrecondition, "still published at "+tv.target)
	if err := w.v.Unpublish(ctx, tv.Volume, tv.target); err != nil {
		t.Fatal(err)
	}
	if err := w.v.Unstage(ctx, tv.Volume, tv.staging); err != nil {
		t.Fatal(err)
	}
	if s := w.state(); len(s.mounts)+len(s.devices)+len(s.records) != 0 {
		t.Fatalf("left behind: %+v", s)
	}
}

func TestSingleWriterAllowsOnePublish(t *testing.T) {
	for _, access := range []backend.AccessType{backend.AccessMount, backend.AccessBlock} {
		t.Run(string(access), func(t *testing.T) {
			w := newWorld(t)
			tv := w.newVolume("pvc-snsw-"+string(access), access, backend.SingleNodeSingleWriter, false)
			w.mustStage(tv)
			req := w.publishReq(tv, tv.target, false)
			req.Mode = backend.SingleNodeSingleWriter
			if err := w.v.Publish(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			before := w.state()
			req.TargetPath = tv.target + "-2"
			wantKind(t, w.v.Publish(context.Background(), req), errPrecondition, "already published at "+tv.target, "SINGLE_NODE_SINGLE_WRITER")
			if after := w.state(); !after.equal(before) {
				t.Fatalf("a refused publish changed the node:\n%+v\n%+v", before, after)
			}
			// Once the first is gone, the second may come.
			if err := w.v.Unpublish(context.Background(), tv.Volume, tv.target); err != nil {
				t.Fatal(err)
			}
			if err := w.v.Publish(context.Background(), req); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Every request acts only on the volume it names. With volumes A and B
// staged and published, a request naming one volume and a path of the
// other (or of nothing it owns) is refused naming whose the path is, and
// changes nothing.
func TestRequestsActOnlyOnTheVolumeTheyName(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	a := w.newVolume("pvc-a", backend.AccessMount, backend.SingleNodeWriter, false)
	b := w.newVolume("pvc-b", backend.AccessMount, backend.SingleNodeWriter, false)
	blk := w.newVolume("pvc-c", backend.AccessBlock, backend.SingleNodeWriter, false)
	for _, tv := range []*testVolume{a, b, blk} {
		w.mustStage(tv)
		w.mustPublish(tv, tv.target, false)
	}
	missing := Volume{ID: "loop/default/pvc-missing", Image: "pvc-missing", Attacher: w.inst.Attacher}
	freeTarget := filepath.Join(w.kubelet, "pods/free/volumes/kubernetes.io~csi/x/mount")

	tests := []struct {
		name string
		call func() error
		kind error
		want []string
	}{
		{"unpublish B at A's target", func() error { return w.v.Unpublish(ctx, b.Volume, a.target) }, errPrecondition, []string{a.target, "volume " + a.ID, "not volume " + b.ID}},
		{"unpublish a missing volume at A's target", func() error { return w.v.Unpublish(ctx, missing, a.target) }, errPrecondition, []string{"volume " + a.ID}},
		{"unpublish A at A's staging path", func() error { return w.v.Unpublish(ctx, a.Volume, a.staging) }, errPrecondition, []string{"staging path of volume " + a.ID}},
		{"unpublish B at the block volume's target", func() error { return w.v.Unpublish(ctx, b.Volume, blk.target) }, errPrecondition, []string{"device /dev/loop2", "volume " + blk.ID}},
		{"unpublish B at the block volume's staging path", func() error { return w.v.Unpublish(ctx, b.Volume, blk.staging) }, errPrecondition, []string{"staging path of volume " + blk.ID}},
		{"unstage a missing volume at A's staging path", func() error { return w.v.Unstage(ctx, missing, a.staging) }, errPrecondition, []string{a.staging, "volume " + a.ID}},
		{"unstage B at A's staging path", func() error { return w.v.Unstage(ctx, b.Volume, a.staging) }, errPrecondition, []string{"volume " + a.ID, "not volume " + b.ID}},
		{"unstage B at the block volume's staging path", func() error { return w.v.Unstage(ctx, b.Volume, blk.staging) }, errPrecondition, []string{"volume " + blk.ID}},
		{"unstage B at A's target", func() error { return w.v.Unstage(ctx, b.Volume, a.target) }, errPrecondition, []string{"volume " + a.ID}},
		{"unstage A at A's target", func() error { return w.v.Unstage(ctx, a.Volume, a.target) }, errPrecondition, []string{"still published at " + a.staging}},
		{"unstage A where nothing is", func() error { return w.v.Unstage(ctx, a.Volume, filepath.Join(w.kubelet, "plugins/other/globalmount")) }, errPrecondition, []string{"not staged at", "mounted at " + a.staging}},
		{"stage B at A's staging path", func() error {
			return w.v.Stage(ctx, w.stageReq(&testVolume{Volume: b.Volume, pc: b.pc, access: b.access, staging: a.staging}))
		}, errPrecondition, []string{"volume " + a.ID}},
		{"stage A at a second path", func() error {
			return w.v.Stage(ctx, w.stageReq(&testVolume{Volume: a.Volume, pc: a.pc, access: a.access, staging: b.staging + "-other"}))
		}, errPrecondition, []string{"already staged on this node at " + a.staging}},
		{"publish B from A's staging path", func() error {
			return w.v.Publish(ctx, PublishRequest{Volume: b.Volume, StagingPath: a.staging, TargetPath: freeTarget, Access: backend.AccessMount, Mode: backend.SingleNodeWriter})
		}, errPrecondition, []string{"not staged at " + a.staging, "volume " + a.ID}},
		{"publish A onto B's target", func() error { return w.v.Publish(ctx, w.publishReq(a, b.target, false)) }, errPrecondition, []string{b.target, "volume " + b.ID}},
		{"publish A onto B's staging path", func() error { return w.v.Publish(ctx, w.publishReq(a, b.staging, false)) }, errPrecondition, []string{"staging path of volume " + b.ID}},
		{"publish A onto its own staging path", func() error { return w.v.Publish(ctx, w.publishReq(a, a.staging, false)) }, errPrecondition, []string{"staging path of volume " + a.ID}},
		{"stats of B at A's target", func() error { _, err := w.v.Stats(ctx, b.Volume, a.target); return err }, errNotFound, []string{"not a mount of volume " + b.ID}},
		{"expand B at A's target", func() error { _, err := w.v.Expand(ctx, b.Volume, a.target, "", 0); return err }, errNotFound, []string{"not a mount of volume " + b.ID}},
		{"stats of a missing volume at the block target", func() error { _, err := w.v.Stats(ctx, missing, blk.target); return err }, errNotFound, []string{"volume " + blk.ID}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := w.state()
			wantKind(t, tc.call(), tc.kind, tc.want...)
			if after := w.state(); !after.equal(before) {
				t.Fatalf("a refused request changed the node:\nbefore %+v\nafter  %+v", before, after)
			}
		})
	}
	// Nothing of any volume at a path: fine, and still nothing changes.
	before := w.state()
	if err := w.v.Unpublish(ctx, missing, freeTarget); err != nil {
		t.Fatal(err)
	}
	if err := w.v.Unstage(ctx, missing, filepath.Join(w.kubelet, "plugins/nothing/globalmount")); err != nil {
		t.Fatal(err)
	}
	if after := w.state(); !after.equal(before) {
		t.Fatalf("requests for a missing volume changed the node:\n%+v\n%+v", before, after)
	}
}

// A stage that fails after the attach undoes it: no mount, no device, no
// record; a device attached before the stage stays.
func TestStageRollsBack(t *testing.T) {
	tests := []struct {
		name string
		fail string // a FakeHost.Fail key; DEV and STAGING are replaced
	}{
		{"blkid fails", "probe DEV"},
		{"mkfs fails", "mkfs ext4 DEV"},
		{"mount fails", "mount DEV STAGING"},
		{"the record cannot be written", "write STAGING" + stageRecordSuffix},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			tv := w.newVolume("pvc-rollback", backend.AccessMount, backend.SingleNodeWriter, false)
			key := strings.NewReplacer("DEV", "/dev/loop0", "STAGING", tv.staging).Replace(tc.fail)
			w.host.Fail[key] = errors.New("injected failure")
			err := w.v.Stage(context.Background(), w.stageReq(tv))
			if err == nil || !strings.Contains(err.Error(), "injected failure") {
				t.Fatalf("Stage = %v, want the injected failure", err)
			}
			if s := w.state(); len(s.mounts)+len(s.devices)+len(s.records) != 0 {
				t.Fatalf("a failed stage left %+v", s)
			}
			// The retry, with the failure gone, stages.
			delete(w.host.Fail, key)
			w.mustStage(tv)
		})
	}
	t.Run("a device attached before stays", func(t *testing.T) {
		w := newWorld(t)
		tv := w.newVolume("pvc-keep", backend.AccessBlock, backend.SingleNodeWriter, false)
		w.mustStage(tv)
		other := *tv
		other.staging = tv.staging + "-other"
		w.host.Fail["write "+other.staging+stageRecordSuffix] = errors.New("injected failure")
		if err := w.v.Stage(context.Background(), w.stageReq(&other)); err == nil {
			t.Fatal("Stage succeeded without its record")
		}
		if _, ok := w.loops.Devices["/dev/loop0"]; !ok || countCalls(w.loops.Calls, "detach") != 0 {
			t.Fatalf("the failed stage took away the device staged before: %v", w.loops.Calls)
		}
	})
	t.Run("a block volume asked for as a filesystem", func(t *testing.T) {
		w := newWorld(t)
		tv := w.newVolume("pvc-raw", backend.AccessBlock, backend.SingleNodeWriter, false)
		req := w.stageReq(tv)
		req.Access = backend.AccessMount
		wantKind(t, w.v.Stage(context.Background(), req), errdefs.ErrInvalidArgument, "created for block access, not mount")
		if s := w.state(); len(s.mounts)+len(s.devices)+len(s.records) != 0 || countCalls(w.host.Calls, "mkfs") != 0 {
			t.Fatalf("left %+v after %q", s, w.host.Calls)
		}
	})
}

// The format-once rules at stage: a device holding another filesystem or a
// partition table is refused untouched, and an image the store calls
// formatted is never formatted again, even when blkid finds nothing.
func TestStageNeverFormatsWhatHoldsData(t *testing.T) {
	tests := []struct {
		name      string
		existing  string // what is on the image before the stage
		formatted bool   // the store's record
		want      []string
	}{
		{"another filesystem", "xfs", false, []string{"holds an xfs filesystem, not ext4"}},
		{"a partition table", "gpt", false, []string{"a gpt partition table"}},
		{"LUKS", "crypto_LUKS", false, []string{"crypto_LUKS"}},
		{"formatted before, blank now", "", true, []string{"formatted before", "refusing to format it again"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			tv := w.newVolume("pvc-data", backend.AccessMount, backend.SingleNodeWriter, false)
			w.host.SetFilesystem(w.pool.ImagePath(tv.Image), tc.existing, 64*mib)
			if tc.formatted {
				if err := w.pool.RecordFormatted(context.Background(), tv.Image, "ext4"); err != nil {
					t.Fatal(err)
				}
			}
			wantKind(t, w.v.Stage(context.Background(), w.stageReq(tv)), errPrecondition, tc.want...)
			if countCalls(w.host.Calls, "mkfs") != 0 || w.host.FilesystemOf(w.pool.ImagePath(tv.Image)) != tc.existing {
				t.Fatalf("the image was formatted: %q", w.host.Calls)
			}
			if s := w.state(); len(s.mounts)+len(s.devices)+len(s.records) != 0 {
				t.Fatalf("a refused stage left %+v", s)
			}
		})
	}
}

// A dead mount (the filesystem stopped answering) at a path of the volume
// is cleaned up and redone; one of another volume is refused.
func TestDeadMounts(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	a := w.newVolume("pvc-a", backend.AccessMount, backend.SingleNodeWriter, false)
	b := w.newVolume("pvc-b", backend.AccessMount, backend.SingleNodeWriter, false)
	w.mustStage(a)
	w.mustStage(b)
	w.mustPublish(a, a.target, false)

	w.host.KillMount(a.target)
	wantKind(t, w.v.Unpublish(ctx, b.Volume, a.target), errPrecondition, "volume "+a.ID)
	w.mustPublish(a, a.target, false) // the dead bind is replaced
	if info, _ := w.host.Stat(a.target); info.Dead || !info.MountRoot {
		t.Fatalf("target after a publish over a dead bind: %+v", info)
	}

	w.host.KillMount(b.staging)
	wantKind(t, w.v.Stage(ctx, w.stageReq(&testVolume{Volume: a.Volume, pc: a.pc, access: a.access, staging: b.staging})), errPrecondition, "volume "+b.ID)
	w.mustStage(b) // its own dead staging mount is redone
	if info, _ := w.host.Stat(b.staging); info.Dead || !info.MountRoot {
		t.Fatalf("staging path after a restage over a dead mount: %+v", info)
	}

	// A dead staging mount is unstaged: unmounted, the device detached,
	// the record gone.
	if err := w.v.Unpublish(ctx, a.Volume, a.target); err != nil {
		t.Fatal(err)
	}
	w.host.KillMount(a.staging)
	if err := w.v.Unstage(ctx, a.Volume, a.staging); err != nil {
		t.Fatal(err)
	}
	if info, _ := w.host.Stat(a.staging); info.MountRoot || info.Dead || w.host.Exists(StageRecordPath(a.staging)) {
		t.Fatalf("after unstaging a dead mount: %+v", info)
	}
	if _, ok := w.loops.Devices["/dev/loop0"]; ok {
		t.Fatal("the device of the dead mount is still attached")
	}
}

// A stage record written by a driver that did not list publishes: unstage
// reads the mount table to find them.
func TestUnstageWithARecordWithoutPublishes(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	tv := w.newVolume("pvc-old", backend.AccessMount, backend.SingleNodeWriter, false)
	w.mustStage(tv)
	w.mustPublish(tv, tv.target, false)
	rec, err := readStageRecord(w.host, tv.staging)
	if err != nil {
		t.Fatal(err)
	}
	rec.Publishes = nil
	if err := writeStageRecord(w.host, tv.staging, *rec); err != nil {
		t.Fatal(err)
	}
	wantKind(t, w.v.Unstage(ctx, tv.Volume, tv.staging), errPrecondition, "still published at "+tv.target)
	if err := w.v.Unpublish(ctx, tv.Volume, tv.target); err != nil {
		t.Fatal(err)
	}
	if err := w.v.Unstage(ctx, tv.Volume, tv.staging); err != nil {
		t.Fatal(err)
	}
	if countCalls(w.host.Calls, "mounts") == 0 {
		t.Error("the publishes of an old record were not looked for in the mount table")
	}
}

func TestExpandAndStats(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	fsVol := w.newVolume("pvc-grow", backend.AccessMount, backend.SingleNodeWriter, false)
	req := w.stageReq(fsVol)
	req.FsType = "xfs"
	if err := w.v.Stage(ctx, req); err != nil {
		t.Fatal(err)
	}
	w.mustPublish(fsVol, fsVol.target, true)
	blk := w.newVolume("pvc-grow-block", backend.AccessBlock, backend.SingleNodeWriter, false)
	w.mustStage(blk)
	w.mustPublish(blk, blk.target, false)

	for _, tv := range []*testVolume{fsVol, blk} {
		if _, err := w.pool.Expand(ctx, tv.Image, 128*mib); err != nil {
			t.Fatal(err)
		}
	}
	// Through the pod's read-only bind: the filesystem grows through the
	// read-write staging mount.
	size, err := w.v.Expand(ctx, fsVol.Volume, fsVol.target, fsVol.staging, 100*mib)
	if err != nil || size != 128*mib {
		t.Fatalf("Expand = %d, %v; want %d", size, err, 128*mib)
	}
	st, err := w.v.Stats(ctx, fsVol.Volume, fsVol.target)
	if err != nil || st.Block || st.TotalBytes != 128*mib {
		t.Fatalf("Stats after growth = %+v, %v", st, err)
	}
	_, err = w.v.Expand(ctx, fsVol.Volume, fsVol.staging, "", 256*mib)
	wantKind(t, err, errdefs.ErrOutOfRange, "less than the 268435456 bytes asked for")

	if size, err := w.v.Expand(ctx, blk.Volume, blk.target, "", 0); err != nil || size != 128*mib {
		t.Fatalf("Expand of the block volume = %d, %v", size, err)
	}
	if st, err := w.v.Stats(ctx, blk.Volume, blk.target); err != nil || !st.Block || st.SizeBytes != 128*mib {
		t.Fatalf("Stats of the block volume = %+v, %v", st, err)
	}
	// The staging path of a block volume is no device: not found.
	_, err = w.v.Stats(ctx, blk.Volume, blk.staging)
	wantKind(t, err, errNotFound, "does not exist")
	_, err = w.v.Stats(ctx, fsVol.Volume, filepath.Join(w.kubelet, "nothing"))
	wantKind(t, err, errNotFound, "does not exist")
}

// The paths a request names are confined to the node plugin's roots; what
// is at a path and not the driver's is refused untouched.
func TestPathsThatHoldSomething(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	tv := w.newVolume("pvc-paths", backend.AccessMount, backend.SingleNodeWriter, false)
	w.host.WriteEntry(filepath.Join(tv.staging, "precious"), 0, []byte("data"))
	wantKind(t, w.v.Stage(ctx, w.stageReq(tv)), errPrecondition, "not empty")
	if len(w.loops.Devices) != 0 {
		t.Fatal("a refused stage attached the device")
	}
	other := w.newVolume("pvc-paths-2", backend.AccessMount, backend.SingleNodeWriter, false)
	w.mustStage(other)
	w.host.WriteEntry(other.target, 0, []byte("a file with data"))
	wantKind(t, w.v.Publish(ctx, w.publishReq(other, other.target, false)), errPrecondition, "not a directory")
	wantKind(t, w.v.Unpublish(ctx, other.Volume, other.target), errPrecondition, "regular file holding 16 bytes")
	if data, err := w.host.ReadFile(other.target); err != nil || string(data) != "a file with data" {
		t.Fatalf("the file at the target changed: %q, %v", data, err)
	}
	if _, err := w.v.Confine("target_path", "/etc/passwd"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Confine(/etc/passwd) = %v, want an invalid argument", err)
	}
}

func TestInventoryAndBoot(t *testing.T) {
	w := newWorld(t)
	tv := w.newVolume("pvc-inv", backend.AccessMount, backend.SingleNodeWriter, false)
	w.mustStage(tv)
	w.mustPublish(tv, tv.target, false)
	staged, errs := w.v.Staged(context.Background(), func(string) (Volume, error) { return tv.Volume, nil })
	if len(errs) != 0 || len(staged) != 1 {
		t.Fatalf("Staged = %+v, %v", staged, errs)
	}
	got := staged[0]
	if got.VolumeID != tv.ID || got.MountState != MountStateMounted || got.DeviceState != "attached" || !slices.Equal(got.Publishes, []string{tv.target}) {
		t.Fatalf("inventory entry %+v", got)
	}
	ids, err := w.v.StagedVolumeIDs()
	if err != nil || !slices.Equal(ids, []string{tv.ID}) {
		t.Fatalf("StagedVolumeIDs = %v, %v", ids, err)
	}
	_ = os.ErrNotExist
}

// A node plugin killed during mkfs leaves the mkfs running, holding the
// volume's device open. The retried stage (and an unstage meanwhile) says
// what is true: the device is held open by a process, named where /proc
// shows it, not mounted anywhere; ABORTED, so it is retried, and nothing
// changes. Once the mkfs has exited, the stage succeeds and mounts what it
// made without formatting again.
func TestStageWhileAnOrphanedMkfsHoldsTheDevice(t *testing.T) {
	tests := []struct {
		name    string
		pid     int // 0: a holder /proc does not show
		command string
		want    []string
	}{
		{"the process is in sight", 4242, "mkfs.ext4", []string{"held open by another process, pid 4242 (mkfs.ext4), and mounted nowhere", "a retry succeeds once it exits"}},
		{"no process in sight", 0, "", []string{"mounted nowhere here, and no process this node plugin can see holds it open", "a retry succeeds once it is let go"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			ctx := context.Background()
			tv := w.newVolume("pvc-orphan", backend.AccessMount, backend.SingleNodeWriter, false)
			// The first stage attached the device, ran mkfs and was killed.
			dev, err := tv.Attacher.Attach(ctx, backend.AttachRequest{ImageID: tv.Image, NodeID: worldNode, PublishContext: tv.pc})
			if err != nil {
				t.Fatal(err)
			}
			w.host.HoldOpen(dev.Path, tc.pid, tc.command)
			before := w.state()
			for _, call := range []struct {
				name string
				err  error
			}{
				{"stage", w.v.Stage(ctx, w.stageReq(tv))},
				{"unstage elsewhere", w.v.Unstage(ctx, tv.Volume, filepath.Join(w.kubelet, "plugins/other/globalmount"))},
			} {
				wantKind(t, call.err, errdefs.ErrBusy, append([]string{"volume " + tv.ID, "its device " + dev.Path}, tc.want...)...)
				if errors.Is(call.err, errdefs.ErrPrecondition) || strings.Contains(call.err.Error(), "mounted there") {
					t.Fatalf("%s: %v; the device is mounted nowhere", call.name, call.err)
				}
				if after := w.state(); !after.equal(before) {
					t.Fatalf("%s while the device is held changed the node:\nbefore %+v\nafter  %+v", call.name, before, after)
				}
			}
			if n := countCalls(w.host.Calls, "mkfs"); n != 0 {
				t.Fatalf("mkfs ran %d times while another mkfs held the device", n)
			}
			// The orphan finishes its filesystem and exits.
			w.host.SetFilesystem(w.pool.ImagePath(tv.Image), "ext4", 64*mib)
			w.host.ReleaseOpen(dev.Path)
			w.mustStage(tv)
			if info, err := w.host.Stat(tv.staging); err != nil || !info.MountRoot || info.FsType != "ext4" {
				t.Fatalf("after the retry the staging path holds %+v, %v; want the ext4 mount", info, err)
			}
			if n := countCalls(w.host.Calls, "mkfs"); n != 0 {
				t.Fatalf("the retry formatted the volume again (%d mkfs)", n)
			}
		})
	}
}
