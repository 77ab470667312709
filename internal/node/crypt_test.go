package node

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// The node side of encrypted volumes on the in-memory host: the LUKS
// header made once on a blank device only, the filesystem on the dm-crypt
// mapping, every path seen through the mapping, nothing left behind.

var testPassphrase = []byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")

// encrypted is an Encryption whose KMS hands out key, counting the calls.
func encrypted(key []byte, calls *int) *Encryption {
	return &Encryption{KMS: "kms test", Passphrase: func(context.Context) ([]byte, error) {
		if calls != nil {
			*calls++
		}
		return bytes.Clone(key), nil
	}}
}

func (w *world) encryptedStageReq(tv *testVolume, fsType string) StageRequest {
	r := w.stageReq(tv)
	r.FsType = fsType
	r.Encryption = encrypted(testPassphrase, nil)
	return r
}

// identityOf is the data behind the volume's loop device (its image file).
func (w *world) identityOf(dev string) string {
	w.t.Helper()
	d, err := w.loops.Get(context.Background(), dev)
	if err != nil {
		w.t.Fatal(err)
	}
	return d.BackingFile
}

func TestEncryptedLifecycle(t *testing.T) {
	for _, tc := range []struct {
		name   string
		access backend.AccessType
		fsType string
	}{
		{"ext4", backend.AccessMount, "ext4"},
		{"xfs", backend.AccessMount, "xfs"},
		{"block", backend.AccessBlock, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			ctx := context.Background()
			tv := w.newVolume("pvc-luks-"+tc.name, tc.access, backend.SingleNodeWriter, false)
			req := w.encryptedStageReq(tv, tc.fsType)
			for i := 0; i < 2; i++ { // the second is a retry
				if err := w.v.Stage(ctx, req); err != nil {
					t.Fatalf("Stage #%d: %v", i+1, err)
				}
			}
			name := CryptName(tv.ID)
			mapper := MapperPath(name)
			if got := countCalls(w.host.Calls, "luksFormat"); got != 1 {
				t.Errorf("%d luksFormat, want 1", got)
			}
			if got := countCalls(w.host.Calls, "luksOpen /dev/loop0 "+name); got != 1 {
				t.Errorf("%d luksOpen, want 1 (calls %v)", got, w.host.Calls)
			}
			raw := w.identityOf("/dev/loop0")
			if got := w.host.FilesystemOf(raw); got != "crypto_LUKS" {
				t.Fatalf("the raw device holds %q, want a LUKS header", got)
			}
			if keys := w.host.LUKSKeyslots(raw); len(keys) != 1 || !bytes.Equal(keys[0], testPassphrase) {
				t.Fatalf("keyslots %q, want the volume's passphrase only", keys)
			}
			rec, err := readStageRecord(w.host, tv.staging)
			if err != nil || rec.Device != "/dev/loop0" || rec.CryptName != name || rec.Mapper != mapper {
				t.Fatalf("stage record %+v, %v", rec, err)
			}
			if tc.access == backend.AccessMount {
				if got := w.host.FilesystemOf(cryptIdentity(raw)); got != tc.fsType {
					t.Fatalf("the mapping holds %q, want %s", got, tc.fsType)
				}
				if countCalls(w.host.Calls, "mkfs "+tc.fsType+" "+mapper) != 1 || countCalls(w.host.Calls, "mkfs "+tc.fsType+" /dev/loop") != 0 {
					t.Fatalf("mkfs ran on the wrong device: %v", w.host.Calls)
				}
				if img, _ := w.pool.Get(ctx, tv.Image); !img.Formatted {
					t.Error("the image is not recorded formatted")
				}
			}
			p, err := w.v.Locate(ctx, tv.Volume, tv.staging)
			if err != nil || !p.Mine || p.Device != "/dev/loop0" || p.Crypt == nil || p.Crypt.Path != mapper {
				t.Fatalf("Locate(staging) = %+v, %v; want the volume's, through %s", p, err, mapper)
			}

			w.mustPublish(tv, tv.target, false)
			tp, err := w.v.Locate(ctx, tv.Volume, tv.target)
			if err != nil || !tp.Mine || tp.TopDevice() != mapper {
				t.Fatalf("Locate(target) = %+v, %v", tp, err)
			}
			st, err := w.v.Stats(ctx, tv.Volume, tv.target)
			wantSize := int64(64*mib - luksDataOffset)
			if err != nil || (st.Block && st.SizeBytes != wantSize) || (!st.Block && st.TotalBytes != wantSize) {
				t.Fatalf("Stats = %+v, %v; want %d bytes (the device less the LUKS header)", st, err, wantSize)
			}
			if err := w.v.Unstage(ctx, tv.Volume, tv.staging); !errors.Is(err, errdefs.ErrPrecondition) {
				t.Fatalf("Unstage while published: %v", err)
			}
			if err := w.v.Unpublish(ctx, tv.Volume, tv.target); err != nil {
				t.Fatal(err)
			}
			if err := w.v.Unstage(ctx, tv.Volume, tv.staging); err != nil {
				t.Fatal(err)
			}
			if m := w.host.CryptMappings(); len(m) != 0 || len(w.host.MountTable()) != 0 || len(w.loops.Devices) != 0 {
				t.Fatalf("after Unstage: mappings %v, mounts %v, devices %v", m, w.host.MountTable(), w.loops.Devices)
			}
			// Staged again: opened, never formatted again.
			w.host.Calls = nil
			if err := w.v.Stage(ctx, req); err != nil {
				t.Fatal(err)
			}
			if countCalls(w.host.Calls, "luksFormat") != 0 || countCalls(w.host.Calls, "mkfs") != 0 || countCalls(w.host.Calls, "luksOpen") != 1 {
				t.Fatalf("second stage: %v; want one luksOpen and no format", w.host.Calls)
			}
		})
	}
}

