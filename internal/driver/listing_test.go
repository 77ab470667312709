package driver

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/controller"
)

func (e *testEnv) ListVolumes(req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	return call(e, "/csi.v1.Controller/ListVolumes", e.cs.ListVolumes, req)
}

func (e *testEnv) ListSnapshots(req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	return call(e, "/csi.v1.Controller/ListSnapshots", e.cs.ListSnapshots, req)
}

func (e *testEnv) CreateSnapshot(name, source string) (*csi.CreateSnapshotResponse, error) {
	return call(e, "/csi.v1.Controller/CreateSnapshot", e.cs.CreateSnapshot, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: source})
}

// Pages never return a volume twice and never skip one that existed all
// along, even when volumes come and go between the pages.
func TestListVolumesPagination(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	var all []string
	for _, name := range []string{"pvc-a", "pvc-b", "pvc-c", "pvc-d"} {
		all = append(all, e.mustCreate(t, createReq(name)))
	}
	fast := createReq("pvc-e")
	fast.Parameters = map[string]string{backend.ParamBackend: fastKey}
	all = append(all, e.mustCreate(t, fast))

	first, err := e.ListVolumes(&csi.ListVolumesRequest{MaxEntries: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.GetEntries()) != 2 || first.GetNextToken() == "" {
		t.Fatalf("first page = %d entries, token %q; want 2 and a token", len(first.GetEntries()), first.GetNextToken())
	}
	seen := map[string]int{}
	for _, en := range first.GetEntries() {
		seen[en.GetVolume().GetVolumeId()]++
	}
	// The last volume of the page goes away and a new one appears before
	// the position: the next page still starts right after the deleted one.
	last := first.GetEntries()[1].GetVolume().GetVolumeId()
	wantCode(t, e.DeleteVolume(last), codes.OK)
	e.mustCreate(t, createReq("pvc-0-new"))

	token := first.GetNextToken()
	for token != "" {
		page, err := e.ListVolumes(&csi.ListVolumesRequest{MaxEntries: 2, StartingToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, en := range page.GetEntries() {
			seen[en.GetVolume().GetVolumeId()]++
		}
		token = page.GetNextToken()
	}
	for _, id := range all {
		if seen[id] != 1 {
			t.Errorf("volume %s listed %d times, want once", id, seen[id])
		}
	}
	if seen[defaultKey+"/pvc-0-new"] != 0 {
		t.Error("a volume created before the resume position was listed on a later page")
	}

	for _, tc := range []struct {
		name  string
		req   *csi.ListVolumesRequest
		code  codes.Code
		words []string
	}{
		{"token not from this driver", &csi.ListVolumesRequest{StartingToken: "invalid-token"}, codes.Aborted, []string{"invalid-token", "from the start"}},
		{"token of an instance no longer configured", &csi.ListVolumesRequest{StartingToken: encodePageToken("loop/gone/pvc-a")}, codes.Aborted, []string{"loop/gone"}},
		{"negative max_entries", &csi.ListVolumesRequest{MaxEntries: -1}, codes.InvalidArgument, []string{"max_entries"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.ListVolumes(tc.req)
			wantCode(t, err, tc.code, tc.words...)
		})
	}
}

// ListVolumes and ControllerGetVolume show who a volume is published to, so
// the external-attacher can reconcile VolumeAttachments with the backend.
func TestPublishedNodesAreListed(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.registerNodes(t, defaultKey, testNodeID)
	vol := e.mustCreate(t, createReq("pvc-pub"))
	e.mustPublish(t, vol, testNodeID, mountCap("ext4", snw), false)

	list, err := e.ListVolumes(&csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetEntries()) != 1 || !slices.Equal(list.GetEntries()[0].GetStatus().GetPublishedNodeIds(), []string{testNodeID}) {
		t.Fatalf("ListVolumes = %v, want %s published to %s", list.GetEntries(), vol, testNodeID)
	}
	got, err := call(e, "/csi.v1.Controller/ControllerGetVolume", e.cs.ControllerGetVolume, &csi.ControllerGetVolumeRequest{VolumeId: vol})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetVolume().GetCapacityBytes() != 10*mib || !slices.Equal(got.GetStatus().GetPublishedNodeIds(), []string{testNodeID}) {
		t.Fatalf("ControllerGetVolume = %v", got)
	}
	wantCode(t, e.ControllerUnpublish(vol, testNodeID), codes.OK)
	got, _ = call(e, "/csi.v1.Controller/ControllerGetVolume", e.cs.ControllerGetVolume, &csi.ControllerGetVolumeRequest{VolumeId: vol})
	if len(got.GetStatus().GetPublishedNodeIds()) != 0 {
		t.Fatalf("published to %v after unpublish", got.GetStatus().GetPublishedNodeIds())
	}
	_, err = call(e, "/csi.v1.Controller/ControllerGetVolume", e.cs.ControllerGetVolume, &csi.ControllerGetVolumeRequest{VolumeId: defaultKey + "/pvc-none"})
	wantCode(t, err, codes.NotFound, "pvc-none")
}

// A node-local instance provisions on this node only: a request that rules
// this node out is RESOURCE_EXHAUSTED, capacity elsewhere is zero, and the
// volume says where it can be used. A shared instance takes any request.
func TestTopology(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.d.instances[defaultKey].NodeLocal = true
	here := &csi.Topology{Segments: map[string]string{controller.TopologyKey: testNodeID}}
	there := &csi.Topology{Segments: map[string]string{controller.TopologyKey: "node-b"}}
	zoned := &csi.Topology{Segments: map[string]string{controller.TopologyKey: testNodeID, "zone": "z1"}}

	info, err := call(e, "/csi.v1.Node/NodeGetInfo", e.ns.NodeGetInfo, &csi.NodeGetInfoRequest{})
	if err != nil || info.GetAccessibleTopology().GetSegments()[controller.TopologyKey] != testNodeID {
		t.Fatalf("NodeGetInfo = %v, %v; want this node's segment", info, err)
	}
	for _, tc := range []struct {
		name string
		req  *csi.TopologyRequirement
		code codes.Code
	}{
		{"no requirement", nil, codes.OK},
		{"this node requisite", &csi.TopologyRequirement{Requisite: []*csi.Topology{there, here}}, codes.OK},
		{"this node preferred only", &csi.TopologyRequirement{Preferred: []*csi.Topology{here}}, codes.OK},
		{"another node", &csi.TopologyRequirement{Requisite: []*csi.Topology{there}}, codes.ResourceExhausted},
		{"a segment Spindle cannot check", &csi.TopologyRequirement{Requisite: []*csi.Topology{zoned}}, codes.ResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := createReq("pvc-topo-" + strings.ReplaceAll(tc.name, " ", "-"))
			req.AccessibilityRequirements = tc.req
			resp, err := e.CreateVolume(req)
			wantCode(t, err, tc.code)
			if err == nil && !slices.EqualFunc(resp.GetVolume().GetAccessibleTopology(), []*csi.Topology{here}, func(a, b *csi.Topology) bool {
				return a.GetSegments()[controller.TopologyKey] == b.GetSegments()[controller.TopologyKey] && len(a.GetSegments()) == 1
			}) {
				t.Errorf("accessible_topology = %v, want this node", resp.GetVolume().GetAccessibleTopology())
			}
		})
	}
	// The shared instance ignores topology and reports none.
	shared := createReq("pvc-shared")
	shared.Parameters = map[string]string{backend.ParamBackend: fastKey}
	shared.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{there}}
	resp, err := e.CreateVolume(shared)
	if err != nil || resp.GetVolume().GetAccessibleTopology() != nil {
		t.Fatalf("shared instance: %v, %v", resp, err)
	}

	capacity := func(topology *csi.Topology, params map[string]string) int64 {
		t.Helper()
		resp, err := call(e, "/csi.v1.Controller/GetCapacity", e.cs.GetCapacity, &csi.GetCapacityRequest{AccessibleTopology: topology, Parameters: params})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAvailableCapacity()
	}
	if capacity(here, nil) <= 0 {
		t.Error("no capacity reported for this node")
	}
	if capacity(there, nil) != 0 {
		t.Error("a node-local pool reported capacity on another node")
	}
	if capacity(there, map[string]string{backend.ParamBackend: fastKey}) <= 0 {
		t.Error("the shared pool reported no capacity for another node")
	}
}

func TestGetCapacity(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	resp, err := call(e, "/csi.v1.Controller/GetCapacity", e.cs.GetCapacity, &csi.GetCapacityRequest{
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("xfs", snw)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetAvailableCapacity() <= 0 || resp.GetAvailableCapacity()%mib != 0 {
		t.Errorf("available capacity %d: want a positive whole number of MiB", resp.GetAvailableCapacity())
	}
	if resp.GetMaximumVolumeSize().GetValue() <= 0 || resp.GetMinimumVolumeSize().GetValue() != 300*mib {
		t.Errorf("maximum %v, minimum %v; want a maximum and the xfs minimum of 300 MiB", resp.GetMaximumVolumeSize(), resp.GetMinimumVolumeSize())
	}
	// Capacity for what the backend cannot serve is zero, not an error.
	resp, err = call(e, "/csi.v1.Controller/GetCapacity", e.cs.GetCapacity, &csi.GetCapacityRequest{
		VolumeCapabilities: []*csi.VolumeCapability{blockCap(mnmw)},
	})
	if err != nil || resp.GetAvailableCapacity() != 0 {
		t.Errorf("capacity for MULTI_NODE_MULTI_WRITER on loop = %v, %v; want 0", resp, err)
	}
	_, err = call(e, "/csi.v1.Controller/GetCapacity", e.cs.GetCapacity, &csi.GetCapacityRequest{Parameters: map[string]string{"colour": "blue"}})
	wantCode(t, err, codes.InvalidArgument, "colour")
}

func TestSnapshots(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	a, b := e.mustCreate(t, createReq("pvc-a")), e.mustCreate(t, createReq("pvc-b"))

	snapA, err := e.CreateSnapshot("snapshot-a1", a)
	if err != nil {
		t.Fatal(err)
	}
	s := snapA.GetSnapshot()
	if !strings.HasPrefix(s.GetSnapshotId(), defaultKey+"/") || s.GetSourceVolumeId() != a || s.GetSizeBytes() != 10*mib || !s.GetReadyToUse() || s.GetCreationTime() == nil {
		t.Fatalf("CreateSnapshot = %v", s)
	}
	again, err := e.CreateSnapshot("snapshot-a1", a)
	if err != nil || again.GetSnapshot().GetSnapshotId() != s.GetSnapshotId() {
		t.Fatalf("repeated CreateSnapshot = %v, %v; want the same snapshot", again, err)
	}
	_, err = e.CreateSnapshot("snapshot-a1", b)
	wantCode(t, err, codes.AlreadyExists, "snapshot-a1")
	_, err = e.CreateSnapshot("snapshot-x", defaultKey+"/pvc-none")
	wantCode(t, err, codes.NotFound, "pvc-none")
	if _, err := e.CreateSnapshot("snapshot-a2", a); err != nil {
		t.Fatal(err)
	}
	if _, err := e.CreateSnapshot("snapshot-b1", b); err != nil {
		t.Fatal(err)
	}

	ids := func(req *csi.ListSnapshotsRequest) []string {
		t.Helper()
		resp, err := e.ListSnapshots(req)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, en := range resp.GetEntries() {
			out = append(out, strings.TrimPrefix(en.GetSnapshot().GetSnapshotId(), defaultKey+"/"))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		req  *csi.ListSnapshotsRequest
		want []string
	}{
		{"all", &csi.ListSnapshotsRequest{}, []string{"snapshot-a1", "snapshot-a2", "snapshot-b1"}},
		{"of one volume", &csi.ListSnapshotsRequest{SourceVolumeId: a}, []string{"snapshot-a1", "snapshot-a2"}},
		{"one snapshot", &csi.ListSnapshotsRequest{SnapshotId: s.GetSnapshotId()}, []string{"snapshot-a1"}},
		{"unknown snapshot: empty, not an error", &csi.ListSnapshotsRequest{SnapshotId: defaultKey + "/snapshot-none"}, nil},
		{"unknown volume: empty", &csi.ListSnapshotsRequest{SourceVolumeId: "loop/other/pvc-a"}, nil},
		{"a page", &csi.ListSnapshotsRequest{MaxEntries: 2}, []string{"snapshot-a1", "snapshot-a2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ids(tc.req); !slices.Equal(got, tc.want) {
				t.Fatalf("ListSnapshots = %v, want %v", got, tc.want)
			}
		})
	}

	// A volume restored from the snapshot: the source's size by default,
	// and the content source echoed back.
	restore := &csi.CreateVolumeRequest{
		Name:                "pvc-restored",
		VolumeCapabilities:  []*csi.VolumeCapability{mountCap("", snw)},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: s.GetSnapshotId()}}},
	}
	resp, err := e.CreateVolume(restore)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetVolume().GetCapacityBytes() != 10*mib || resp.GetVolume().GetContentSource().GetSnapshot().GetSnapshotId() != s.GetSnapshotId() {
		t.Fatalf("restored volume = %v", resp.GetVolume())
	}
	if img := e.image(t, resp.GetVolume().GetVolumeId()); img.FsType != "ext4" {
		t.Fatalf("restored volume holds %q, want the source's ext4", img.FsType)
	}
	restore.Name = "pvc-too-small"
	restore.CapacityRange = &csi.CapacityRange{RequiredBytes: 5 * mib, LimitBytes: 5 * mib}
	_, err = e.CreateVolume(restore)
	wantCode(t, err, codes.OutOfRange, "source")

	_, err = call(e, "/csi.v1.Controller/GetSnapshot", e.cs.GetSnapshot, &csi.GetSnapshotRequest{SnapshotId: defaultKey + "/snapshot-none"})
	wantCode(t, err, codes.NotFound)
	for _, id := range []string{s.GetSnapshotId(), s.GetSnapshotId(), "not-a-snapshot-id"} {
		_, err := call(e, "/csi.v1.Controller/DeleteSnapshot", e.cs.DeleteSnapshot, &csi.DeleteSnapshotRequest{SnapshotId: id})
		wantCode(t, err, codes.OK)
	}
	if got := ids(&csi.ListSnapshotsRequest{SourceVolumeId: a}); !slices.Equal(got, []string{"snapshot-a2"}) {
		t.Fatalf("after delete: %v", got)
	}
}

