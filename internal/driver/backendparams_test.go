package driver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/filestore"
	"github.com/spindle-csi/spindle/internal/config"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/opsapi"
)

// cephLike is loop/fast's store standing in for a backend that takes
// StorageClass parameters of its own (as rbd takes ceph-csi's): it claims
// clusterID "rook-ceph", takes clusterID and pool, serves pre-provisioned
// volumes (an image of its pool named by its handle) and adopts its
// pool's images.
type cephLike struct {
	*filestore.Store
	static backend.Attacher
	openBy []string // the clients that have every image open
}

func (cephLike) Claims(p map[string]string) bool { return p["clusterID"] == "rook-ceph" }

func (cephLike) CheckVolumeParameters(p map[string]string) error {
	for k, v := range p {
		switch {
		case k == "clusterID" || k == "pool":
		case k == "thickProvision" && v == "true":
			return errdefs.InvalidArgument("parameters.thickProvision %q is refused: the backend's images are thin", v)
		default:
			return errdefs.InvalidArgument("parameters: unknown key %q", k)
		}
	}
	return nil
}

func (cephLike) CheckSnapshotParameters(_ string, p map[string]string) error {
	for k := range p {
		if k != "clusterID" {
			return errdefs.InvalidArgument("parameters: unknown key %q", k)
		}
	}
	return nil
}

func (cephLike) StaticImage(handle string, attrs map[string]string) (string, error) {
	if attrs["pool"] == "" {
		return "", errdefs.InvalidArgument("volumeAttributes.pool is required")
	}
	if v := attrs["imageName"]; v != "" {
		return v, nil
	}
	return handle, nil
}

func (cephLike) StaticPublishContext(imageID string, _ map[string]string) (map[string]string, error) {
	return map[string]string{"image": imageID}, nil
}

func (c cephLike) StaticAttacher() backend.Attacher { return c.static }

func (c cephLike) Adopt(ctx context.Context, spec backend.AdoptSpec) (*backend.Adopted, error) {
	img, err := c.Get(ctx, spec.ImageID)
	if err != nil {
		return nil, err
	}
	img.Parameters = spec.Parameters
	if len(c.openBy) > 0 {
		if !spec.DryRun {
			return nil, errdefs.Precondition("adopt %s: the image is still open by %v", spec.ImageID, c.openBy)
		}
		return &backend.Adopted{Image: img, OpenBy: c.openBy}, nil
	}
	return &backend.Adopted{Image: img}, nil
}

// withCephLike makes loop/fast a cephLike backend and returns its store.
func withCephLike(t *testing.T, e *testEnv) *filestore.Store {
	t.Helper()
	inst := e.d.instances[fastKey]
	ta := reflect.ValueOf(inst.Attacher).FieldByName("TransportAttacher").Interface().(*backend.TransportAttacher)
	static := *ta
	static.NoGrants = true
	inst.Store = cephLike{Store: e.pools[fastKey], static: &static}
	return e.pools[fastKey]
}