// A device that holds anything but a LUKS header the volume's key opens is
// refused untouched, and the stage leaves nothing behind.
func TestEncryptedStageRefuses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepare func(w *world, identity string)
		want    []string
	}{
		{"plain filesystem", func(w *world, id string) { w.host.SetFilesystem(id, "ext4", 64*mib) },
			[]string{"holds an ext4 filesystem, not a LUKS header", "untouched"}},
		{"partition table", func(w *world, id string) { w.host.SetFilesystem(id, "gpt", 64*mib) },
			[]string{"holds a gpt partition table, not a LUKS header"}},
		{"another key's header", func(w *world, id string) { w.host.PutLUKSHeader(id, []byte("another volume's key")) },
			[]string{"the volume's key does not open the LUKS header on /dev/loop", "No key available with this passphrase."}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			ctx := context.Background()
			tv := w.newVolume("pvc-refuse", backend.AccessMount, backend.SingleNodeWriter, false)
			// The image's data, as the loop device will show it.
			dev, err := w.inst.Attacher.Attach(ctx, backend.AttachRequest{ImageID: tv.Image, NodeID: worldNode, PublishContext: tv.pc})
			if err != nil {
				t.Fatal(err)
			}
			id := w.identityOf(dev.Path)
			if err := w.inst.Attacher.Detach(ctx, tv.Image, dev.Path); err != nil {
				t.Fatal(err)
			}
			tc.prepare(w, id)
			before := w.host.FilesystemOf(id)
			keys := w.host.LUKSKeyslots(id)
			w.host.Calls = nil
			err = w.v.Stage(ctx, w.encryptedStageReq(tv, "ext4"))
			wantKind(t, err, errPrecondition, tc.want...)
			if countCalls(w.host.Calls, "luksFormat") != 0 || countCalls(w.host.Calls, "mkfs") != 0 {
				t.Fatalf("a refused stage formatted: %v", w.host.Calls)
			}
			if got := w.host.FilesystemOf(id); got != before {
				t.Fatalf("the device now holds %q, was %q", got, before)
			}
			if got := w.host.LUKSKeyslots(id); len(got) != len(keys) {
				t.Fatalf("keyslots changed: %q, were %q", got, keys)
			}
			if m := w.host.CryptMappings(); len(m) != 0 || len(w.loops.Devices) != 0 || w.host.Exists(StageRecordPath(tv.staging)) {
				t.Fatalf("left behind: mappings %v, devices %v, record %t", m, w.loops.Devices, w.host.Exists(StageRecordPath(tv.staging)))
			}
			if strings.Contains(err.Error(), string(testPassphrase)) {
				t.Fatalf("the error holds the passphrase: %v", err)
			}
		})
	}
}

