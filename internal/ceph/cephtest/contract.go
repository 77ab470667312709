// Package cephtest holds the contract every ceph.Client passes: the real
// one over librados and librbd against a real cluster, and cephfake's
// in-memory cluster. What the rbd backend relies on of Ceph is written
// here once, as behaviour (a snapshot removed under a clone waits in the
// trash namespace; a trashed image's name is free at once; ...), so the
// fake cannot drift from the real thing unnoticed.
package cephtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Env is one cluster as the contract uses it.
type Env struct {
	Dialer ceph.Dialer
	// Target reaches the cluster as a user allowed everything.
	Target ceph.Target
	// Pool and OtherPool are rbd pools; Namespace is a RADOS namespace of
	// Pool that rbd knows ("rbd namespace create").
	Pool, OtherPool, Namespace string
	Admin                      Admin
	// Await is how long the manager may take to run a task.
	Await time.Duration
}

// Admin does to the cluster what the client never does itself, the way
// an operator or another client would.
type Admin interface {
	// Protect protects a snapshot (as releases before clone format 2 and
	// earlier versions of Spindle did).
	Protect(ctx context.Context, image ceph.ImageSpec, snap string) error
	// CloneV1 makes a clone of format 1 of a protected snapshot (as
	// earlier versions of Spindle did).
	CloneV1(ctx context.Context, parent ceph.ImageSpec, snap string, child ceph.ImageSpec) error
	// Watch opens the image from another client, as a node that mapped
	// it; it returns that client's address and the function that closes
	// it.
	Watch(ctx context.Context, image ceph.ImageSpec) (addr string, stop func(), err error)
	// Lock takes an advisory lock on the image.
	Lock(ctx context.Context, image ceph.ImageSpec, cookie string) error
}

// Run runs the contract; newEnv gives the cluster of each case.
func Run(t *testing.T, newEnv func(t *testing.T) Env) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+env.Await)
			defer cancel()
			cl, err := env.Dialer.Dial(ctx, env.Target)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			h := &harness{t: t, ctx: ctx, c: cl, env: env, id: randomHex(4)}
			t.Cleanup(h.wipe)
			tc.run(h)
		})
	}
}