// A StorageClass that names no backend goes to the instance that claims
// its clusterID; the keys the driver does not take go to that backend,
// which refuses what it does not take, naming the key; they are kept with
// the volume and returned as its context. csi.storage.k8s.io/fstype, when
// it reaches CreateVolume, means what the sidecar makes of it.
func TestBackendParameters(t *testing.T) {
	e := newTestEnv(t)
	withCephLike(t, e)
	rook := map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "csi.storage.k8s.io/fstype": "xfs",
		"csi.storage.k8s.io/provisioner-secret-name": "rook-csi-rbd-provisioner", "mkfsOptions": "-K"}
	req := createReq("pvc-rook")
	req.Parameters = rook
	req.VolumeCapabilities = []*csi.VolumeCapability{mountCap("", snw)}
	resp, err := e.CreateVolume(req)
	if err != nil {
		t.Fatalf("CreateVolume with Rook's parameters: %v", err)
	}
	v := resp.GetVolume()
	if !strings.HasPrefix(v.GetVolumeId(), fastKey+"/") {
		t.Fatalf("volume %s did not go to the backend that claims clusterID rook-ceph (%s)", v.GetVolumeId(), fastKey)
	}
	if ctx := v.GetVolumeContext(); ctx["clusterID"] != "rook-ceph" || ctx["pool"] != "replicapool" || ctx["mkfsOptions"] != "-K" || ctx["csi.storage.k8s.io/fstype"] != "" {
		t.Fatalf("volume context %v: want the backend's and the driver's shaping parameters, not the sidecar's", ctx)
	}
	if img := e.image(t, v.GetVolumeId()); img.FsType != "xfs" {
		t.Fatalf("fs type %q: want xfs from csi.storage.k8s.io/fstype", img.FsType)
	}

	tests := []struct {
		name   string
		params map[string]string
		caps   []*csi.VolumeCapability
		want   []string
	}{
		{"a key the backend does not take", map[string]string{"clusterID": "rook-ceph", "color": "blue"}, nil, []string{"backend " + fastKey, `unknown key "color"`}},
		{"refused by the backend", map[string]string{"clusterID": "rook-ceph", "thickProvision": "true"}, nil, []string{"parameters.thickProvision", "refused"}},
		{"encrypted is the driver's, whatever the backend", map[string]string{"clusterID": "rook-ceph", "encrypted": "yes"}, nil, []string{`parameters.encrypted "yes" is not a boolean`}},
		{"a backend key on a backend without parameters", map[string]string{"pool": "x"}, nil, []string{`unknown key "pool"`, defaultKey + " takes no parameters"}},
		{"fstype disagrees with the capability", map[string]string{"csi.storage.k8s.io/fstype": "xfs"}, []*csi.VolumeCapability{mountCap("ext4", snw)}, []string{"fs_type", "csi.storage.k8s.io/fstype", "disagree"}},
		{"fstype unknown", map[string]string{"csi.storage.k8s.io/fstype": "zfs"}, nil, []string{"parameters.csi.storage.k8s.io/fstype", "zfs"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := createReq("pvc-" + strings.ReplaceAll(tt.name, " ", "-"))
			r.Parameters = tt.params
			if tt.caps != nil {
				r.VolumeCapabilities = tt.caps
			}
			_, err := e.CreateVolume(r)
			wantCode(t, err, codes.InvalidArgument, tt.want...)
		})
	}
	// ceph-csi's encrypted and encryptionKMSID are the driver's: the
	// store that takes the class's other keys never sees them (cephLike
	// refuses any key it does not know), the volume is encrypted by the
	// driver and keeps both in its context.
	encReq := encryptedCreateReq("pvc-rook-encrypted", map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "encrypted": "true", "encryptionKMSID": "secrets"})
	encResp, err := e.CreateVolume(encReq)
	if err != nil {
		t.Fatalf("CreateVolume with Rook's parameters and encrypted \"true\": %v", err)
	}
	ev := encResp.GetVolume()
	if !strings.HasPrefix(ev.GetVolumeId(), fastKey+"/") {
		t.Fatalf("encrypted volume %s did not go to the backend that claims clusterID rook-ceph", ev.GetVolumeId())
	}
	if ctx := ev.GetVolumeContext(); ctx["encrypted"] != "true" || ctx["encryptionKMSID"] != "secrets" || ctx["clusterID"] != "rook-ceph" {
		t.Fatalf("volume context %v: want the driver's encryption keys beside the backend's", ctx)
	}
	if img := e.image(t, ev.GetVolumeId()); img.Encryption == nil || img.Encryption.KMSID != "secrets" {
		t.Fatalf("image encryption %+v: the driver did not wrap a key for it", img.Encryption)
	}
	// A VolumeSnapshotClass's parameters go to the source's backend.
	snapReq := &csi.CreateSnapshotRequest{Name: "snap-rook", SourceVolumeId: v.GetVolumeId(), Parameters: map[string]string{"clusterID": "rook-ceph", "csi.storage.k8s.io/snapshotter-secret-name": "x"}}
	if _, err := call(e, "/csi.v1.Controller/CreateSnapshot", e.cs.CreateSnapshot, snapReq); err != nil {
		t.Fatalf("CreateSnapshot with Rook's VolumeSnapshotClass: %v", err)
	}
	snapReq = &csi.CreateSnapshotRequest{Name: "snap-bad", SourceVolumeId: v.GetVolumeId(), Parameters: map[string]string{"snapshotNamePrefix": "x-"}}
	_, err = call(e, "/csi.v1.Controller/CreateSnapshot", e.cs.CreateSnapshot, snapReq)
	wantCode(t, err, codes.InvalidArgument, `unknown key "snapshotNamePrefix"`)
	// A source on a backend that takes no snapshot parameters.
	plain := e.mustCreate(t, createReq("pvc-plain"))
	_, err = call(e, "/csi.v1.Controller/CreateSnapshot", e.cs.CreateSnapshot, &csi.CreateSnapshotRequest{Name: "snap-plain", SourceVolumeId: plain, Parameters: map[string]string{"clusterID": "rook-ceph"}})
	wantCode(t, err, codes.InvalidArgument, `unknown key "clusterID"`, defaultKey)
}

