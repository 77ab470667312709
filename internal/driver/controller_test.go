package driver

import (
	"context"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/status"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/filestore"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

func TestCreateVolume(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		req          *csi.CreateVolumeRequest
		wantInstance string
		wantCapacity int64
		wantAccess   backend.AccessType
		wantFsType   string
		wantContext  map[string]string
	}{
		{
			name:         "ext4 10 MiB",
			req:          createReq("pvc-6f1c0000-0000-4000-8000-000000000001"),
			wantInstance: defaultKey, wantCapacity: 10 * mib, wantAccess: backend.AccessMount, wantFsType: "ext4",
		},
		{
			name: "default size and fs type",
			req: &csi.CreateVolumeRequest{Name: "pvc-defaults", VolumeCapabilities: []*csi.VolumeCapability{
				mountCap("", snw), mountCap("", snro),
			}},
			wantInstance: defaultKey, wantCapacity: 1 * gib, wantAccess: backend.AccessMount, wantFsType: "ext4",
		},
		{
			name: "xfs rounds up to its minimum",
			req: &csi.CreateVolumeRequest{Name: "pvc-xfs", CapacityRange: &csi.CapacityRange{RequiredBytes: 10 * mib},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap("xfs", snw)}},
			wantInstance: defaultKey, wantCapacity: 300 * mib, wantAccess: backend.AccessMount, wantFsType: "xfs",
		},
		{
			name: "block rounds up to a MiB",
			req: &csi.CreateVolumeRequest{Name: "pvc-block", CapacityRange: &csi.CapacityRange{RequiredBytes: 5*mib + 1},
				VolumeCapabilities: []*csi.VolumeCapability{blockCap(snw), blockCap(mnro)}},
			wantInstance: defaultKey, wantCapacity: 6 * mib, wantAccess: backend.AccessBlock,
		},
		{
			name: "other backend, mkfsOptions, provisioner metadata",
			req: &csi.CreateVolumeRequest{Name: "pvc-fast", CapacityRange: &csi.CapacityRange{RequiredBytes: 20 * mib},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap("ext4", snmw)},
				Parameters: map[string]string{
					"backend":                          fastKey,
					"mkfsOptions":                      "  -b 4096\t-L data ",
					"csi.storage.k8s.io/pvc/name":      "data",
					"csi.storage.k8s.io/pvc/namespace": "default",
				}},
			wantInstance: fastKey, wantCapacity: 20 * mib, wantAccess: backend.AccessMount, wantFsType: "ext4",
			wantContext: map[string]string{"mkfsOptions": "-b 4096 -L data"},
		},
		{
			name: "name that is not a file name",
			req: &csi.CreateVolumeRequest{Name: "Volume With Spaces/and/slashes", CapacityRange: &csi.CapacityRange{RequiredBytes: mib},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap("ext4", snw)}},
			wantInstance: defaultKey, wantCapacity: mib, wantAccess: backend.AccessMount, wantFsType: "ext4",
		},
		{
			name: "longest name",
			req: &csi.CreateVolumeRequest{Name: strings.Repeat("n", 128), CapacityRange: &csi.CapacityRange{RequiredBytes: mib},
				VolumeCapabilities: []*csi.VolumeCapability{blockCap(snw)}},
			wantInstance: defaultKey, wantCapacity: mib, wantAccess: backend.AccessBlock,
		},
	}
	e := newTestEnv(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := e.CreateVolume(tt.req)
			if err != nil {
				t.Fatalf("CreateVolume: %v", err)
			}
			v := resp.GetVolume()
			id, err := volumeid.Parse(v.GetVolumeId())
			if err != nil {
				t.Fatalf("volume_id %q does not parse: %v", v.GetVolumeId(), err)
			}
			if id.InstanceKey() != tt.wantInstance || id.Image != filestore.ImageIDForName(tt.req.GetName()) {
				t.Fatalf("volume_id %q, want %s/%s", v.GetVolumeId(), tt.wantInstance, filestore.ImageIDForName(tt.req.GetName()))
			}
			if v.GetCapacityBytes() != tt.wantCapacity {
				t.Fatalf("capacity_bytes = %d, want %d", v.GetCapacityBytes(), tt.wantCapacity)
			}
			if !maps.Equal(v.GetVolumeContext(), tt.wantContext) {
				t.Fatalf("volume_context = %v, want %v", v.GetVolumeContext(), tt.wantContext)
			}
			img := e.image(t, v.GetVolumeId())
			if img.Name != tt.req.GetName() || img.CapacityBytes != tt.wantCapacity || img.AccessType != tt.wantAccess || img.FsType != tt.wantFsType {
				t.Fatalf("image record %+v, want name %q, %d bytes, %s, fs %q", img, tt.req.GetName(), tt.wantCapacity, tt.wantAccess, tt.wantFsType)
			}
			st, err := os.Stat(e.pools[tt.wantInstance].ImagePath(id.Image))
			if err != nil {
				t.Fatalf("image file: %v", err)
			}
			if st.Size() != tt.wantCapacity {
				t.Fatalf("image file is %d bytes, want %d", st.Size(), tt.wantCapacity)
			}

			// A retry with the same request gets the same answer.
			again, err := e.CreateVolume(tt.req)
			if err != nil {
				t.Fatalf("repeated CreateVolume: %v", err)
			}
			if !proto.Equal(again, resp) {
				t.Fatalf("repeated CreateVolume = %v, first = %v", again, resp)
			}
		})
	}
}

