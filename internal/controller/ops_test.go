package controller

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

func TestAdopt(t *testing.T) {
	e := newEnv(t, withStatic())
	img, err := e.pools[fastKey].Create(e.ctx, backend.VolumeSpec{Name: "csi-vol-1", CapacityBytes: 8 * mib, AccessType: backend.AccessMount, FsType: "xfs"})
	if err != nil {
		t.Fatal(err)
	}
	attrs := map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "imageName": img.ID}
	params := map[string]string{"clusterID": "rook-ceph", "pool": "replicapool"}
	req := func(change func(*AdoptRequest)) AdoptRequest {
		r := AdoptRequest{Name: "pv-new", Handle: "0001-rook-ceph-" + img.ID, Attributes: attrs, Parameters: params,
			AccessType: backend.AccessMount, FsType: "xfs", Secrets: map[string]string{"userID": "admin", "userKey": "k"}}
		if change != nil {
			change(&r)
		}
		return r
	}
	vol, openBy, err := e.c.Adopt(e.ctx, req(nil))
	if err != nil {
		t.Fatal(err)
	}
	if vol.ID != fastKey+"/"+img.ID || vol.CapacityBytes != 8*mib || len(openBy) != 0 || vol.Context["pool"] != "replicapool" {
		t.Fatalf("adopted %+v, open by %v", vol, openBy)
	}
	tests := []struct {
		name     string
		req      AdoptRequest
		kind     error
		mentions []string
	}{
		{"parameters of another backend", req(func(r *AdoptRequest) { r.Parameters = map[string]string{"backend": defaultKey} }), errdefs.ErrInvalidArgument, []string{"in backend " + fastKey, "pick backend " + defaultKey}},
		{"into an encrypted class", req(func(r *AdoptRequest) { r.Parameters = map[string]string{"clusterID": "rook-ceph", "encrypted": "true"} }), errdefs.ErrInvalidArgument, []string{"cannot become an encrypted volume in place"}},
		{"an unknown access type", req(func(r *AdoptRequest) { r.AccessType = "file" }), errdefs.ErrInvalidArgument, []string{`accessType "file"`}},
		{"an unknown filesystem", req(func(r *AdoptRequest) { r.FsType = "zfs" }), errdefs.ErrInvalidArgument, []string{"fsType", "zfs"}},
		{"attributes no backend claims", req(func(r *AdoptRequest) { r.Attributes = map[string]string{"clusterID": "other"} }), errdefs.ErrNotFound, []string{"handle"}},
		{"an image that does not exist", req(func(r *AdoptRequest) {
			r.Attributes = map[string]string{"clusterID": "rook-ceph", "pool": "p", "imageName": "csi-vol-none"}
		}), errdefs.ErrNotFound, []string{"csi-vol-none"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := e.c.Adopt(e.ctx, tc.req)
			wantKind(t, err, tc.kind, tc.mentions...)
		})
	}
	// Where no configured backend serves such images, the handle names nothing.
	_, _, err = newEnv(t).c.Adopt(e.ctx, req(nil))
	wantKind(t, err, errdefs.ErrNotFound, "no configured backend serves")
}

// An image still open is refused, but for a dry run, which says by whom.
func TestAdoptAnOpenImage(t *testing.T) {
	e := newEnv(t, withStatic("10.0.0.5:0/1234"))
	img, err := e.pools[fastKey].Create(e.ctx, backend.VolumeSpec{Name: "csi-vol-1", CapacityBytes: 8 * mib, AccessType: backend.AccessBlock})
	if err != nil {
		t.Fatal(err)
	}
	r := AdoptRequest{Name: "pv-new", Handle: img.ID, Attributes: map[string]string{"clusterID": "rook-ceph", "pool": "p"},
		Parameters: map[string]string{"clusterID": "rook-ceph"}, AccessType: backend.AccessBlock, Secrets: testSecrets}
	_, _, err = e.c.Adopt(e.ctx, r)
	wantKind(t, err, errdefs.ErrPrecondition, "still open by")
	r.DryRun = true
	vol, openBy, err := e.c.Adopt(e.ctx, r)
	if err != nil || !slices.Equal(openBy, []string{"10.0.0.5:0/1234"}) || vol.ID != fastKey+"/"+img.ID {
		t.Fatalf("dry run = %+v, %v, %v", vol, openBy, err)
	}
}