// ControllerModifyVolume: the backend decides which mutable parameters it
// understands, and a change reaches the node's next attach.
func TestModifyVolume(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.registerNodes(t, defaultKey, testNodeID)
	vol := e.mustCreate(t, createReq("pvc-mod"))
	modify := func(id string, params map[string]string) error {
		_, err := call(e, "/csi.v1.Controller/ControllerModifyVolume", e.cs.ControllerModifyVolume, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: params})
		return err
	}
	wantCode(t, modify("", map[string]string{"directIO": "false"}), codes.InvalidArgument, "volume_id")
	wantCode(t, modify("non-existing-volume-id", map[string]string{"directIO": "false"}), codes.NotFound)
	wantCode(t, modify(defaultKey+"/pvc-none", map[string]string{"directIO": "false"}), codes.NotFound)
	wantCode(t, modify(vol, nil), codes.OK) // nothing to change
	wantCode(t, modify(vol, map[string]string{"XXX_FakeKey": "x"}), codes.InvalidArgument, "XXX_FakeKey")
	wantCode(t, modify(vol, map[string]string{"directIO": "sometimes"}), codes.InvalidArgument, "sometimes")
	wantCode(t, modify(vol, map[string]string{"directIO": "false"}), codes.OK)
	if got := e.image(t, vol).MutableParameters["directIO"]; got != "false" {
		t.Fatalf("directIO = %q after modify", got)
	}
	pc := e.mustPublish(t, vol, testNodeID, mountCap("ext4", snw), false)
	if _, err := e.d.instances[defaultKey].Attacher.Attach(context.Background(), backend.AttachRequest{ImageID: e.image(t, vol).ID, NodeID: testNodeID, PublishContext: pc}); err != nil {
		t.Fatal(err)
	}
	if calls := e.loops[defaultKey].Calls; len(calls) != 1 || !strings.Contains(calls[0], "direct-io=off") {
		t.Fatalf("attach after modify: %v, want direct I/O off", calls)
	}
}

func TestControllerExpandVolume(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	vol := e.mustCreate(t, createReq("pvc-grow"))
	expand := func(id string, r *csi.CapacityRange) (*csi.ControllerExpandVolumeResponse, error) {
		return call(e, "/csi.v1.Controller/ControllerExpandVolume", e.cs.ControllerExpandVolume, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: r})
	}
	resp, err := expand(vol, &csi.CapacityRange{RequiredBytes: 20*mib + 1})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetCapacityBytes() != 21*mib || !resp.GetNodeExpansionRequired() {
		t.Fatalf("expand = %v; want 21 MiB (rounded up) and node expansion", resp)
	}
	if e.image(t, vol).CapacityBytes != 21*mib {
		t.Fatal("the image did not grow")
	}
	_, err = expand(vol, &csi.CapacityRange{RequiredBytes: 10 * mib})
	wantCode(t, err, codes.OutOfRange, "shrink")
	_, err = expand(vol, nil)
	wantCode(t, err, codes.InvalidArgument, "capacity_range")
	_, err = expand(defaultKey+"/pvc-none", &csi.CapacityRange{RequiredBytes: 30 * mib})
	wantCode(t, err, codes.NotFound)
}