// A repeated CreateVolume that the existing volume cannot satisfy is
// ALREADY_EXISTS; one it can satisfy is the same volume.
func TestCreateVolumeRepeat(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	first, err := e.CreateVolume(createReq("pvc-repeat"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		mutate func(*csi.CreateVolumeRequest)
		code   codes.Code
		want   []string
	}{
		{"same", func(*csi.CreateVolumeRequest) {}, codes.OK, nil},
		{"range that the size fits", func(r *csi.CreateVolumeRequest) {
			r.CapacityRange = &csi.CapacityRange{RequiredBytes: 5 * mib, LimitBytes: 50 * mib}
		}, codes.OK, nil},
		{"provisioner metadata differs", func(r *csi.CreateVolumeRequest) {
			r.Parameters = map[string]string{"csi.storage.k8s.io/pvc/name": "other"}
		}, codes.OK, nil},
		{"fs type left to the driver", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities = []*csi.VolumeCapability{mountCap("", snw)} }, codes.OK, nil},
		{"larger", func(r *csi.CreateVolumeRequest) { r.CapacityRange = &csi.CapacityRange{RequiredBytes: 20 * mib} }, codes.AlreadyExists, []string{`"pvc-repeat" already exists`, "below the required"}},
		{"smaller limit", func(r *csi.CreateVolumeRequest) { r.CapacityRange = &csi.CapacityRange{LimitBytes: 5 * mib} }, codes.AlreadyExists, []string{"above the limit"}},
		{"other fs type", func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities = []*csi.VolumeCapability{mountCap("btrfs", snw)}
		}, codes.AlreadyExists, []string{"fs type"}},
		{"block", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities = []*csi.VolumeCapability{blockCap(snw)} }, codes.AlreadyExists, []string{"mount volume, not block"}},
		{"other mkfsOptions", func(r *csi.CreateVolumeRequest) { r.Parameters = map[string]string{"mkfsOptions": "-N 1000"} }, codes.AlreadyExists, []string{"parameters"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := createReq("pvc-repeat")
			tt.mutate(req)
			resp, err := e.CreateVolume(req)
			wantCode(t, err, tt.code, tt.want...)
			if tt.code == codes.OK && !proto.Equal(resp, first) {
				t.Fatalf("got %v, want the first volume %v", resp, first)
			}
		})
	}
	// The refused repeats did not change the volume.
	img := e.image(t, first.GetVolume().GetVolumeId())
	if img.CapacityBytes != 10*mib || img.FsType != "ext4" || img.AccessType != backend.AccessMount || len(img.Parameters) != 0 {
		t.Fatalf("volume changed by refused repeats: %+v", img)
	}
	if n := len(e.poolImages(t, defaultKey)); n != 1 {
		t.Fatalf("%d images in the pool, want 1", n)
	}
}