// A node that cannot decrypt, or a KMS that does not answer, fails the
// stage before anything is attached: nothing formatted, nothing left.
func TestEncryptedStageWithoutKeyOrDMCrypt(t *testing.T) {
	kmsDown := errdefs.Unavailable("kms vault-a (Vault transit at http://127.0.0.1:1): connection refused")
	for _, tc := range []struct {
		name      string
		noDMCrypt bool
		kmsErr    error
		kind      error
		want      []string
	}{
		{"no dm-crypt", true, nil, errdefs.ErrPrecondition, []string{"dm_crypt", "volume loop/default/"}},
		{"KMS unreachable", false, kmsDown, errdefs.ErrUnavailable, []string{"kms vault-a", "Vault transit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			ctx := context.Background()
			tv := w.newVolume("pvc-nokey", backend.AccessMount, backend.SingleNodeWriter, false)
			w.host.SetCryptUnavailable(tc.noDMCrypt)
			req := w.encryptedStageReq(tv, "ext4")
			if tc.kmsErr != nil {
				req.Encryption.Passphrase = func(context.Context) ([]byte, error) { return nil, tc.kmsErr }
			}
			err := w.v.Stage(ctx, req)
			wantKind(t, err, tc.kind, tc.want...)
			if countCalls(w.loops.Calls, "attach") != 0 || len(w.host.Calls) != 0 {
				t.Fatalf("a stage without its key touched the node: loops %v, host %v", w.loops.Calls, w.host.Calls)
			}
		})
	}
}

// Whatever fails after the mapping is opened closes it again.
func TestEncryptedStageRollsBack(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	tv := w.newVolume("pvc-rollback", backend.AccessMount, backend.SingleNodeWriter, false)
	mapper := MapperPath(CryptName(tv.ID))
	w.host.Fail["mkfs ext4 "+mapper] = errors.New("mkfs.ext4: no space left on device")
	err := w.v.Stage(ctx, w.encryptedStageReq(tv, "ext4"))
	if err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("Stage = %v", err)
	}
	if m := w.host.CryptMappings(); len(m) != 0 || len(w.loops.Devices) != 0 || len(w.host.MountTable()) != 0 {
		t.Fatalf("left behind: mappings %v, devices %v, mounts %v", m, w.loops.Devices, w.host.MountTable())
	}
	// The header made before mkfs failed stays, and is opened next time.
	delete(w.host.Fail, "mkfs ext4 "+mapper)
	w.host.Calls = nil
	if err := w.v.Stage(ctx, w.encryptedStageReq(tv, "ext4")); err != nil {
		t.Fatal(err)
	}
	if countCalls(w.host.Calls, "luksFormat") != 0 || countCalls(w.host.Calls, "mkfs ext4 "+mapper) != 1 {
		t.Fatalf("restage after a failed mkfs: %v", w.host.Calls)
	}
}

// After a plugin restart (a new Volumes over the same host) the open
// mapping is found: a retried stage changes nothing, a stage whose mount
// went away mounts the open mapping again without the KMS opening it, and
// unstage closes it.
func TestEncryptedRestageAfterRestart(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	tv := w.newVolume("pvc-restart", backend.AccessMount, backend.SingleNodeWriter, false)
	w.mustStageEncrypted(tv)
	restarted, err := New(w.host, w.v.opts)
	if err != nil {
		t.Fatal(err)
	}
	w.host.Calls = nil
	if err := restarted.Stage(ctx, w.encryptedStageReq(tv, "ext4")); err != nil {
		t.Fatal(err)
	}
	if len(w.host.Calls) != 0 {
		t.Fatalf("a retried stage did %v", w.host.Calls)
	}
	// The mount is gone, the mapping is not.
	if err := w.host.Unmount(ctx, tv.staging); err != nil {
		t.Fatal(err)
	}
	w.host.Calls = nil
	if err := restarted.Stage(ctx, w.encryptedStageReq(tv, "ext4")); err != nil {
		t.Fatal(err)
	}
	if countCalls(w.host.Calls, "luksOpen") != 0 || countCalls(w.host.Calls, "mount "+MapperPath(CryptName(tv.ID))) != 1 {
		t.Fatalf("restage of an open mapping: %v", w.host.Calls)
	}
	if err := restarted.Unstage(ctx, tv.Volume, tv.staging); err != nil {
		t.Fatal(err)
	}
	if m := w.host.CryptMappings(); len(m) != 0 || len(w.loops.Devices) != 0 {
		t.Fatalf("after unstage: mappings %v, devices %v", m, w.loops.Devices)
	}
}