// A pre-provisioned volume in ceph-csi's static form: its handle is no
// Spindle ID; ControllerPublish finds the backend by its attributes and
// grants nothing; NodeStage records the handle's image beside the socket,
// and the RPCs that carry only the handle (unpublish, unstage) find it
// there; the unstage forgets it; DeleteVolume deletes nothing.
func TestStaticVolume(t *testing.T) {
	e := newTestEnv(t)
	pool := withCephLike(t, e)
	img, err := pool.Create(context.Background(), backend.VolumeSpec{Name: "made-elsewhere", CapacityBytes: 8 * mib, AccessType: backend.AccessBlock})
	if err != nil {
		t.Fatal(err)
	}
	handle := img.ID // ceph-csi's static form: the handle is the image's name
	attrs := map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "staticVolume": "true", "imageFeatures": "layering"}
	resp, err := e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: handle, NodeId: testNodeID, VolumeCapability: blockCap(snw), VolumeContext: attrs})
	if err != nil {
		t.Fatalf("ControllerPublish of a static volume: %v", err)
	}
	if resp.GetPublishContext()["image"] != handle {
		t.Fatalf("publish_context %v", resp.GetPublishContext())
	}
	if got := e.image(t, fastKey+"/"+img.ID); len(got.Attachments) != 0 {
		t.Fatalf("a static volume's publish recorded %v", got.Attachments)
	}
	_, err = e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: handle, NodeId: testNodeID, VolumeCapability: blockCap(snw), VolumeContext: map[string]string{"clusterID": "elsewhere", "staticVolume": "true"}})
	wantCode(t, err, codes.NotFound, "no configured backend serves a pre-provisioned volume")
	_, err = e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: handle, NodeId: testNodeID, VolumeCapability: blockCap(snw), VolumeContext: map[string]string{"clusterID": "rook-ceph", "staticVolume": "true"}})
	wantCode(t, err, codes.InvalidArgument, "volumeAttributes.pool is required")

	// A pre-provisioned image that says it is encrypted has no key of
	// Spindle's: refused for what it is, on the controller and the node,
	// with nothing attached or recorded.
	for _, v := range []string{"true", "encrypted"} {
		encAttrs := map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "staticVolume": "true", "encrypted": v, "encryptionKMSID": "vault"}
		_, err = e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: handle, NodeId: testNodeID, VolumeCapability: blockCap(snw), VolumeContext: encAttrs})
		wantCode(t, err, codes.InvalidArgument, `encrypted "`+v+`"`, "opens only the encrypted volumes it created")
		err = e.NodeStage(&csi.NodeStageVolumeRequest{VolumeId: handle, StagingTargetPath: filepath.Join(t.TempDir(), "enc"), VolumeCapability: blockCap(snw), PublishContext: resp.GetPublishContext(), VolumeContext: encAttrs})
		wantCode(t, err, codes.InvalidArgument, `encrypted "`+v+`"`, "opens only the encrypted volumes it created")
		if devs, _ := e.loops[fastKey].BoundTo(context.Background(), pool.ImagePath(img.ID)); len(devs) != 0 {
			t.Fatalf("a refused stage attached %v", devs)
		}
		if rec, err := e.d.node.StaticVolume(handle); rec != nil || err != nil {
			t.Fatalf("a refused stage recorded %+v, %v", rec, err)
		}
	}
	// encrypted "false" is what a plain image is.
	plainAttrs := map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "staticVolume": "true", "encrypted": "false"}
	if _, err := e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: handle, NodeId: testNodeID, VolumeCapability: blockCap(snw), VolumeContext: plainAttrs}); err != nil {
		t.Fatalf("ControllerPublish of a static volume with encrypted \"false\": %v", err)
	}

	stage := filepath.Join(t.TempDir(), "staging", "pv", "pv-static")
	target := filepath.Join(t.TempDir(), "pods", "p1", "pv-static")
	if err := e.NodeStage(&csi.NodeStageVolumeRequest{VolumeId: handle, StagingTargetPath: stage, VolumeCapability: blockCap(snw), PublishContext: resp.GetPublishContext(), VolumeContext: attrs}); err != nil {
		t.Fatalf("NodeStage of a static volume: %v", err)
	}
	if rec, err := e.d.node.StaticVolume(handle); err != nil || rec == nil || rec.Image != img.ID || rec.Backend != fastKey {
		t.Fatalf("static record = %+v, %v", rec, err)
	}
	if err := e.NodePublish(&csi.NodePublishVolumeRequest{VolumeId: handle, StagingTargetPath: stage, TargetPath: target, VolumeCapability: blockCap(snw), PublishContext: resp.GetPublishContext(), VolumeContext: attrs}); err != nil {
		t.Fatalf("NodePublish of a static volume: %v", err)
	}
	if err := e.NodeUnpublish(&csi.NodeUnpublishVolumeRequest{VolumeId: handle, TargetPath: target}); err != nil {
		t.Fatalf("NodeUnpublish of a static volume (its handle only): %v", err)
	}
	if err := e.NodeUnstage(&csi.NodeUnstageVolumeRequest{VolumeId: handle, StagingTargetPath: stage}); err != nil {
		t.Fatalf("NodeUnstage of a static volume (its handle only): %v", err)
	}
	if devs, _ := e.loops[fastKey].BoundTo(context.Background(), pool.ImagePath(img.ID)); len(devs) != 0 {
		t.Fatalf("devices left after the unstage: %v", devs)
	}
	if rec, err := e.d.node.StaticVolume(handle); rec != nil || err != nil {
		t.Fatalf("the record outlived the unstage: %+v, %v", rec, err)
	}
	// Without the record, the handle names nothing the node knows.
	err = e.NodeUnstage(&csi.NodeUnstageVolumeRequest{VolumeId: handle, StagingTargetPath: stage})
	wantCode(t, err, codes.NotFound, "names no Spindle volume")
	if err := e.DeleteVolume(handle); err != nil {
		t.Fatalf("DeleteVolume of a static handle: %v", err)
	}
	if _, err := pool.Get(context.Background(), img.ID); err != nil {
		t.Fatalf("the static volume's image is gone: %v", err)
	}
	if dir := e.d.opts.StaticRecordsDir(); !e.host.Exists(dir) {
		t.Fatalf("no static records directory %s on the node's host", dir)
	}
}

