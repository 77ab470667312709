package controller

import (
	"slices"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

func attachedNodes(img *backend.Image) []string {
	var out []string
	for _, a := range img.Attachments {
		out = append(out, a.NodeID)
	}
	return out
}

// Publish grants a node access and records it; the access mode decides who
// else may have it, and a refusal names the node that holds the volume.
func TestPublishAndUnpublish(t *testing.T) {
	e := newEnv(t)
	vol := e.mustCreate(t, createReq("pvc-pub"))
	id := mustID(t, vol.ID)
	pub := func(node string, cp Capability, ro bool) (map[string]string, error) {
		return e.c.Publish(e.ctx, PublishRequest{ID: id, NodeID: node, Capability: cp, ReadOnly: ro})
	}
	pc, err := pub("node-a", mountRW, false)
	if err != nil {
		t.Fatal(err)
	}
	if pc[backend.ContextReadOnly] != "false" || pc["imagePath"] == "" {
		t.Fatalf("publish_context %v", pc)
	}
	if _, err := pub("node-a", mountRW, false); err != nil {
		t.Fatalf("a repeated publish: %v", err)
	}
	tests := []struct {
		name     string
		node     string
		cp       Capability
		ro       bool
		kind     error
		mentions []string
	}{
		{"a second node of a single-node volume", "node-b", mountRW, false, errdefs.ErrPrecondition, []string{`published to node "node-a"`, "one node at a time"}},
		{"the same node, read-only now", "node-a", mountRW, true, errdefs.ErrAlreadyExists, []string{`node "node-a"`, "read-only=false"}},
		{"as block", "node-b", blockRW, false, errdefs.ErrInvalidArgument, []string{"volume_capability", "created for mount access, not block"}},
		{"as another filesystem", "node-b", Capability{Access: backend.AccessMount, Mode: backend.SingleNodeWriter, FsType: "xfs"}, false, errdefs.ErrInvalidArgument, []string{"holds ext4, not xfs"}},
		{"a multi-node writer", "node-b", Capability{Access: backend.AccessBlock, Mode: backend.MultiNodeMultiWriter}, false, errdefs.ErrInvalidArgument, []string{"MULTI_NODE_MULTI_WRITER", "loop"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pub(tc.node, tc.cp, tc.ro)
			wantKind(t, err, tc.kind, tc.mentions...)
			if got := attachedNodes(e.image(t, vol.ID)); !slices.Equal(got, []string{"node-a"}) {
				t.Fatalf("attachments %v after a refused publish", got)
			}
		})
	}
	_, err = e.c.Publish(e.ctx, PublishRequest{ID: mustID(t, defaultKey+"/pvc-none"), NodeID: "node-a", Capability: mountRW})
	wantKind(t, err, errdefs.ErrNotFound, "pvc-none")

	// Unpublished from node A, it goes to node B.
	if err := e.c.Unpublish(e.ctx, id, "node-a"); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Unpublish(e.ctx, id, "node-a"); err != nil {
		t.Fatalf("a repeated unpublish: %v", err)
	}
	if _, err := pub("node-b", mountRW, false); err != nil {
		t.Fatal(err)
	}
	if got := attachedNodes(e.image(t, vol.ID)); !slices.Equal(got, []string{"node-b"}) {
		t.Fatalf("attachments %v, want node-b", got)
	}
	// Without a node: from every node.
	if err := e.c.Unpublish(e.ctx, id, ""); err != nil {
		t.Fatal(err)
	}
	if got := attachedNodes(e.image(t, vol.ID)); len(got) != 0 {
		t.Fatalf("attachments %v after unpublishing from every node", got)
	}
	if err := e.c.Unpublish(e.ctx, mustID(t, defaultKey+"/pvc-none"), ""); err != nil {
		t.Fatalf("unpublish of a volume that is gone: %v", err)
	}
	wantKind(t, e.c.Unpublish(e.ctx, mustID(t, "loop/gone/pvc-x"), "node-a"), errdefs.ErrPrecondition, "loop/gone")
}

// A read-only volume may go to many nodes; an encrypted one carries its
// wrapped key to the node.
func TestPublishReadOnlyAndEncrypted(t *testing.T) {
	e := newEnv(t)
	ro := e.mustCreate(t, createReq("pvc-ro"))
	cp := Capability{Access: backend.AccessMount, Mode: backend.MultiNodeReaderOnly, FsType: "ext4"}
	for _, n := range []string{"node-a", "node-b"} {
		pc, err := e.c.Publish(e.ctx, PublishRequest{ID: mustID(t, ro.ID), NodeID: n, Capability: cp})
		if err != nil {
			t.Fatal(err)
		}
		if pc[backend.ContextReadOnly] != "true" {
			t.Fatalf("a reader-only publish is not read-only: %v", pc)
		}
	}
	enc := e.mustCreate(t, CreateRequest{Name: "pvc-enc", Capabilities: []Capability{mountRW}, RequiredBytes: 32 * mib, Parameters: map[string]string{"encrypted": "true"}})
	pc, err := e.c.Publish(e.ctx, PublishRequest{ID: mustID(t, enc.ID), NodeID: "node-a", Capability: mountRW})
	if err != nil {
		t.Fatal(err)
	}
	want := e.image(t, enc.ID).Encryption
	if pc[backend.ContextEncryptionWrapped] != want.WrappedKey || pc[backend.ContextEncryptionOwner] != want.KeyOwner || pc[backend.ContextEncryptionKMSID] != want.KMSID {
		t.Fatalf("publish_context %v does not carry the wrapped key %+v", pc, want)
	}
	if _, ok := pc[backend.ContextEncryptionNext]; ok {
		t.Fatalf("publish_context %v names a next key with no rotation under way", pc)
	}
}

// A pre-provisioned volume is published from its handle and attributes:
// the node is told where the image is, and nothing is granted.
func TestPublishStatic(t *testing.T) {
	e := newEnv(t, withStatic())
	img, err := e.pools[fastKey].Create(e.ctx, backend.VolumeSpec{Name: "made-elsewhere", CapacityBytes: 8 * mib, AccessType: backend.AccessBlock})
	if err != nil {
		t.Fatal(err)
	}
	attrs := map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "staticVolume": "true"}
	pc, err := e.c.PublishStatic("volume_id", img.ID, attrs, blockRW, true)
	if err != nil {
		t.Fatal(err)
	}
	if pc["image"] != img.ID || pc[backend.ContextReadOnly] != "true" {
		t.Fatalf("publish_context %v", pc)
	}
	if got := attachedNodes(e.image(t, fastKey+"/"+img.ID)); len(got) != 0 {
		t.Fatalf("a static publish recorded %v", got)
	}
	tests := []struct {
		name     string
		attrs    map[string]string
		cp       Capability
		kind     error
		mentions []string
	}{
		{"attributes no backend claims", map[string]string{"clusterID": "elsewhere", "staticVolume": "true"}, blockRW, errdefs.ErrNotFound, []string{"no configured backend serves a pre-provisioned volume", `"elsewhere"`}},
		{"the store wants more", map[string]string{"clusterID": "rook-ceph", "staticVolume": "true"}, blockRW, errdefs.ErrInvalidArgument, []string{"volume_context", "pool is required"}},
		{"encrypted elsewhere", map[string]string{"clusterID": "rook-ceph", "pool": "p", "staticVolume": "true", "encrypted": "true"}, blockRW, errdefs.ErrInvalidArgument, []string{"opens only the encrypted volumes it created"}},
		{"a multi-node writer", attrs, Capability{Access: backend.AccessBlock, Mode: backend.MultiNodeMultiWriter}, errdefs.ErrInvalidArgument, []string{"volume_capability"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.c.PublishStatic("volume_id", img.ID, tc.attrs, tc.cp, false)
			wantKind(t, err, tc.kind, tc.mentions...)
		})
	}
}