func (w *world) mustStageEncrypted(tv *testVolume) {
	w.t.Helper()
	fsType := "ext4"
	if tv.access == backend.AccessBlock {
		fsType = ""
	}
	if err := w.v.Stage(context.Background(), w.encryptedStageReq(tv, fsType)); err != nil {
		w.t.Fatalf("Stage(%s): %v", tv.ID, err)
	}
}

// Expansion grows the image's device, then the mapping, then the
// filesystem on the mapping.
func TestEncryptedExpand(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	fsVol := w.newVolume("pvc-luks-grow", backend.AccessMount, backend.SingleNodeWriter, false)
	w.mustStageEncrypted(fsVol)
	w.mustPublish(fsVol, fsVol.target, false)
	blk := w.newVolume("pvc-luks-grow-block", backend.AccessBlock, backend.SingleNodeWriter, false)
	w.mustStageEncrypted(blk)
	w.mustPublish(blk, blk.target, false)
	for _, tv := range []*testVolume{fsVol, blk} {
		if _, err := w.pool.Expand(ctx, tv.Image, 128*mib); err != nil {
			t.Fatal(err)
		}
		w.host.Calls = nil
		size, err := w.v.Expand(ctx, tv.Volume, tv.target, tv.staging, 128*mib)
		if err != nil || size != 128*mib {
			t.Fatalf("Expand(%s) = %d, %v", tv.ID, size, err)
		}
		name := CryptName(tv.ID)
		if countCalls(w.host.Calls, "luksResize "+name) != 1 {
			t.Fatalf("Expand did %v; want the mapping resized", w.host.Calls)
		}
		st, err := w.v.Stats(ctx, tv.Volume, tv.target)
		want := int64(128*mib - luksDataOffset)
		if err != nil || max(st.SizeBytes, st.TotalBytes) != want {
			t.Fatalf("Stats after growth = %+v, %v; want %d", st, err, want)
		}
	}
}

// The mapping holds the volume's device: another volume's request sees
// whose it is through the mapping, and a second stage path is refused.
func TestEncryptedLocateAndOwnership(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	a := w.newVolume("pvc-luks-a", backend.AccessMount, backend.SingleNodeWriter, false)
	b := w.newVolume("pvc-luks-b", backend.AccessMount, backend.SingleNodeWriter, false)
	w.mustStageEncrypted(a)
	err := w.v.Unstage(ctx, b.Volume, a.staging)
	wantKind(t, err, errPrecondition, "dm-crypt mapping "+CryptName(a.ID), "of volume "+a.ID)
	// A second staging path of the same volume.
	other := a.staging + "-2"
	req := w.encryptedStageReq(a, "ext4")
	req.StagingPath = other
	err = w.v.Stage(ctx, req)
	wantKind(t, err, errPrecondition, "already staged on this node at "+a.staging)
	// The inventory shows the mapping.
	vols, errs := w.v.Staged(ctx, func(string) (Volume, error) { return a.Volume, nil })
	if len(errs) != 0 || len(vols) != 1 || !vols[0].Encrypted || vols[0].CryptMapping != MapperPath(CryptName(a.ID)) || vols[0].MountState != MountStateMounted || vols[0].Problem != "" {
		t.Fatalf("inventory %+v, %v", vols, errs)
	}
	// Health looks at the mapping the filesystem is on, whether it finds
	// the volume by its staging path or by its devices.
	for _, staging := range []string{a.staging, ""} {
		problems, err := w.v.Health(ctx, a.Volume, staging, "")
		if err != nil || len(problems) != 0 {
			t.Fatalf("Health(staging %q) = %v, %v", staging, problems, err)
		}
	}
	w.mustPublish(a, a.target, false)
	if problems, err := w.v.Health(ctx, a.Volume, "", a.target); err != nil || len(problems) != 0 {
		t.Fatalf("Health(publish only) = %v, %v", problems, err)
	}
}

