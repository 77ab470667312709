package controller

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

func TestCreateVolume(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name     string
		req      CreateRequest
		key      string // the instance the volume goes to
		size     int64
		fsType   string
		access   backend.AccessType
		wantCtx  map[string]string
		wantTopo bool
	}{
		{"ext4, default instance", createReq("pvc-ext4"), defaultKey, 8 * mib, "ext4", backend.AccessMount, nil, false},
		{"fs type left to the driver", CreateRequest{Name: "pvc-nofs", Capabilities: []Capability{{Access: backend.AccessMount, Mode: backend.SingleNodeWriter}}}, defaultKey, gib, "ext4", backend.AccessMount, nil, false},
		{"xfs rounds up to its minimum", CreateRequest{Name: "pvc-xfs", Capabilities: []Capability{{Access: backend.AccessMount, Mode: backend.SingleNodeWriter, FsType: "xfs"}}, RequiredBytes: mib}, defaultKey, 300 * mib, "xfs", backend.AccessMount, nil, false},
		{"fs type from the parameters", CreateRequest{Name: "pvc-param-fs", Capabilities: []Capability{{Access: backend.AccessMount, Mode: backend.SingleNodeWriter}}, RequiredBytes: 200 * mib,
			Parameters: map[string]string{"csi.storage.k8s.io/fstype": "btrfs"}}, defaultKey, 200 * mib, "btrfs", backend.AccessMount, nil, false},
		{"block on the named instance", CreateRequest{Name: "pvc-block", Capabilities: []Capability{blockRW}, RequiredBytes: 3 * mib,
			Parameters: map[string]string{"backend": fastKey, "csi.storage.k8s.io/pvc/name": "claim"}}, fastKey, 3 * mib, "", backend.AccessBlock, nil, false},
		{"mkfsOptions kept as the volume context", CreateRequest{Name: "pvc-mkfs", Capabilities: []Capability{mountRW}, RequiredBytes: 8 * mib,
			Parameters: map[string]string{"mkfsOptions": "  -E   lazy_itable_init=1 "}}, defaultKey, 8 * mib, "ext4", backend.AccessMount, map[string]string{"mkfsOptions": "-E lazy_itable_init=1"}, false},
		{"encrypted: at least the LUKS header more than ext4's minimum", CreateRequest{Name: "pvc-enc", Capabilities: []Capability{mountRW}, RequiredBytes: 8 * mib,
			Parameters: map[string]string{"encrypted": "true"}}, defaultKey, 17 * mib, "ext4", backend.AccessMount, map[string]string{"encrypted": "true", "encryptionKMSID": "secrets"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := e.mustCreate(t, tc.req)
			if !strings.HasPrefix(v.ID, tc.key+"/") || v.CapacityBytes != tc.size || (v.Topology != nil) != tc.wantTopo {
				t.Fatalf("volume %+v, want one of %d bytes on %s", v, tc.size, tc.key)
			}
			img := e.image(t, v.ID)
			if img.FsType != tc.fsType || img.AccessType != tc.access || img.CapacityBytes != tc.size || img.Name != tc.req.Name {
				t.Fatalf("image %+v, want %s %s of %d bytes", img, tc.access, tc.fsType, tc.size)
			}
			for k, want := range tc.wantCtx {
				if v.Context[k] != want {
					t.Fatalf("context %v, want %s=%q", v.Context, k, want)
				}
			}
			if (img.Encryption != nil) != (tc.wantCtx["encrypted"] == "true") {
				t.Fatalf("encryption %+v recorded for parameters %v", img.Encryption, tc.req.Parameters)
			}
			// A retry is the same volume.
			again := e.mustCreate(t, tc.req)
			if again.ID != v.ID || again.CapacityBytes != v.CapacityBytes {
				t.Fatalf("retry = %+v, first %+v", again, v)
			}
		})
	}
	// The encrypted volume's key is the secrets KMS's wrap for its owner.
	enc := e.image(t, defaultKey+"/pvc-enc").Encryption
	if enc.KeyOwner != "volume/pvc-enc" || enc.WrappedKey == "" {
		t.Fatalf("encryption %+v", enc)
	}
	if p, err := e.c.Unwrap(e.ctx, enc, testSecrets); err != nil || len(p) == 0 {
		t.Fatalf("the wrapped key does not unwrap: %v", err)
	}
}