// A key rotation's controller steps: plan (resumable), commit (once, then
// idempotent); publish carries the keys of a rotation under way.
func TestKeyRotation(t *testing.T) {
	e := newEnv(t)
	vol := e.mustCreate(t, CreateRequest{Name: "pvc-enc", Capabilities: []Capability{mountRW}, RequiredBytes: 32 * mib, Parameters: map[string]string{"encrypted": "true"}})
	id := mustID(t, vol.ID)
	before := e.image(t, vol.ID).Encryption
	plan, err := e.c.PlanKeyRotation(e.ctx, id, testSecrets)
	if err != nil {
		t.Fatal(err)
	}
	if plan.WrappedKey != before.WrappedKey || plan.NextWrappedKey == "" || e.image(t, vol.ID).Encryption.NextWrappedKey != plan.NextWrappedKey {
		t.Fatalf("plan %+v, recorded %+v", plan, e.image(t, vol.ID).Encryption)
	}
	// Planned again (the operator's tool restarted): the same next key.
	if again, err := e.c.PlanKeyRotation(e.ctx, id, testSecrets); err != nil || again.NextWrappedKey != plan.NextWrappedKey {
		t.Fatalf("a resumed plan = %+v, %v; want the next key %s", again, err, plan.NextWrappedKey)
	}
	pc, err := e.c.Publish(e.ctx, PublishRequest{ID: id, NodeID: "node-a", Capability: mountRW})
	if err != nil || pc[backend.ContextEncryptionNext] != plan.NextWrappedKey {
		t.Fatalf("publish during a rotation = %v, %v", pc, err)
	}
	wantKind(t, e.c.CommitKey(e.ctx, id, "not-the-next-key"), errdefs.ErrPrecondition, "no rotation of volume "+vol.ID)
	if err := e.c.CommitKey(e.ctx, id, plan.NextWrappedKey); err != nil {
		t.Fatal(err)
	}
	after := e.image(t, vol.ID).Encryption
	if after.WrappedKey != plan.NextWrappedKey || after.PreviousWrappedKey != before.WrappedKey || after.NextWrappedKey != "" {
		t.Fatalf("after the commit %+v", after)
	}
	if err := e.c.CommitKey(e.ctx, id, plan.NextWrappedKey); err != nil {
		t.Fatalf("committing again: %v", err)
	}

	_, err = e.c.PlanKeyRotation(e.ctx, id, map[string]string{"encryptionPassphrase": "another Secret's value, long enough"})
	if err == nil {
		t.Fatal("a plan with secrets that do not unwrap the key went ahead")
	}
	plain := e.mustCreate(t, createReq("pvc-plain"))
	_, err = e.c.PlanKeyRotation(e.ctx, mustID(t, plain.ID), testSecrets)
	wantKind(t, err, errdefs.ErrPrecondition, "is not encrypted")
	wantKind(t, e.c.CommitKey(e.ctx, mustID(t, plain.ID), "x"), errdefs.ErrPrecondition, "is not encrypted")
	_, err = e.c.PlanKeyRotation(e.ctx, mustID(t, defaultKey+"/pvc-none"), testSecrets)
	wantKind(t, err, errdefs.ErrNotFound, "pvc-none")
}