func TestControllerPublishVolume(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.registerNodes(t, defaultKey, "node-a", "node-b")
	vol := e.mustCreate(t, createReq("pvc-pub"))
	id, _ := volumeid.Parse(vol)
	imagePath := e.pools[defaultKey].ImagePath(id.Image)
	c := mountCap("ext4", snw)

	pc := e.mustPublish(t, vol, "node-a", c, false)
	if want := map[string]string{"imagePath": imagePath, "readOnly": "false"}; !maps.Equal(pc, want) {
		t.Fatalf("publish_context = %v, want %v", pc, want)
	}
	if _, err := os.Stat(pc["imagePath"]); err != nil {
		t.Fatalf("publish_context.imagePath: %v", err)
	}
	if again := e.mustPublish(t, vol, "node-a", c, false); !maps.Equal(again, pc) {
		t.Fatalf("repeated publish_context = %v, first %v", again, pc)
	}
	img := e.image(t, vol)
	if len(img.Attachments) != 1 || img.Attachments[0].NodeID != "node-a" || img.Attachments[0].AccessMode != backend.SingleNodeWriter || img.Attachments[0].ReadOnly {
		t.Fatalf("attachments = %+v, want node-a SINGLE_NODE_WRITER read-write", img.Attachments)
	}

	free := e.mustCreate(t, createReq("pvc-pub-free"))

	tests := []struct {
		name string
		req  *csi.ControllerPublishVolumeRequest
		code codes.Code
		want []string
	}{
		{"second node", &csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: "node-b", VolumeCapability: c}, codes.FailedPrecondition, []string{`node "node-a"`}},
		{"same node read-only", &csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: "node-a", VolumeCapability: c, Readonly: true}, codes.AlreadyExists, []string{`node "node-a"`}},
		{"same node other mode", &csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: "node-a", VolumeCapability: mountCap("ext4", snmw)}, codes.AlreadyExists, []string{"SINGLE_NODE_MULTI_WRITER"}},
		{"unknown node", &csi.ControllerPublishVolumeRequest{VolumeId: free, NodeId: "node-z", VolumeCapability: c}, codes.NotFound, []string{`"node-z"`, "has not registered"}},
		// The holder is the news for a volume another node has.
		{"unknown node, volume held", &csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: "node-z", VolumeCapability: c}, codes.FailedPrecondition, []string{`node "node-a"`}},
		{"unknown volume", &csi.ControllerPublishVolumeRequest{VolumeId: "loop/default/pvc-missing", NodeId: "node-a", VolumeCapability: c}, codes.NotFound, []string{"pvc-missing"}},
		{"unconfigured instance", &csi.ControllerPublishVolumeRequest{VolumeId: "loop/other/pvc-pub", NodeId: "node-a", VolumeCapability: c}, codes.FailedPrecondition, []string{"loop/other", "not configured"}},
		{"block on a mount volume", &csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: "node-b", VolumeCapability: blockCap(snw)}, codes.InvalidArgument, []string{"volume_capability", "mount access, not block"}},
		{"other fs type", &csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: "node-b", VolumeCapability: mountCap("xfs", snw)}, codes.InvalidArgument, []string{"volume_capability", "holds ext4, not xfs"}},
		{"multi-node writer block on loop", &csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: "node-b", VolumeCapability: blockCap(mnmw)}, codes.InvalidArgument, []string{"volume_capability", "loop backend"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := e.ControllerPublish(tt.req)
			wantCode(t, err, tt.code, tt.want...)
			if resp != nil {
				t.Fatalf("response %v with an error", resp)
			}
		})
	}
	if got := attachedNodes(e.image(t, vol)); !slices.Equal(got, []string{"node-a"}) {
		t.Fatalf("refused publishes changed the attachments: %v", got)
	}

	// Published volumes are not deleted.
	wantCode(t, e.DeleteVolume(vol), codes.FailedPrecondition, "node-a", "unpublish")
	if _, err := os.Stat(imagePath); err != nil {
		t.Fatalf("image of a published volume is gone: %v", err)
	}
	// Unpublishing a node that has no attachment changes nothing.
	wantCode(t, e.ControllerUnpublish(vol, "node-b"), codes.OK)
	wantCode(t, e.ControllerUnpublish(vol, "node-never-registered"), codes.OK)
	if got := attachedNodes(e.image(t, vol)); !slices.Equal(got, []string{"node-a"}) {
		t.Fatalf("unpublishing other nodes changed the attachments: %v", got)
	}
	// Now the second node may have it.
	wantCode(t, e.ControllerUnpublish(vol, "node-a"), codes.OK)
	wantCode(t, e.ControllerUnpublish(vol, "node-a"), codes.OK)
	e.mustPublish(t, vol, "node-b", c, false)
	wantCode(t, e.ControllerUnpublish(vol, "node-b"), codes.OK)

	wantCode(t, e.DeleteVolume(vol), codes.OK)
	if _, err := os.Stat(imagePath); !os.IsNotExist(err) {
		t.Fatalf("image file after DeleteVolume: %v", err)
	}
	wantCode(t, e.DeleteVolume(vol), codes.OK)
	// A deleted volume is unpublished everywhere already.
	wantCode(t, e.ControllerUnpublish(vol, "node-a"), codes.OK)
	wantCode(t, e.ControllerUnpublish(vol, ""), codes.OK)
	_, err := e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: "node-a", VolumeCapability: c})
	wantCode(t, err, codes.NotFound)
}