// Every refusal comes before anything is created.
func TestCreateVolumeRefusals(t *testing.T) {
	e := newEnv(t)
	e.mustCreate(t, createReq("pvc-exists"))
	tests := []struct {
		name     string
		req      CreateRequest
		kind     error
		mentions []string
	}{
		{"the name exists with another size", func() CreateRequest { r := createReq("pvc-exists"); r.RequiredBytes = 16 * mib; return r }(), errdefs.ErrAlreadyExists, []string{`"pvc-exists" already exists`, "below the required"}},
		{"the name exists as block", func() CreateRequest { r := createReq("pvc-exists"); r.Capabilities = []Capability{blockRW}; return r }(), errdefs.ErrAlreadyExists, []string{"a mount volume, not block"}},
		{"an unknown backend", func() CreateRequest {
			r := createReq("pvc-x")
			r.Parameters = map[string]string{"backend": "loop/gone"}
			return r
		}(), errdefs.ErrInvalidArgument, []string{"loop/gone", "configured"}},
		{"a key no one takes", func() CreateRequest { r := createReq("pvc-x"); r.Parameters = map[string]string{"pool": "a"}; return r }(), errdefs.ErrInvalidArgument, []string{`"pool"`, "takes no parameters of its own"}},
		{"mkfsOptions naming a device", func() CreateRequest {
			r := createReq("pvc-x")
			r.Parameters = map[string]string{"mkfsOptions": "-F /dev/sda"}
			return r
		}(), errdefs.ErrInvalidArgument, []string{"/dev/sda", "device path"}},
		{"fs types that disagree", func() CreateRequest {
			r := createReq("pvc-x")
			r.Parameters = map[string]string{"csi.storage.k8s.io/fstype": "xfs"}
			return r
		}(), errdefs.ErrInvalidArgument, []string{"volume_capabilities[0].mount.fs_type", "disagree"}},
		{"a multi-node writer", func() CreateRequest {
			r := createReq("pvc-x")
			r.Capabilities = []Capability{{Access: backend.AccessBlock, Mode: backend.MultiNodeMultiWriter}}
			return r
		}(), errdefs.ErrInvalidArgument, []string{"volume_capabilities[0]", "MULTI_NODE_MULTI_WRITER"}},
		{"encrypted with an unknown KMS", func() CreateRequest {
			r := createReq("pvc-x")
			r.Parameters = map[string]string{"encrypted": "true", "encryptionKMSID": "vault"}
			return r
		}(), errdefs.ErrInvalidArgument, []string{"encryptionKMSID", `"vault"`}},
		{"a KMS without encryption", func() CreateRequest {
			r := createReq("pvc-x")
			r.Parameters = map[string]string{"encryptionKMSID": "default"}
			return r
		}(), errdefs.ErrInvalidArgument, []string{"encryptionKMSID", "not \"true\""}},
		{"larger than the largest", func() CreateRequest { r := createReq("pvc-x"); r.RequiredBytes = MaxCapacity + 1; return r }(), errdefs.ErrOutOfRange, []string{"largest volume"}},
		{"no size within the limit", func() CreateRequest { r := createReq("pvc-x"); r.RequiredBytes, r.LimitBytes = mib+1, mib+2; return r }(), errdefs.ErrOutOfRange, []string{"no size within"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.c.CreateVolume(e.ctx, tc.req)
			wantKind(t, err, tc.kind, tc.mentions...)
			if tc.req.Name != "pvc-exists" {
				e.noImage(t, defaultKey+"/"+tc.req.Name)
			}
		})
	}
	if got := e.image(t, defaultKey+"/pvc-exists"); got.CapacityBytes != 8*mib {
		t.Fatalf("a refused repeat changed the volume: %+v", got)
	}
}