// A read-only block publish of a writable encrypted stage is refused,
// untouched: it would need a second mapping.
func TestEncryptedBlockReadOnlyPublishRefused(t *testing.T) {
	w := newWorld(t)
	tv := w.newVolume("pvc-luks-ro", backend.AccessBlock, backend.SingleNodeWriter, false)
	w.mustStageEncrypted(tv)
	err := w.v.Publish(context.Background(), w.publishReq(tv, tv.target, true))
	wantKind(t, err, errdefs.ErrInvalidArgument, "read-only block publish")
	if w.host.Exists(tv.target) && len(w.host.MountTable()) != 0 {
		t.Fatalf("mounts after a refused publish: %v", w.host.MountTable())
	}
}

// A key rotation on a staged, published volume: the next key added, proven,
// the current one removed; the mount untouched; a rotation that stopped
// part-way finishes when run again; a restage during a rotation opens with
// the next key.
func TestRotateKey(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	tv := w.newVolume("pvc-rotate", backend.AccessMount, backend.SingleNodeWriter, false)
	w.mustStageEncrypted(tv)
	w.mustPublish(tv, tv.target, false)
	raw := w.identityOf("/dev/loop0")
	next := []byte("fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210")
	key := func(k []byte) func(context.Context) ([]byte, error) {
		return func(context.Context) ([]byte, error) { return bytes.Clone(k), nil }
	}
	mountsBefore := w.host.MountTable()

	// Interrupted after the add: both keys open.
	w.host.Fail["luksRemoveKey /dev/loop0"] = errors.New("cryptsetup: killed")
	if err := w.v.RotateKey(ctx, tv.Volume, tv.staging, key(testPassphrase), key(next)); err == nil {
		t.Fatal("RotateKey with a failing removal succeeded")
	}
	if keys := w.host.LUKSKeyslots(raw); len(keys) != 2 {
		t.Fatalf("keyslots after an interrupted rotation: %q", keys)
	}
	delete(w.host.Fail, "luksRemoveKey /dev/loop0")
	for i := 0; i < 2; i++ { // the rerun finishes it; a third run changes nothing
		if err := w.v.RotateKey(ctx, tv.Volume, tv.staging, key(testPassphrase), key(next)); err != nil {
			t.Fatalf("RotateKey #%d: %v", i+1, err)
		}
	}
	var live [][]byte
	for _, k := range w.host.LUKSKeyslots(raw) {
		if k != nil {
			live = append(live, k)
		}
	}
	if len(live) != 1 || !bytes.Equal(live[0], next) {
		t.Fatalf("live keyslots %q; want the next key only", live)
	}
	if got := w.host.MountTable(); len(got) != len(mountsBefore) {
		t.Fatalf("mounts changed: %v", got)
	}
	if countCalls(w.host.Calls, "luksAddKey") != 1 {
		t.Fatalf("the key was added %d times", countCalls(w.host.Calls, "luksAddKey"))
	}

	// A stage whose store still names the old key, with the next one
	// pending, opens with the next.
	if err := w.v.Unpublish(ctx, tv.Volume, tv.target); err != nil {
		t.Fatal(err)
	}
	if err := w.v.Unstage(ctx, tv.Volume, tv.staging); err != nil {
		t.Fatal(err)
	}
	req := w.encryptedStageReq(tv, "ext4")
	req.Encryption.OtherPassphrases = append(req.Encryption.OtherPassphrases, key(next))
	if err := w.v.Stage(ctx, req); err != nil {
		t.Fatal(err)
	}
	// Not staged: refused, naming where it rotates.
	other := w.newVolume("pvc-rotate-other", backend.AccessMount, backend.SingleNodeWriter, false)
	err := w.v.RotateKey(ctx, other.Volume, other.staging, key(testPassphrase), key(next))
	wantKind(t, err, errPrecondition, "is not staged at", "rotated on the node that stages it")
	if where, err := w.v.StagingPathOf(tv.ID); err != nil || where != tv.staging {
		t.Fatalf("StagingPathOf = %q, %v", where, err)
	}
}