func TestListAndGetVolumes(t *testing.T) {
	e := newEnv(t)
	b := e.mustCreate(t, CreateRequest{Name: "pvc-b", Capabilities: []Capability{mountRW}, RequiredBytes: 8 * mib, Parameters: map[string]string{"backend": fastKey}})
	a := e.mustCreate(t, createReq("pvc-a"))
	if _, err := e.c.Publish(e.ctx, PublishRequest{ID: mustID(t, a.ID), NodeID: "node-b", Capability: mountRW}); err != nil {
		t.Fatal(err)
	}
	all, err := e.c.ListVolumes(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, v := range all {
		ids = append(ids, v.ID)
	}
	if !slices.Equal(ids, []string{a.ID, b.ID}) || !slices.Equal(all[0].PublishedNodes, []string{"node-b"}) {
		t.Fatalf("ListVolumes = %v, published %v", ids, all[0].PublishedNodes)
	}
	got, err := e.c.GetVolume(e.ctx, mustID(t, b.ID))
	if err != nil || got.ID != b.ID || got.CapacityBytes != 8*mib || len(got.PublishedNodes) != 0 {
		t.Fatalf("GetVolume = %+v, %v", got, err)
	}
	_, err = e.c.GetVolume(e.ctx, mustID(t, defaultKey+"/pvc-none"))
	wantKind(t, err, errdefs.ErrNotFound, "pvc-none")
	_, err = e.c.GetVolume(e.ctx, mustID(t, "loop/gone/pvc-a"))
	wantKind(t, err, errdefs.ErrPrecondition, "loop/gone")
}

func TestCapacity(t *testing.T) {
	e := newEnv(t, func(insts backend.Instances) { insts[fastKey].NodeLocal = true })
	tests := []struct {
		name     string
		params   map[string]string
		caps     []Capability
		topology Topology
		minimum  int64 // 0: nothing usable
	}{
		{"no capabilities", nil, nil, nil, mib},
		{"xfs's minimum", nil, []Capability{{Access: backend.AccessMount, Mode: backend.SingleNodeWriter, FsType: "xfs"}}, nil, 300 * mib},
		{"a mode the backend refuses", nil, []Capability{{Access: backend.AccessBlock, Mode: backend.MultiNodeMultiWriter}}, nil, 0},
		{"a node-local instance from this node", map[string]string{"backend": fastKey}, nil, Topology{TopologyKey: testNode}, mib},
		{"a node-local instance from another node", map[string]string{"backend": fastKey}, nil, Topology{TopologyKey: "node-b"}, 0},
		{"a topology that names nothing", map[string]string{"backend": fastKey}, nil, Topology{}, 0},
		{"a shared instance from anywhere", nil, nil, Topology{TopologyKey: "node-b"}, mib},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := e.c.Capacity(e.ctx, tc.params, tc.caps, tc.topology)
			if err != nil {
				t.Fatal(err)
			}
			if tc.minimum == 0 {
				if c != nil {
					t.Fatalf("Capacity = %+v, want none usable", c)
				}
				return
			}
			if c == nil || c.MinimumVolumeBytes != tc.minimum || c.AvailableBytes <= 0 || c.AvailableBytes%mib != 0 || c.MaximumVolumeBytes > MaxCapacity {
				t.Fatalf("Capacity = %+v, want minimum %d and whole MiB", c, tc.minimum)
			}
		})
	}
	_, err := e.c.Capacity(e.ctx, map[string]string{"backend": "loop/gone"}, nil, nil)
	wantKind(t, err, errdefs.ErrInvalidArgument, "loop/gone")
}

// A node-local instance provisions on this node only: its volumes say so,
// and a request that needs another node is refused.
func TestTopology(t *testing.T) {
	e := newEnv(t, func(insts backend.Instances) { insts[fastKey].NodeLocal = true })
	local := func(name string, a *Accessibility) CreateRequest {
		r := createReq(name)
		r.Parameters, r.Accessibility = map[string]string{"backend": fastKey}, a
		return r
	}
	here, there := NodeTopology(testNode), NodeTopology("node-b")
	v := e.mustCreate(t, local("pvc-here", &Accessibility{Requisite: []Topology{there, here}}))
	if len(v.Topology) != 1 || v.Topology[0][TopologyKey] != testNode {
		t.Fatalf("a node-local volume's topology %v", v.Topology)
	}
	e.mustCreate(t, local("pvc-preferred", &Accessibility{Preferred: []Topology{here}}))
	_, err := e.c.CreateVolume(e.ctx, local("pvc-there", &Accessibility{Requisite: []Topology{there}}))
	wantKind(t, err, errdefs.ErrExhausted, "accessibility_requirements", TopologyKey+"="+testNode)
	_, err = e.c.CreateVolume(e.ctx, local("pvc-zoned", &Accessibility{Requisite: []Topology{{TopologyKey: testNode, "zone": "z1"}}}))
	wantKind(t, err, errdefs.ErrExhausted)
	_, err = e.c.CreateSnapshot(e.ctx, "snap-there", mustID(t, v.ID), nil, &Accessibility{Requisite: []Topology{there}})
	wantKind(t, err, errdefs.ErrExhausted)
	// A shared instance meets any requirement.
	if shared := e.mustCreate(t, CreateRequest{Name: "pvc-shared", Capabilities: []Capability{mountRW}, Accessibility: &Accessibility{Requisite: []Topology{there}}}); shared.Topology != nil {
		t.Fatalf("a shared volume reports topology %v", shared.Topology)
	}
}