// A copy of a snapshot or of a volume: as big as its source unless asked
// for more, never smaller, of the source's filesystem, within one instance.
func TestCreateVolumeFromSource(t *testing.T) {
	e := newEnv(t)
	src := e.mustCreate(t, CreateRequest{Name: "pvc-src", Capabilities: []Capability{{Access: backend.AccessMount, Mode: backend.SingleNodeWriter, FsType: "btrfs"}}, RequiredBytes: 200 * mib})
	snap, err := e.c.CreateSnapshot(e.ctx, "snap-src", mustID(t, src.ID), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	other := e.mustCreate(t, CreateRequest{Name: "pvc-other", Capabilities: []Capability{mountRW}, RequiredBytes: 8 * mib, Parameters: map[string]string{"backend": fastKey}})
	fromSnap := &Source{Snapshot: true, Field: "volume_content_source.snapshot.snapshot_id", ID: snap.ID}
	fromVol := &Source{Field: "volume_content_source.volume.volume_id", ID: src.ID}
	copyOf := func(name string, src *Source, change func(*CreateRequest)) CreateRequest {
		r := CreateRequest{Name: name, Capabilities: []Capability{{Access: backend.AccessMount, Mode: backend.SingleNodeWriter}}, Source: src}
		if change != nil {
			change(&r)
		}
		return r
	}
	tests := []struct {
		name       string
		req        CreateRequest
		size       int64
		snapSource bool
		kind       error
		mentions   []string
	}{
		{"restore, as big as the snapshot", copyOf("pvc-restore", fromSnap, nil), 200 * mib, true, nil, nil},
		{"clone, bigger", copyOf("pvc-clone", fromVol, func(r *CreateRequest) { r.RequiredBytes = 300 * mib }), 300 * mib, false, nil, nil},
		{"clone naming the source's filesystem", copyOf("pvc-clone-fs", fromVol, func(r *CreateRequest) { r.Capabilities[0].FsType = "btrfs" }), 200 * mib, false, nil, nil},
		{"smaller than the source", copyOf("pvc-small", fromVol, func(r *CreateRequest) { r.RequiredBytes = 100 * mib }), 0, false, errdefs.ErrOutOfRange, []string{"smaller than its source", "209715200"}},
		{"a limit below the source", copyOf("pvc-limit", fromSnap, func(r *CreateRequest) { r.LimitBytes = 100 * mib }), 0, false, errdefs.ErrOutOfRange, []string{"limit_bytes", snap.ID}},
		{"another filesystem", copyOf("pvc-xfs", fromVol, func(r *CreateRequest) { r.Capabilities[0].FsType = "xfs" }), 0, false, errdefs.ErrInvalidArgument, []string{"xfs", "holds btrfs"}},
		{"block of a mount volume", copyOf("pvc-blk", fromVol, func(r *CreateRequest) { r.Capabilities = []Capability{blockRW} }), 0, false, errdefs.ErrInvalidArgument, []string{"block access", "mount volume"}},
		{"a source in another instance", copyOf("pvc-far", &Source{Field: "volume_content_source.volume.volume_id", ID: other.ID}, nil), 0, false, errdefs.ErrInvalidArgument, []string{"is in backend " + fastKey, "within one backend instance"}},
		{"a snapshot that does not exist", copyOf("pvc-nosnap", &Source{Snapshot: true, Field: "volume_content_source.snapshot.snapshot_id", ID: defaultKey + "/snap-none"}, nil), 0, false, errdefs.ErrNotFound, []string{"snap-none"}},
		{"an ID Spindle never issued", copyOf("pvc-bad", &Source{Field: "volume_content_source.volume.volume_id", ID: "pvc-elsewhere"}, nil), 0, false, errdefs.ErrNotFound, []string{"volume_content_source.volume.volume_id", "names no Spindle volume"}},
		{"an encrypted copy of a plain source", copyOf("pvc-enc", fromVol, func(r *CreateRequest) { r.Parameters = map[string]string{"encrypted": "true"} }), 0, false, errdefs.ErrInvalidArgument, []string{"not encrypted", "in clear"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := e.c.CreateVolume(e.ctx, tc.req)
			if tc.kind != nil {
				wantKind(t, err, tc.kind, tc.mentions...)
				e.noImage(t, defaultKey+"/"+tc.req.Name)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			img := e.image(t, v.ID)
			if v.CapacityBytes != tc.size || img.FsType != "btrfs" || img.Source == nil {
				t.Fatalf("copy %+v, image %+v; want %d bytes of btrfs with a source", v, img, tc.size)
			}
			if tc.snapSource && v.SourceSnapshotID != snap.ID || !tc.snapSource && v.SourceVolumeID != src.ID {
				t.Fatalf("copy names its source as %q / %q", v.SourceSnapshotID, v.SourceVolumeID)
			}
		})
	}
}

// A copy of an encrypted volume is encrypted with the same passphrase,
// wrapped for itself, whatever its parameters say.
func TestCreateVolumeFromEncryptedSource(t *testing.T) {
	e := newEnv(t)
	src := e.mustCreate(t, CreateRequest{Name: "pvc-enc", Capabilities: []Capability{mountRW}, RequiredBytes: 32 * mib, Parameters: map[string]string{"encrypted": "true"}})
	clone := e.mustCreate(t, CreateRequest{Name: "pvc-enc-clone", Capabilities: []Capability{mountRW}, Source: &Source{Field: "f", ID: src.ID}})
	if clone.Context["encrypted"] != "true" {
		t.Fatalf("the copy's context %v does not say it is encrypted", clone.Context)
	}
	a, b := e.image(t, src.ID).Encryption, e.image(t, clone.ID).Encryption
	if b == nil || b.KeyOwner != "volume/pvc-enc-clone" || b.WrappedKey == a.WrappedKey {
		t.Fatalf("the copy's encryption %+v, the source's %+v", b, a)
	}
	pa, err := e.c.Unwrap(e.ctx, a, testSecrets)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := e.c.Unwrap(e.ctx, b, testSecrets)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(pa, pb) {
		t.Fatal("the copy's passphrase is not its source's: its LUKS header would not open")
	}
}

// A CreateVolume in progress makes a second one for the same name ABORTED
// at once.
func TestCreateVolumeWhileBusy(t *testing.T) {
	e := newEnv(t)
	release, err := e.locks.Acquire("create/pvc-busy", "test")
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.c.CreateVolume(e.ctx, createReq("pvc-busy"))
	wantKind(t, err, errdefs.ErrBusy, "volume name pvc-busy", "already in progress")
	release()
	e.mustCreate(t, createReq("pvc-busy"))
}

func TestDeleteVolume(t *testing.T) {
	e := newEnv(t)
	plain := e.mustCreate(t, createReq("pvc-plain"))
	enc := e.mustCreate(t, CreateRequest{Name: "pvc-enc", Capabilities: []Capability{mountRW}, RequiredBytes: 32 * mib, Parameters: map[string]string{"encrypted": "true"}})

	for _, v := range []*Volume{plain, enc} {
		if err := e.c.DeleteVolume(e.ctx, mustID(t, v.ID)); err != nil {
			t.Fatalf("DeleteVolume(%s): %v", v.ID, err)
		}
		e.noImage(t, v.ID)
		// Deleting again is fine: the volume does not exist.
		if err := e.c.DeleteVolume(e.ctx, mustID(t, v.ID)); err != nil {
			t.Fatalf("DeleteVolume(%s) again: %v", v.ID, err)
		}
	}
	if imgs, _ := filepath.Glob(filepath.Join(e.pools[defaultKey].Dir(), "*.img")); len(imgs) != 0 {
		t.Fatalf("image files left in the pool: %v", imgs)
	}

	wantKind(t, e.c.DeleteVolume(e.ctx, mustID(t, "loop/gone/pvc-x")), errdefs.ErrPrecondition, "loop/gone", "not configured")
	busy := e.mustCreate(t, createReq("pvc-busy"))
	release, err := e.locks.Acquire("volume/"+busy.ID, "test")
	if err != nil {
		t.Fatal(err)
	}
	wantKind(t, e.c.DeleteVolume(e.ctx, mustID(t, busy.ID)), errdefs.ErrBusy, "volume "+busy.ID)
	release()
	e.image(t, busy.ID)
}