func TestValidateCapabilities(t *testing.T) {
	e := newEnv(t)
	vol := e.mustCreate(t, createReq("pvc-v"))
	id := mustID(t, vol.ID)
	tests := []struct {
		name        string
		params      map[string]string
		caps        []Capability
		unsupported []string // nil: confirmed
	}{
		{"the volume's own", nil, []Capability{mountRW, {Access: backend.AccessMount, Mode: backend.SingleNodeReaderOnly}}, nil},
		{"block", nil, []Capability{mountRW, blockRW}, []string{"volume_capabilities[1]", "created for mount access, not block"}},
		{"another filesystem", nil, []Capability{{Access: backend.AccessMount, Mode: backend.SingleNodeWriter, FsType: "xfs"}}, []string{"volume_capabilities[0]", "holds ext4, not xfs"}},
		{"a mode the backend refuses", nil, []Capability{{Access: backend.AccessBlock, Mode: backend.MultiNodeSingleWriter}}, []string{"volume_capabilities[0]", "MULTI_NODE_SINGLE_WRITER"}},
		{"parameters no backend takes", map[string]string{"pool": "x"}, []Capability{mountRW}, []string{`"pool"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			unsupported, err := e.c.ValidateCapabilities(e.ctx, id, tc.params, tc.caps)
			if err != nil {
				t.Fatalf("an unsupported capability is an answer, not an error: %v", err)
			}
			if tc.unsupported == nil {
				if unsupported != nil {
					t.Fatalf("unsupported: %v", unsupported)
				}
				return
			}
			wantKind(t, unsupported, errdefs.ErrInvalidArgument, tc.unsupported...)
		})
	}
	_, err := e.c.ValidateCapabilities(e.ctx, mustID(t, defaultKey+"/pvc-none"), nil, []Capability{mountRW})
	wantKind(t, err, errdefs.ErrNotFound, "pvc-none")
}

func TestModifyVolume(t *testing.T) {
	e := newEnv(t)
	vol := e.mustCreate(t, createReq("pvc-mod"))
	id := mustID(t, vol.ID)
	if err := e.c.Modify(e.ctx, id, map[string]string{"directIO": "false"}); err != nil {
		t.Fatal(err)
	}
	if got := e.image(t, vol.ID).MutableParameters["directIO"]; got != "false" {
		t.Fatalf("directIO = %q after the modify", got)
	}
	wantKind(t, e.c.Modify(e.ctx, id, map[string]string{"iops": "100"}), errdefs.ErrInvalidArgument, `"iops"`, "directIO")
	wantKind(t, e.c.Modify(e.ctx, id, map[string]string{"directIO": "maybe"}), errdefs.ErrInvalidArgument, `"maybe"`)
	if got := e.image(t, vol.ID).MutableParameters["directIO"]; got != "false" {
		t.Fatalf("a refused modify changed directIO to %q", got)
	}
	// Nothing to change: the volume must still exist.
	if err := e.c.Modify(e.ctx, id, nil); err != nil {
		t.Fatal(err)
	}
	wantKind(t, e.c.Modify(e.ctx, mustID(t, defaultKey+"/pvc-none"), nil), errdefs.ErrNotFound, "pvc-none")
}

func TestExpandVolume(t *testing.T) {
	e := newEnv(t)
	vol := e.mustCreate(t, createReq("pvc-grow"))
	id := mustID(t, vol.ID)
	tests := []struct {
		name            string
		required, limit int64
		want            int64
		kind            error
		mentions        []string
	}{
		{"grow, rounded up to a MiB", 20*mib + 1, 0, 21 * mib, nil, nil},
		{"the same size again", 21 * mib, 0, 21 * mib, nil, nil},
		{"shrink", 10 * mib, 0, 0, errdefs.ErrOutOfRange, []string{vol.ID, "cannot shrink to 10485760"}},
		{"a limit below the request", 30 * mib, 25 * mib, 0, errdefs.ErrInvalidArgument, []string{"exceeds limit_bytes"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := e.c.Expand(e.ctx, id, tc.required, tc.limit)
			if tc.kind != nil {
				wantKind(t, err, tc.kind, tc.mentions...)
				if size := e.image(t, vol.ID).CapacityBytes; size != 21*mib {
					t.Fatalf("a refused expand left %d bytes", size)
				}
				return
			}
			if err != nil || got != tc.want || e.image(t, vol.ID).CapacityBytes != tc.want {
				t.Fatalf("Expand = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
	_, err := e.c.Expand(e.ctx, mustID(t, defaultKey+"/pvc-none"), 30*mib, 0)
	wantKind(t, err, errdefs.ErrNotFound, "pvc-none")
}