// A node plugin upgraded while a pre-provisioned volume is staged finds the
// record the older plugin wrote, where and as it wrote it (beside the
// socket, a file named by the handle's hash): the handle-only RPCs resolve
// it, and the unstage removes it.
func TestStaticVolumeStagedByAnOlderPlugin(t *testing.T) {
	e := newTestEnv(t)
	pool := withCephLike(t, e)
	img, err := pool.Create(context.Background(), backend.VolumeSpec{Name: "made-elsewhere", CapacityBytes: 8 * mib, AccessType: backend.AccessBlock})
	if err != nil {
		t.Fatal(err)
	}
	handle := img.ID
	attrs := map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "staticVolume": "true"}
	resp, err := e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: handle, NodeId: testNodeID, VolumeCapability: blockCap(snw), VolumeContext: attrs})
	if err != nil {
		t.Fatal(err)
	}
	stage := filepath.Join(t.TempDir(), "staging", "pv", "pv-static")
	if err := e.NodeStage(&csi.NodeStageVolumeRequest{VolumeId: handle, StagingTargetPath: stage, VolumeCapability: blockCap(snw), PublishContext: resp.GetPublishContext(), VolumeContext: attrs}); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "pods", "p1", "pv-static")
	if err := e.NodePublish(&csi.NodePublishVolumeRequest{VolumeId: handle, StagingTargetPath: stage, TargetPath: target, VolumeCapability: blockCap(snw), PublishContext: resp.GetPublishContext(), VolumeContext: attrs}); err != nil {
		t.Fatal(err)
	}
	// What the older plugin wrote instead of this one's record: the path
	// and the bytes of its static.go.
	socket, err := config.SocketPath(e.d.opts.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(handle))
	old := filepath.Join(filepath.Dir(socket), "static-volumes", hex.EncodeToString(sum[:16])+".json")
	if !e.host.Exists(old) {
		t.Fatalf("the record is not where older plugins wrote it, %s", old)
	}
	if err := e.d.node.ForgetStatic(handle); err != nil {
		t.Fatal(err)
	}
	e.host.WriteEntry(old, 0, []byte(`{"handle":"`+handle+`","backend":"`+fastKey+`","image":"`+img.ID+`"}`))

	stats, err := e.NodeGetVolumeStats(&csi.NodeGetVolumeStatsRequest{VolumeId: handle, VolumePath: target})
	if err != nil || len(stats.GetUsage()) == 0 || stats.GetUsage()[0].GetTotal() != 8*mib {
		t.Fatalf("NodeGetVolumeStats of the handle after the upgrade = %v, %v", stats, err)
	}
	if err := e.NodeUnpublish(&csi.NodeUnpublishVolumeRequest{VolumeId: handle, TargetPath: target}); err != nil {
		t.Fatalf("NodeUnpublish after the upgrade: %v", err)
	}
	if err := e.NodeUnstage(&csi.NodeUnstageVolumeRequest{VolumeId: handle, StagingTargetPath: stage}); err != nil {
		t.Fatalf("NodeUnstage after the upgrade: %v", err)
	}
	if devs, _ := e.loops[fastKey].BoundTo(context.Background(), pool.ImagePath(img.ID)); len(devs) != 0 {
		t.Fatalf("devices left after the unstage: %v", devs)
	}
	if e.host.Exists(old) {
		t.Fatal("the older plugin's record outlived the unstage")
	}
}