func TestControllerPublishReadOnly(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.registerNodes(t, defaultKey, "node-a", "node-b", "node-c")
	tests := []struct {
		name     string
		c        *csi.VolumeCapability
		readonly bool
		want     string
	}{
		{"readonly flag", mountCap("ext4", snw), true, "true"},
		{"reader-only mode", mountCap("ext4", snro), false, "true"},
		{"multi-node reader-only block", blockCap(mnro), false, "true"},
		{"writer", blockCap(snmw), false, "false"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := createReq("pvc-ro-" + string(rune('a'+i)))
			req.VolumeCapabilities = []*csi.VolumeCapability{tt.c}
			vol := e.mustCreate(t, req)
			pc := e.mustPublish(t, vol, "node-a", tt.c, tt.readonly)
			if pc["readOnly"] != tt.want {
				t.Fatalf("publish_context.readOnly = %q, want %q", pc["readOnly"], tt.want)
			}
			img := e.image(t, vol)
			if got := img.Attachments[0].ReadOnly; got != (tt.want == "true") {
				t.Fatalf("attachment read-only = %t, want %s", got, tt.want)
			}
		})
	}
	// Multi-node reader-only: every node may read.
	req := createReq("pvc-mnro")
	req.VolumeCapabilities = []*csi.VolumeCapability{mountCap("ext4", mnro)}
	vol := e.mustCreate(t, req)
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		if pc := e.mustPublish(t, vol, n, mountCap("ext4", mnro), false); pc["readOnly"] != "true" {
			t.Fatalf("node %s: readOnly = %q", n, pc["readOnly"])
		}
	}
	// Without node_id, unpublish removes every attachment.
	wantCode(t, e.ControllerUnpublish(vol, ""), codes.OK)
	if got := e.image(t, vol).Attachments; len(got) != 0 {
		t.Fatalf("attachments after unpublishing all nodes: %+v", got)
	}
	wantCode(t, e.ControllerUnpublish(vol, ""), codes.OK)
	wantCode(t, e.DeleteVolume(vol), codes.OK)
}

func TestValidateVolumeCapabilities(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	mountVol := e.mustCreate(t, createReq("pvc-vvc-mount"))
	blockReq := createReq("pvc-vvc-block")
	blockReq.VolumeCapabilities = []*csi.VolumeCapability{blockCap(snw)}
	blockVol := e.mustCreate(t, blockReq)

	tests := []struct {
		name   string
		vol    string
		caps   []*csi.VolumeCapability
		params map[string]string
		// "" = confirmed; otherwise a substring of the message
		unconfirmed string
	}{
		{"matching mount", mountVol, []*csi.VolumeCapability{mountCap("ext4", snw)}, nil, ""},
		{"mount without fs type", mountVol, []*csi.VolumeCapability{mountCap("", snmw), mountCap("ext4", snro)}, nil, ""},
		{"mount with mount flags", mountVol, []*csi.VolumeCapability{mountCap("ext4", snw, "noatime")}, nil, ""},
		{"multi-node reader-only mount", mountVol, []*csi.VolumeCapability{mountCap("ext4", mnro)}, nil, ""},
		{"matching block", blockVol, []*csi.VolumeCapability{blockCap(snw), blockCap(mnro)}, nil, ""},
		{"matching with parameters", mountVol, []*csi.VolumeCapability{mountCap("ext4", snw)}, map[string]string{"backend": defaultKey}, ""},
		{"block on a mount volume", mountVol, []*csi.VolumeCapability{blockCap(snw)}, nil, "created for mount access, not block"},
		{"mount on a block volume", blockVol, []*csi.VolumeCapability{mountCap("ext4", snw)}, nil, "created for block access, not mount"},
		{"other fs type", mountVol, []*csi.VolumeCapability{mountCap("xfs", snw)}, nil, "holds ext4, not xfs"},
		{"one of two does not fit", mountVol, []*csi.VolumeCapability{mountCap("ext4", snw), mountCap("btrfs", snw)}, nil, "volume_capabilities[1]"},
		{"multi-node multi-writer mount", mountVol, []*csi.VolumeCapability{mountCap("ext4", mnmw)}, nil, "MULTI_NODE_MULTI_WRITER"},
		{"multi-node multi-writer block", blockVol, []*csi.VolumeCapability{blockCap(mnmw)}, nil, "MULTI_NODE_MULTI_WRITER"},
		{"unknown access mode", mountVol, []*csi.VolumeCapability{mountCap("ext4", csi.VolumeCapability_AccessMode_UNKNOWN)}, nil, "volume_capabilities[0].access_mode"},
		{"unknown fs type", mountVol, []*csi.VolumeCapability{mountCap("zfs", snw)}, nil, "zfs"},
		{"unknown parameter", mountVol, []*csi.VolumeCapability{mountCap("ext4", snw)}, map[string]string{"color": "blue"}, "unknown key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &csi.ValidateVolumeCapabilitiesRequest{
				VolumeId: tt.vol, VolumeCapabilities: tt.caps, Parameters: tt.params,
				VolumeContext: map[string]string{"mkfsOptions": "-L x"},
			}
			resp, err := e.ValidateVolumeCapabilities(req)
			if err != nil {
				t.Fatalf("ValidateVolumeCapabilities: %v", err)
			}
			if tt.unconfirmed == "" {
				conf := resp.GetConfirmed()
				if conf == nil {
					t.Fatalf("not confirmed: %q", resp.GetMessage())
				}
				want := &csi.ValidateVolumeCapabilitiesResponse_Confirmed{VolumeContext: req.VolumeContext, VolumeCapabilities: req.VolumeCapabilities, Parameters: req.Parameters}
				if !proto.Equal(conf, want) {
					t.Fatalf("confirmed %v, want %v", conf, want)
				}
				return
			}
			if resp.GetConfirmed() != nil {
				t.Fatalf("confirmed %v, want unconfirmed because %q", resp.GetConfirmed(), tt.unconfirmed)
			}
			if !strings.Contains(resp.GetMessage(), tt.unconfirmed) {
				t.Fatalf("message %q does not contain %q", resp.GetMessage(), tt.unconfirmed)
			}
		})
	}

	errTests := []struct {
		name string
		req  *csi.ValidateVolumeCapabilitiesRequest
		code codes.Code
		want string
	}{
		{"missing volume", &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "loop/default/pvc-missing", VolumeCapabilities: []*csi.VolumeCapability{mountCap("ext4", snw)}}, codes.NotFound, "pvc-missing"},
		{"no capabilities", &csi.ValidateVolumeCapabilitiesRequest{VolumeId: mountVol}, codes.InvalidArgument, "volume_capabilities is required"},
		{"unconfigured instance", &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "loop/other/x", VolumeCapabilities: []*csi.VolumeCapability{mountCap("ext4", snw)}}, codes.FailedPrecondition, "loop/other"},
	}
	for _, tt := range errTests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.ValidateVolumeCapabilities(tt.req)
			wantCode(t, err, tt.code, tt.want)
		})
	}
}