type harness struct {
	t      *testing.T
	ctx    context.Context
	c      ceph.Client
	env    Env
	id     string
	mu     sync.Mutex
	images []ceph.ImageSpec // created, for the cleanup
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// spec is a fresh image name of this case in the pool (namespace).
func (h *harness) spec(p ceph.PoolSpec, name string) ceph.ImageSpec {
	s := p.Image("ct-" + h.id + "-" + name)
	h.mu.Lock()
	h.images = append(h.images, s)
	h.mu.Unlock()
	return s
}

func (h *harness) pool() ceph.PoolSpec { return ceph.PoolSpec{Pool: h.env.Pool} }

// must fails the case on err.
func (h *harness) must(err error, what string, args ...any) {
	h.t.Helper()
	if err != nil {
		h.t.Fatalf("%s: %v", fmt.Sprintf(what, args...), err)
	}
}

// create makes a 64 MiB image with layering.
func (h *harness) create(p ceph.PoolSpec, name string, features ...string) ceph.ImageSpec {
	h.t.Helper()
	if len(features) == 0 {
		features = []string{"layering"}
	}
	s := h.spec(p, name)
	h.must(h.c.CreateImage(h.ctx, s, 64<<20, ceph.ImageOptions{Features: features}), "create %s", s)
	return s
}

// wantKind fails unless err is of kind (nil for "no error").
func (h *harness) wantKind(err, kind error, what string) {
	h.t.Helper()
	if kind == nil {
		if err != nil {
			h.t.Fatalf("%s: %v", what, err)
		}
		return
	}
	if errdefs.KindOf(err) != kind {
		h.t.Fatalf("%s: got %v (kind %v, errno %d), want kind %v", what, err, errdefs.KindOf(err), ceph.Errno(err), kind)
	}
}

// wantErrno fails unless err carries errno n.
func (h *harness) wantErrno(err error, n int, what string) {
	h.t.Helper()
	if ceph.Errno(err) != n {
		h.t.Fatalf("%s: got %v (errno %d), want errno %d", what, err, ceph.Errno(err), n)
	}
}

func (h *harness) snaps(s ceph.ImageSpec) []ceph.SnapInfo {
	h.t.Helper()
	list, err := h.c.Snapshots(h.ctx, s)
	h.must(err, "list snapshots of %s", s)
	return list
}

// names are "name" for user snapshots and "<namespace>" for others.
func names(list []ceph.SnapInfo) []string {
	var out []string
	for _, s := range list {
		if s.Namespace == ceph.SnapUser {
			out = append(out, s.Name)
		} else {
			out = append(out, "<"+string(s.Namespace)+">")
		}
	}
	slices.Sort(out)
	return out
}

func (h *harness) await(what string, done func() (bool, error)) {
	h.t.Helper()
	deadline := time.Now().Add(h.env.Await)
	for {
		ok, err := done()
		if err != nil {
			h.t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: not within %s", what, h.env.Await)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// wipe removes every image the case made, live or trashed, in passes
// (clones before their parents).
func (h *harness) wipe() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var left []string
	for pass := 0; pass < 5; pass++ {
		left = nil
		for _, s := range h.images {
			if list, err := h.c.Snapshots(ctx, s); err == nil {
				for _, sn := range list {
					if sn.Namespace == ceph.SnapUser {
						_ = h.c.UnprotectSnapshot(ctx, s, sn.Name)
						_ = h.c.RemoveSnapshot(ctx, s, sn.Name)
					}
				}
			}
			if err := h.c.RemoveImage(ctx, s); err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
				left = append(left, err.Error())
			}
		}
		for _, p := range h.pools() {
			trash, _ := h.c.Trash(ctx, p)
			for _, e := range trash {
				if slices.ContainsFunc(h.images, func(s ceph.ImageSpec) bool { return s.PoolSpec == p && s.Name == e.Name }) {
					if err := h.c.TrashRemove(ctx, p, e.ID); err != nil && errdefs.KindOf(err) != errdefs.ErrNotFound {
						left = append(left, err.Error())
					}
				}
			}
		}
		if len(left) == 0 {
			return
		}
	}
	h.t.Errorf("cleanup: %s", strings.Join(left, "; "))
}

func (h *harness) pools() []ceph.PoolSpec {
	var out []ceph.PoolSpec
	for _, s := range h.images {
		if !slices.Contains(out, s.PoolSpec) {
			out = append(out, s.PoolSpec)
		}
	}
	return out
}

type contractCase struct {
	name string
	run  func(h *harness)
}

var cases = []contractCase{
	{"ImagesAreCreatedAndDescribed", func(h *harness) {
		before := time.Now().Add(-time.Minute)
		s := h.create(h.pool(), "a", "layering", "exclusive-lock")
		info, meta, err := h.c.DescribeImage(h.ctx, s)
		h.must(err, "describe")
		if info.ID == "" || info.Size != 64<<20 || info.Parent != nil || len(meta) != 0 {
			h.t.Fatalf("describe %s: %+v meta %v", s, info, meta)
		}
		if !slices.Contains(info.Features, "layering") || !slices.Contains(info.Features, "exclusive-lock") {
			h.t.Fatalf("features %v, want layering and exclusive-lock", info.Features)
		}
		if info.Created.Before(before) || info.Created.After(time.Now().Add(time.Minute)) {
			h.t.Fatalf("created %s, not about now", info.Created)
		}
		stat, err := h.c.StatImage(h.ctx, s, "")
		h.must(err, "stat")
		if stat.ID != info.ID || stat.Size != info.Size {
			h.t.Fatalf("stat %+v differs from describe %+v", stat, info)
		}
		names, err := h.c.ListImages(h.ctx, h.pool())
		h.must(err, "list")
		if !slices.Contains(names, s.Name) {
			h.t.Fatalf("list %v lacks %s", names, s.Name)
		}
	}},
	{"CreateRefusesATakenNameAndAMissingPool", func(h *harness) {
		s := h.create(h.pool(), "a")
		h.wantKind(h.c.CreateImage(h.ctx, s, 1<<20, ceph.ImageOptions{Features: []string{"layering"}}), errdefs.ErrAlreadyExists, "create again")
		h.wantKind(h.c.CreateImage(h.ctx, ceph.PoolSpec{Pool: "no-such-pool-" + h.id}.Image("x"), 1<<20, ceph.ImageOptions{}), errdefs.ErrNotFound, "create in a missing pool")
		_, err := h.c.StatImage(h.ctx, h.pool().Image("ct-missing-"+h.id), "")
		h.wantKind(err, errdefs.ErrNotFound, "stat a missing image")
		_, _, err = h.c.DescribeImage(h.ctx, h.pool().Image("ct-missing-"+h.id))
		h.wantKind(err, errdefs.ErrNotFound, "describe a missing image")
	}},
	{"ImagesInANamespaceAndWithADataPool", func(h *harness) {
		ns := ceph.PoolSpec{Pool: h.env.Pool, Namespace: h.env.Namespace}
		s := h.create(ns, "a")
		names, err := h.c.ListImages(h.ctx, ns)
		h.must(err, "list namespace")
		if !slices.Contains(names, s.Name) {
			h.t.Fatalf("namespace list %v lacks %s", names, s.Name)
		}
		top, err := h.c.ListImages(h.ctx, h.pool())
		h.must(err, "list pool")
		if slices.Contains(top, s.Name) {
			h.t.Fatalf("the pool's default namespace lists %s of namespace %s", s.Name, ns)
		}
		d := h.spec(h.pool(), "data")
		h.must(h.c.CreateImage(h.ctx, d, 8<<20, ceph.ImageOptions{Features: []string{"layering"}, DataPool: h.env.OtherPool, ObjectSize: 1 << 20}), "create with a data pool")
		info, err := h.c.StatImage(h.ctx, d, "")
		h.must(err, "stat")
		if !slices.Contains(info.Features, "data-pool") {
			h.t.Fatalf("an image with a data pool has features %v", info.Features)
		}
	}},
	{"MetadataIsSetReadAndRemoved", func(h *harness) {
		s := h.create(h.pool(), "a")
		h.must(h.c.SetImageMetadata(h.ctx, s, map[string]string{"k1": "v1", "k2": `{"json":true}`}), "set")
		v, err := h.c.ImageMetadataValue(h.ctx, s, "k2")
		if err != nil || v != `{"json":true}` {
			h.t.Fatalf("get k2: %q %v", v, err)
		}
		h.must(h.c.SetImageMetadata(h.ctx, s, map[string]string{"k1": "", "never-set": ""}), "remove k1 and a key never set")
		meta, err := h.c.ImageMetadata(h.ctx, s)
		h.must(err, "list")
		if len(meta) != 1 || meta["k2"] != `{"json":true}` {
			h.t.Fatalf("metadata %v, want only k2", meta)
		}
		_, err = h.c.ImageMetadataValue(h.ctx, s, "k1")
		h.wantKind(err, errdefs.ErrNotFound, "get a removed key")
		// What one call writes the image's open (DescribeImage) reads,
		// whichever way each goes: many keys, a per-image configuration
		// key (which clients that have the image open must be told of),
		// and a set and a remove in one call.
		many := map[string]string{"conf_rbd_cache": "false"}
		for i := range 300 {
			many[fmt.Sprintf("m%03d", i)] = strings.Repeat("v", i)
		}
		h.must(h.c.SetImageMetadata(h.ctx, s, many), "set 301 keys")
		h.must(h.c.SetImageMetadata(h.ctx, s, map[string]string{"k2": "", "m000": "first"}), "remove k2 and set m000")
		many["m000"] = "first"
		_, described, err := h.c.DescribeImage(h.ctx, s)
		h.must(err, "describe")
		listed, err := h.c.ImageMetadata(h.ctx, s)
		h.must(err, "list")
		if !maps.Equal(described, many) || !maps.Equal(listed, many) {
			h.t.Fatalf("metadata described %d keys, listed %d; want the 301 set (m000=first, no k2)", len(described), len(listed))
		}
		h.must(h.c.ResizeImage(h.ctx, s, 96<<20), "grow")
		h.must(h.c.CreateSnapshot(h.ctx, s, "s1"), "snapshot")
		info, err := h.c.StatImage(h.ctx, s, "")
		h.must(err, "stat")
		head, err := h.c.ImageHeader(h.ctx, s)
		if err != nil || head.ID != info.ID || head.Size != 96<<20 || head.Snapshots != 1 || !slices.Equal(head.Features, info.Features) || !head.Created.Equal(info.Created) || !maps.Equal(head.Metadata, many) {
			h.t.Fatalf("header: %+v (%d keys), %v; want ID %s, 96 MiB, features %v, 1 snapshot and the 301 keys", head, len(head.Metadata), err, info.ID, info.Features)
		}
		h.must(h.c.RemoveSnapshot(h.ctx, s, "s1"), "remove the snapshot")
		_, err = h.c.ImageMetadata(h.ctx, h.spec(h.pool(), "missing"))
		h.wantKind(err, errdefs.ErrNotFound, "list the metadata of a missing image")
		_, err = h.c.ImageHeader(h.ctx, h.spec(h.pool(), "missing"))
		h.wantKind(err, errdefs.ErrNotFound, "read the header of a missing image")
		h.wantKind(h.c.SetImageMetadata(h.ctx, h.spec(h.pool(), "missing"), map[string]string{"k": "v"}), errdefs.ErrNotFound, "set metadata of a missing image")
	}},
	{"ResizeAndRename", func(h *harness) {
		s := h.create(h.pool(), "a")
		h.must(h.c.ResizeImage(h.ctx, s, 128<<20), "grow")
		info, err := h.c.StatImage(h.ctx, s, "")
		if err != nil || info.Size != 128<<20 {
			h.t.Fatalf("after growing: %+v %v", info, err)
		}
		other := h.create(h.pool(), "b")
		h.wantKind(h.c.RenameImage(h.ctx, s, other.Name), errdefs.ErrAlreadyExists, "rename onto a taken name")
		to := h.spec(h.pool(), "c")
		h.must(h.c.RenameImage(h.ctx, s, to.Name), "rename")
		_, err = h.c.StatImage(h.ctx, s, "")
		h.wantKind(err, errdefs.ErrNotFound, "stat the old name")
		after, err := h.c.StatImage(h.ctx, to, "")
		if err != nil || after.ID != info.ID {
			h.t.Fatalf("the renamed image: %+v %v, want ID %s", after, err, info.ID)
		}
	}},
	{"SnapshotsAreTakenListedAndRemoved", func(h *harness) {
		s := h.create(h.pool(), "a")
		h.must(h.c.CreateSnapshot(h.ctx, s, "s1"), "snapshot")
		h.wantKind(h.c.CreateSnapshot(h.ctx, s, "s1"), errdefs.ErrAlreadyExists, "snapshot again")
		h.must(h.c.ResizeImage(h.ctx, s, 96<<20), "grow after the snapshot")
		list := h.snaps(s)
		if len(list) != 1 || list[0].Name != "s1" || list[0].Namespace != ceph.SnapUser || list[0].Protected || list[0].ID == 0 || list[0].Created.IsZero() {
			h.t.Fatalf("snapshots %+v", list)
		}
		at, err := h.c.StatImage(h.ctx, s, "s1")
		if err != nil || at.Size != 64<<20 {
			h.t.Fatalf("stat the snapshot: %+v %v, want its size when taken", at, err)
		}
		_, err = h.c.StatImage(h.ctx, s, "nope")
		h.wantKind(err, errdefs.ErrNotFound, "stat a missing snapshot")
	}},
	{"ImagesWithSnapshotsAreNotRemoved", func(h *harness) {
		s := h.create(h.pool(), "a")
		h.must(h.c.CreateSnapshot(h.ctx, s, "s1"), "snapshot")
		h.wantErrno(h.c.RemoveImage(h.ctx, s), ceph.ENOTEMPTY, "remove an image with a snapshot")
		h.must(h.c.RemoveSnapshot(h.ctx, s, "s1"), "remove the snapshot")
		h.wantKind(h.c.RemoveSnapshot(h.ctx, s, "s1"), errdefs.ErrNotFound, "remove it again")
		h.must(h.c.RemoveImage(h.ctx, s), "remove the image")
		h.wantKind(h.c.RemoveImage(h.ctx, s), errdefs.ErrNotFound, "remove it again")
	}},
	{"ClonesAreFormat2AndTheirSnapshotWaitsInTheTrashNamespace", func(h *harness) {
		p := h.create(h.pool(), "parent")
		h.must(h.c.SetImageMetadata(h.ctx, p, map[string]string{"owner": "parent"}), "set the parent's metadata")
		h.must(h.c.CreateSnapshot(h.ctx, p, "s"), "snapshot")
		pinfo, _ := h.c.StatImage(h.ctx, p, "")
		other := ceph.PoolSpec{Pool: h.env.OtherPool}
		c := h.spec(other, "clone")
		h.must(h.c.CloneImage(h.ctx, p, "s", c, ceph.ImageOptions{Features: []string{"layering"}}), "clone into another pool")
		info, err := h.c.StatImage(h.ctx, c, "")
		h.must(err, "stat the clone")
		if info.Parent == nil || info.Parent.Pool != h.env.Pool || info.Parent.Image != p.Name || info.Parent.ImageID != pinfo.ID || info.Parent.Snapshot != "s" || info.Parent.Trash || info.Size != 64<<20 {
			h.t.Fatalf("the clone's parent %+v size %d", info.Parent, info.Size)
		}
		if meta, err := h.c.ImageMetadata(h.ctx, c); err != nil || meta["owner"] != "parent" {
			h.t.Fatalf("the clone's metadata %v %v: want its parent's, copied", meta, err)
		}
		kids, err := h.c.Children(h.ctx, p, "s")
		h.must(err, "children")
		if len(kids) != 1 || kids[0].Image != c.Name || kids[0].Pool != h.env.OtherPool || kids[0].Trash {
			h.t.Fatalf("children %+v", kids)
		}
		// No protection needed, and the snapshot moves to the trash
		// namespace while the clone hangs from it.
		h.must(h.c.RemoveSnapshot(h.ctx, p, "s"), "remove the parent's snapshot")
		if got := names(h.snaps(p)); !slices.Equal(got, []string{"<trash>"}) {
			h.t.Fatalf("the parent's snapshots after removal: %v, want one in the trash namespace", got)
		}
		h.wantErrno(h.c.RemoveImage(h.ctx, p), ceph.ENOTEMPTY, "remove the parent")
		info, _ = h.c.StatImage(h.ctx, c, "")
		if info.Parent == nil || info.Parent.ImageID != pinfo.ID {
			h.t.Fatalf("the clone lost its parent: %+v", info.Parent)
		}
		h.must(h.c.RemoveImage(h.ctx, c), "remove the clone")
		if got := h.snaps(p); len(got) != 0 {
			h.t.Fatalf("the parent keeps snapshots %+v after its last clone went", got)
		}
		h.must(h.c.RemoveImage(h.ctx, p), "remove the parent")
	}},
	{"TheTrashFreesTheNameAndKeepsTheImage", func(h *harness) {
		s := h.create(h.pool(), "a")
		info, _ := h.c.StatImage(h.ctx, s, "")
		h.must(h.c.TrashMove(h.ctx, s), "trash")
		names, _ := h.c.ListImages(h.ctx, h.pool())
		if slices.Contains(names, s.Name) {
			h.t.Fatalf("a trashed image is listed")
		}
		trash, err := h.c.Trash(h.ctx, h.pool())
		h.must(err, "trash list")
		if !slices.Contains(trash, ceph.TrashEntry{ID: info.ID, Name: s.Name}) {
			h.t.Fatalf("trash %+v lacks %s (%s)", trash, s.Name, info.ID)
		}
		if snaps := h.snapsOfID(info.ID); len(snaps) != 0 {
			h.t.Fatalf("snapshots of the trashed image: %+v", snaps)
		}
		again := h.create(h.pool(), "a") // the same name, free again
		if again != s {
			h.t.Fatalf("names differ: %s %s", again, s)
		}
		_, err = h.c.SnapshotsOfID(h.ctx, h.pool(), "no-such-id")
		h.wantKind(err, errdefs.ErrNotFound, "snapshots of a missing ID")
		h.must(h.c.TrashRemove(h.ctx, h.pool(), info.ID), "remove the trashed image")
		h.wantKind(h.c.TrashRemove(h.ctx, h.pool(), info.ID), errdefs.ErrNotFound, "remove it again")
	}},
	{"AParentInTheTrashGoesWithItsLastClone", func(h *harness) {
		p := h.create(h.pool(), "parent")
		pinfo, _ := h.c.StatImage(h.ctx, p, "")
		h.must(h.c.CreateSnapshot(h.ctx, p, "s"), "snapshot")
		c := h.spec(h.pool(), "clone")
		h.must(h.c.CloneImage(h.ctx, p, "s", c, ceph.ImageOptions{Features: []string{"layering"}}), "clone")
		h.must(h.c.RemoveSnapshot(h.ctx, p, "s"), "remove the snapshot")
		h.must(h.c.TrashMove(h.ctx, p), "trash the parent")
		info, err := h.c.StatImage(h.ctx, c, "")
		h.must(err, "stat the clone")
		if info.Parent == nil || !info.Parent.Trash || info.Parent.ImageID != pinfo.ID {
			h.t.Fatalf("a clone of a trashed parent: %+v", info.Parent)
		}
		if got := names(h.snapsOfID(pinfo.ID)); !slices.Equal(got, []string{"<trash>"}) {
			h.t.Fatalf("the trashed parent's snapshots: %v", got)
		}
		h.wantErrno(h.c.TrashRemove(h.ctx, h.pool(), pinfo.ID), ceph.ENOTEMPTY, "remove the trashed parent while its clone lives")
		h.must(h.c.RemoveImage(h.ctx, c), "remove the clone")
		if got := h.snapsOfID(pinfo.ID); len(got) != 0 {
			h.t.Fatalf("the trashed parent keeps %+v", got)
		}
		h.must(h.c.TrashRemove(h.ctx, h.pool(), pinfo.ID), "remove the trashed parent")
		trash, _ := h.c.Trash(h.ctx, h.pool())
		if slices.ContainsFunc(trash, func(e ceph.TrashEntry) bool { return e.ID == pinfo.ID }) {
			h.t.Fatalf("the parent is still in the trash")
		}
	}},
	{"FlattenDetachesAClone", func(h *harness) {
		p := h.create(h.pool(), "parent")
		h.must(h.c.CreateSnapshot(h.ctx, p, "s"), "snapshot")
		c := h.spec(h.pool(), "clone")
		h.must(h.c.CloneImage(h.ctx, p, "s", c, ceph.ImageOptions{Features: []string{"layering", "deep-flatten"}}), "clone")
		h.must(h.c.CreateSnapshot(h.ctx, c, "cs"), "snapshot the clone")
		if at, err := h.c.StatImage(h.ctx, c, "cs"); err != nil || at.Parent == nil {
			h.t.Fatalf("the clone's snapshot: %+v %v, want its parent", at, err)
		}
		h.must(h.c.FlattenImage(h.ctx, c), "flatten")
		info, _ := h.c.StatImage(h.ctx, c, "")
		if info.Parent != nil {
			h.t.Fatalf("flattened, the clone still has parent %+v", info.Parent)
		}
		if at, _ := h.c.StatImage(h.ctx, c, "cs"); at.Parent != nil {
			h.t.Fatalf("with deep-flatten its snapshot keeps parent %+v", at.Parent)
		}
		if kids, _ := h.c.Children(h.ctx, p, "s"); len(kids) != 0 {
			h.t.Fatalf("the parent still has children %+v", kids)
		}
		h.wantErrno(h.c.FlattenImage(h.ctx, p), ceph.EINVAL, "flatten an image without a parent")
	}},
	{"ProtectedSnapshotsAndTheirClones", func(h *harness) {
		p := h.create(h.pool(), "parent")
		h.must(h.c.CreateSnapshot(h.ctx, p, "s"), "snapshot")
		h.must(h.env.Admin.Protect(h.ctx, p, "s"), "protect")
		if list := h.snaps(p); len(list) != 1 || !list[0].Protected {
			h.t.Fatalf("snapshots %+v, want s protected", list)
		}
		h.wantErrno(h.c.RemoveSnapshot(h.ctx, p, "s"), ceph.EBUSY, "remove a protected snapshot")
		v1 := h.spec(h.pool(), "v1")
		h.must(h.env.Admin.CloneV1(h.ctx, p, "s", v1), "clone of format 1")
		h.wantErrno(h.c.UnprotectSnapshot(h.ctx, p, "s"), ceph.EBUSY, "unprotect with a clone of format 1")
		if kids, _ := h.c.Children(h.ctx, p, "s"); len(kids) != 1 || kids[0].Image != v1.Name {
			h.t.Fatalf("children %+v, want the format-1 clone", kids)
		}
		h.must(h.c.RemoveImage(h.ctx, v1), "remove the format-1 clone")
		// A format-2 clone needs no protection: it does not hold it.
		v2 := h.spec(h.pool(), "v2")
		h.must(h.c.CloneImage(h.ctx, p, "s", v2, ceph.ImageOptions{Features: []string{"layering"}}), "clone of format 2")
		h.must(h.c.UnprotectSnapshot(h.ctx, p, "s"), "unprotect with a clone of format 2")
		h.must(h.c.UnprotectSnapshot(h.ctx, p, "s"), "unprotect again")
		h.must(h.c.RemoveSnapshot(h.ctx, p, "s"), "remove")
		if got := names(h.snaps(p)); !slices.Equal(got, []string{"<trash>"}) {
			h.t.Fatalf("snapshots %v, want the removed one in the trash namespace", got)
		}
	}},
	{"WatchersAndLocks", func(h *harness) {
		s := h.create(h.pool(), "a", "layering", "exclusive-lock")
		if w, err := h.c.Watchers(h.ctx, s); err != nil || len(w) != 0 {
			h.t.Fatalf("watchers of an image nobody opened: %v %v (the client's own reads must not count)", w, err)
		}
		addr, stop, err := h.env.Admin.Watch(h.ctx, s)
		h.must(err, "watch")
		w, err := h.c.Watchers(h.ctx, s)
		if err != nil || !slices.Contains(w, addr) {
			stop()
			h.t.Fatalf("watchers %v %v, want %s", w, err, addr)
		}
		h.wantErrno(h.c.RemoveImage(h.ctx, s), ceph.EBUSY, "remove a watched image")
		h.must(h.c.CreateSnapshot(h.ctx, s, "s1"), "snapshot")
		h.must(h.c.SetImageMetadata(h.ctx, s, map[string]string{"k": "v"}), "set metadata")
		in, err := h.c.InspectImage(h.ctx, s)
		if err != nil || !slices.Contains(in.Watchers, addr) || len(in.Locks) != 0 || !slices.Equal(names(in.Snapshots), []string{"s1"}) ||
			in.Info.Size != 64<<20 || in.Info.ID == "" || !maps.Equal(in.Metadata, map[string]string{"k": "v"}) {
			stop()
			h.t.Fatalf("inspection %+v %v, want watcher %s, no lock, snapshot s1, 64 MiB and metadata k=v", in, err, addr)
		}
		h.must(h.c.RemoveSnapshot(h.ctx, s, "s1"), "remove snapshot")
		stop()
		h.await("the watch ends", func() (bool, error) {
			w, err := h.c.Watchers(h.ctx, s)
			return len(w) == 0, err
		})
		h.must(h.env.Admin.Lock(h.ctx, s, "cookie-1"), "lock")
		locks, err := h.c.Locks(h.ctx, s)
		if err != nil || len(locks) != 1 || locks[0].Cookie != "cookie-1" || locks[0].Client == "" {
			h.t.Fatalf("locks %+v %v", locks, err)
		}
		if in, err := h.c.InspectImage(h.ctx, s); err != nil || !slices.Equal(in.Locks, locks) || len(in.Watchers) != 0 || len(in.Snapshots) != 0 {
			h.t.Fatalf("inspection %+v %v, want lock %+v alone", in, err, locks)
		}
		h.must(h.c.BreakLock(h.ctx, s, locks[0]), "break")
		if locks, _ := h.c.Locks(h.ctx, s); len(locks) != 0 {
			h.t.Fatalf("locks after breaking: %+v", locks)
		}
	}},
	{"OmapRecords", func(h *harness) {
		p := h.pool()
		obj := "ct-" + h.id + "-omap"
		defer func() { _ = h.c.RemoveOmapKeys(context.Background(), p, obj, []string{"a", "b"}) }()
		keys, err := h.c.OmapKeys(h.ctx, p, obj)
		if err != nil || len(keys) != 0 {
			h.t.Fatalf("keys of a missing object: %v %v", keys, err)
		}
		_, err = h.c.OmapValue(h.ctx, p, obj, "a")
		h.wantKind(err, errdefs.ErrNotFound, "a key of a missing object")
		h.must(h.c.SetOmap(h.ctx, p, obj, map[string][]byte{"a": []byte(`{"n":1}`), "b": nil, "ab": []byte("x")}), "set")
		keys, _ = h.c.OmapKeys(h.ctx, p, obj)
		if !slices.Equal(keys, []string{"a", "ab", "b"}) {
			h.t.Fatalf("keys %v", keys)
		}
		v, err := h.c.OmapValue(h.ctx, p, obj, "a")
		if err != nil || string(v) != `{"n":1}` {
			h.t.Fatalf("value of a: %q %v (a prefix of another key)", v, err)
		}
		_, err = h.c.OmapValue(h.ctx, p, obj, "c")
		h.wantKind(err, errdefs.ErrNotFound, "a missing key")
		h.must(h.c.RemoveOmapKeys(h.ctx, p, obj, []string{"ab", "never"}), "remove")
		keys, _ = h.c.OmapKeys(h.ctx, p, obj)
		if !slices.Equal(keys, []string{"a", "b"}) {
			h.t.Fatalf("keys after removal %v", keys)
		}
		h.must(h.c.RemoveOmapKeys(h.ctx, p, "ct-"+h.id+"-none", []string{"x"}), "remove from a missing object")
	}},
	{"ManagerTasksFlattenAndRemove", func(h *harness) {
		p := h.create(h.pool(), "parent")
		h.must(h.c.CreateSnapshot(h.ctx, p, "s"), "snapshot")
		c := h.spec(h.pool(), "clone")
		h.must(h.c.CloneImage(h.ctx, p, "s", c, ceph.ImageOptions{Features: []string{"layering"}}), "clone")
		if err := h.c.AddFlattenTask(h.ctx, c); errors.Is(err, ceph.ErrTasksUnsupported) {
			// Debian trixie's Reef mgr cannot load rbd_support (PyO3
			// modules in subinterpreters); the rbd backend then runs
			// these tasks itself, which its own tests cover there.
			h.t.Skipf("this cluster's manager has no rbd task commands (%v)", err)
		} else {
			h.must(err, "add flatten")
		}
		h.must(h.c.AddFlattenTask(h.ctx, p), "flatten an image without a parent (done)")
		h.await("the manager flattens the clone", func() (bool, error) {
			info, err := h.c.StatImage(h.ctx, c, "")
			return err == nil && info.Parent == nil, err
		})
		info, _ := h.c.StatImage(h.ctx, c, "")
		h.must(h.c.TrashMove(h.ctx, c), "trash")
		h.must(h.c.AddTrashRemoveTask(h.ctx, h.pool(), info.ID), "add trash remove")
		h.await("the manager removes the trashed image", func() (bool, error) {
			trash, err := h.c.Trash(h.ctx, h.pool())
			return !slices.ContainsFunc(trash, func(e ceph.TrashEntry) bool { return e.ID == info.ID }), err
		})
		if _, err := h.c.Tasks(h.ctx); err != nil {
			h.t.Fatalf("list tasks: %v", err)
		}
	}},
	{"TheClusterItself", func(h *harness) {
		rel, err := h.c.Release(h.ctx)
		h.must(err, "release")
		if rel.Before(ceph.OldestSupported) {
			h.t.Fatalf("release %s", rel)
		}
		n, err := h.c.PoolAvailable(h.ctx, h.env.Pool)
		if err != nil || n <= 0 {
			h.t.Fatalf("pool available %d %v", n, err)
		}
		_, err = h.c.PoolAvailable(h.ctx, "no-such-pool-"+h.id)
		h.wantKind(err, errdefs.ErrNotFound, "a missing pool's room")
		mgr, err := h.c.ManagerClients(h.ctx)
		if err != nil || len(mgr) == 0 {
			h.t.Fatalf("manager clients %v %v", mgr, err)
		}
	}},
	{"AWrongKeyIsRefusedAtOnce", func(h *harness) {
		t := h.env.Target
		t.Key = "AQD" + randomHex(18) + "=="
		t.CallLimit = 10 * time.Second
		start := time.Now()
		_, err := h.env.Dialer.Dial(h.ctx, t)
		if errdefs.KindOf(err) != errdefs.ErrPrecondition || time.Since(start) > 9*time.Second {
			h.t.Fatalf("a wrong key: %v after %s, want FAILED_PRECONDITION before the call limit", err, time.Since(start))
		}
		if err != nil && strings.Contains(err.Error(), t.Key) {
			h.t.Fatalf("the error shows the key: %v", err)
		}
	}},
	{"ParallelCallsShareTheConnection", func(h *harness) {
		var wg sync.WaitGroup
		errs := make([]error, 20)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cl, err := h.env.Dialer.Dial(h.ctx, h.env.Target)
				if err == nil {
					err = cl.CreateImage(h.ctx, h.spec(h.pool(), fmt.Sprintf("p%d", i)), 1<<20, ceph.ImageOptions{Features: []string{"layering"}})
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			h.t.Fatalf("parallel creates: %v", err)
		}
	}},
}

// snapsOfID lists a (trashed) image's snapshots by its ID.
func (h *harness) snapsOfID(id string) []ceph.SnapInfo {
	h.t.Helper()
	list, err := h.c.SnapshotsOfID(h.ctx, h.pool(), id)
	h.must(err, "list snapshots of image ID %s", id)
	return list
}