// The health of a volume is its image's: gone data is DATA_LOSS; only
// volumes with a problem are listed.
func TestVolumeHealth(t *testing.T) {
	e := newEnv(t)
	ok := e.mustCreate(t, createReq("pvc-ok"))
	lost := e.mustCreate(t, createReq("pvc-lost"))
	if err := os.Remove(e.pools[defaultKey].ImagePath(mustID(t, lost.ID).Image)); err != nil {
		t.Fatal(err)
	}
	if problems, err := e.c.VolumeHealth(e.ctx, mustID(t, ok.ID)); err != nil || len(problems) != 0 {
		t.Fatalf("health of a sound volume = %v, %v", problems, err)
	}
	problems, err := e.c.VolumeHealth(e.ctx, mustID(t, lost.ID))
	if err != nil || len(problems) != 1 || problems[0].Status != DataLoss || problems[0].Reason != "ImageMissing" {
		t.Fatalf("health of a volume whose image file is gone = %+v, %v", problems, err)
	}
	_, err = e.c.VolumeHealth(e.ctx, mustID(t, defaultKey+"/pvc-none"))
	wantKind(t, err, errdefs.ErrNotFound, "pvc-none")
	sick, err := e.c.ListVolumeHealth(e.ctx)
	if err != nil || len(sick) != 1 || sick[0].VolumeID != lost.ID {
		t.Fatalf("ListVolumeHealth = %+v, %v", sick, err)
	}
	if got := ImageHealth(e.ctx, struct{}{}, "pvc-x"); got != nil {
		t.Fatalf("a checker that cannot check reported %v", got)
	}
}

// upkeepStore is a store with background work: the repair at start, and
// tasks to report.
type upkeepStore struct {
	backend.ImageStore
	reconciled int
	tasks      []backend.Task
	tasksErr   error
}

func (u *upkeepStore) Reconcile(context.Context) ([]string, error) {
	u.reconciled++
	return []string{"removed a half-built image"}, errors.New("one image could not be read")
}

func (u *upkeepStore) Tasks(context.Context) ([]backend.Task, error) { return u.tasks, u.tasksErr }

func TestUpkeep(t *testing.T) {
	u := &upkeepStore{tasks: []backend.Task{{Action: "flatten", Image: "pvc-a", Progress: 0.5, InProgress: true}}}
	e := newEnv(t, func(insts backend.Instances) {
		u.ImageStore = insts[fastKey].Store
		insts[fastKey].Store = u
	})
	// A failed repair is logged, not a reason not to serve.
	e.c.Reconcile(e.ctx)
	if u.reconciled != 1 {
		t.Fatalf("Reconcile ran %d times", u.reconciled)
	}
	tasks, ok, err := e.c.Tasks(e.ctx, fastKey)
	if !ok || err != nil || len(tasks) != 1 || tasks[0].Action != "flatten" {
		t.Fatalf("Tasks = %v, %t, %v", tasks, ok, err)
	}
	if _, ok, _ := e.c.Tasks(e.ctx, defaultKey); ok {
		t.Fatal("a store without background work reports tasks")
	}
	gauges, err := e.c.BackgroundTasks()
	if err != nil || len(gauges) != 1 || gauges[0].Backend != fastKey || gauges[0].Image != "pvc-a" || gauges[0].Progress != 0.5 {
		t.Fatalf("BackgroundTasks = %+v, %v", gauges, err)
	}
	u.tasksErr = errors.New("the cluster does not answer")
	if _, err := e.c.BackgroundTasks(); err == nil {
		t.Fatal("a failed task list is not reported")
	}
	// Maintain returns when its context ends.
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	e.c.Maintain(ctx)
}