func TestControllerGetCapabilities(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	resp, err := call(e, "/csi.v1.Controller/ControllerGetCapabilities", e.cs.ControllerGetCapabilities, &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []csi.ControllerServiceCapability_RPC_Type
	for _, c := range resp.GetCapabilities() {
		got = append(got, c.GetRpc().GetType())
	}
	want := []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
		csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
		csi.ControllerServiceCapability_RPC_GET_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
		csi.ControllerServiceCapability_RPC_MODIFY_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("controller capabilities = %v, want exactly %v", got, want)
	}
	// Every RPC the matrix claims is served: an empty request gets an
	// answer about the request, never UNIMPLEMENTED.
	served := map[string]func() error{
		"ListVolumes": func() error {
			_, err := e.cs.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
			return err
		},
		"GetCapacity": func() error {
			_, err := e.cs.GetCapacity(context.Background(), &csi.GetCapacityRequest{})
			return err
		},
		"ControllerExpandVolume": func() error {
			_, err := e.cs.ControllerExpandVolume(context.Background(), &csi.ControllerExpandVolumeRequest{})
			return err
		},
		"CreateSnapshot": func() error {
			_, err := e.cs.CreateSnapshot(context.Background(), &csi.CreateSnapshotRequest{})
			return err
		},
		"ListSnapshots": func() error {
			_, err := e.cs.ListSnapshots(context.Background(), &csi.ListSnapshotsRequest{})
			return err
		},
		"ControllerGetVolume": func() error {
			_, err := e.cs.ControllerGetVolume(context.Background(), &csi.ControllerGetVolumeRequest{})
			return err
		},
		"ControllerModifyVolume": func() error {
			_, err := e.cs.ControllerModifyVolume(context.Background(), &csi.ControllerModifyVolumeRequest{})
			return err
		},
		"ControllerListVolumeHealth": func() error {
			_, err := e.cs.ControllerListVolumeHealth(context.Background(), &csi.ControllerListVolumeHealthRequest{})
			return err
		},
	}
	for name, f := range served {
		t.Run(name, func(t *testing.T) {
			if err := f(); status.Code(err) == codes.Unimplemented {
				t.Fatalf("%s is in the capability matrix but answers %v", name, err)
			}
		})
	}
}