// The adopt endpoint: the image named by the old PV's handle and
// attributes becomes a volume under the new StorageClass's parameters,
// answered as CreateVolume would describe it; bad requests and the
// backend's refusals get their HTTP status.
func TestAdoptEndpoint(t *testing.T) {
	e := newTestEnv(t)
	pool := withCephLike(t, e)
	img, err := pool.Create(context.Background(), backend.VolumeSpec{Name: "from-ceph-csi", CapacityBytes: 8 * mib, AccessType: backend.AccessMount, FsType: "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e.d.OpsHandler())
	defer srv.Close()
	post := func(req opsapi.AdoptRequest) (int, []byte) {
		b, _ := json.Marshal(req)
		resp, err := http.Post(srv.URL+opsapi.PathAdopt, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out bytes.Buffer
		_, _ = out.ReadFrom(resp.Body)
		return resp.StatusCode, out.Bytes()
	}
	attrs := map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "imageName": img.ID}
	good := opsapi.AdoptRequest{Handle: "0001-0009-rook-ceph-0000000000000002-x", Attributes: attrs, Name: "pvc-adopted", AccessType: "mount", FsType: "ext4",
		Parameters: map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "csi.storage.k8s.io/fstype": "ext4"}, Secrets: map[string]string{"userID": "u", "userKey": "k"}, DryRun: true}
	code, body := post(good)
	var out opsapi.AdoptedVolume
	if code != http.StatusOK || json.Unmarshal(body, &out) != nil || out.VolumeID != fastKey+"/"+img.ID || !out.DryRun || out.VolumeContext["pool"] != "replicapool" {
		t.Fatalf("adopt = %d %s", code, body)
	}
	for _, tt := range []struct {
		change func(r *opsapi.AdoptRequest)
		status int
		want   string
	}{
		{func(r *opsapi.AdoptRequest) { r.Name = "" }, http.StatusBadRequest, "name is required"},
		{func(r *opsapi.AdoptRequest) { r.AccessType = "fuse" }, http.StatusBadRequest, "accessType"},
		{func(r *opsapi.AdoptRequest) { r.Secrets = nil }, http.StatusBadRequest, "secrets are required"},
		{func(r *opsapi.AdoptRequest) { r.Attributes = map[string]string{"clusterID": "other", "pool": "p"} }, http.StatusNotFound, "no configured backend"},
		{func(r *opsapi.AdoptRequest) { r.Parameters = map[string]string{"backend": defaultKey} }, http.StatusBadRequest, "pick backend " + defaultKey},
		// An image ceph-csi encrypted (its PV's attributes carry its
		// class's encrypted) is not treated as plain.
		{func(r *opsapi.AdoptRequest) {
			r.Attributes = map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "imageName": img.ID, "encrypted": "true", "encryptionKMSID": "vault"}
		}, http.StatusBadRequest, "opens only the encrypted volumes it created"},
		// Its data stays in clear, so it cannot join an encrypted class.
		{func(r *opsapi.AdoptRequest) {
			r.Parameters = map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "encrypted": "true"}
		}, http.StatusBadRequest, "cannot become an encrypted volume in place"},
		{func(r *opsapi.AdoptRequest) {
			r.Attributes = map[string]string{"clusterID": "rook-ceph", "pool": "p", "imageName": "missing"}
		}, http.StatusNotFound, "missing"},
	} {
		r := good
		tt.change(&r)
		code, body := post(r)
		if code != tt.status || !strings.Contains(string(body), tt.want) {
			t.Errorf("adopt %+v = %d %s, want %d naming %q", r, code, body, tt.status, tt.want)
		}
	}
	if code, body := post(opsapi.AdoptRequest{}); code != http.StatusBadRequest {
		t.Errorf("an empty request = %d %s", code, body)
	}
	resp, err := http.Post(srv.URL+opsapi.PathAdopt, "application/json", strings.NewReader(`{"handle":"x","unknown":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a request with an unknown field = %d", resp.StatusCode)
	}

	// An image still open on a node: the dry run says by whom, the real
	// adoption is refused.
	inst := e.d.instances[fastKey]
	open := inst.Store.(cephLike)
	open.openBy = []string{"10.0.0.7:0/3411306950"}
	inst.Store = open
	code, body = post(good)
	out = opsapi.AdoptedVolume{}
	if code != http.StatusOK || json.Unmarshal(body, &out) != nil || !slices.Equal(out.OpenBy, open.openBy) {
		t.Errorf("a dry run of an open image = %d %s, want it open by %v", code, body, open.openBy)
	}
	adoption := good
	adoption.DryRun = false
	if code, body := post(adoption); code != http.StatusPreconditionFailed || !strings.Contains(string(body), "10.0.0.7:0/3411306950") {
		t.Errorf("adopting an open image = %d %s, want 412 naming its client", code, body)
	}
}
