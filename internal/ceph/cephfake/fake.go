// Package cephfake is an in-memory Ceph cluster that implements
// ceph.Client as the real cluster behaves (the contract suite in
// internal/ceph/cephtest runs against both): RBD images with their
// metadata and snapshots in every namespace, format-2 clones whose parent
// snapshot waits in the trash namespace until its last clone goes, the
// pool trash, watchers and locks, the manager's rbd tasks, omap objects,
// cephx users. Failures are injected around it (cephtest.Intercept), as
// around the real client. Image data is not kept: what data tests need
// runs on a real cluster.
package cephfake

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spindle-csi/spindle/internal/ceph"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Cluster is one fake cluster. Its zero value is not usable: New.
type Cluster struct {
	mu       sync.Mutex
	release  ceph.Release
	users    map[string]string // cephx user → key
	pools    map[string]bool
	nss      map[ceph.PoolSpec]*namespace
	avail    map[string]int64
	nextID   uint64
	nextSnap uint64
	tasks    []*task
	nextTask int
	// ManualTasks holds the manager's tasks until RunTasks; by default a
	// task runs as it is added.
	manualTasks bool
	noTasks     bool // the manager has no rbd_support module
	mgrClients  []string
	blocklist   []string
	now         func() time.Time
}

type namespace struct {
	images map[string]*image // by ID, trashed ones too
	omap   map[string]map[string][]byte
}

type image struct {
	id, name  string
	pool      ceph.PoolSpec
	size      uint64
	features  []string
	created   time.Time
	parent    *parentRef
	meta      map[string]string
	snaps     []*snapshot
	watchers  []string
	locks     []ceph.Lock
	trashed   bool
	cloneV1   bool // a clone of format 1: its parent snapshot stays protected
	dataPool  string
	trashedAt time.Time
}

type parentRef struct {
	pool    ceph.PoolSpec
	imageID string
	snapID  uint64
}

type snapshot struct {
	id        uint64
	name      string
	ns        ceph.SnapNamespace
	protected bool
	created   time.Time
	size      uint64
	parent    *parentRef // the image's parent when taken
}

type task struct {
	ceph.Task
	pool ceph.PoolSpec
}

// DefaultRelease is the release a new fake cluster runs.
var DefaultRelease = ceph.Release{Major: 20, Minor: 2, Patch: 4, Name: "tentacle"}

// New is a cluster with the given pools, user "admin" with key
// AdminKey, and the manager's client at ManagerAddr.
func New(pools ...string) *Cluster {
	c := &Cluster{
		release:    DefaultRelease,
		users:      map[string]string{"admin": AdminKey},
		pools:      map[string]bool{},
		nss:        map[ceph.PoolSpec]*namespace{},
		avail:      map[string]int64{},
		mgrClients: []string{ManagerAddr},
		now:        time.Now,
	}
	for _, p := range pools {
		c.AddPool(p)
	}
	return c
}

// AdminKey is the fake admin's key; ManagerAddr the manager's client.
const (
	AdminKey    = "AQBfakefakefakefakefakefakefakefakefake=="
	ManagerAddr = "127.0.0.1:0/1000"
)

// Reset empties the cluster as a new one of the same pools and users:
// no image, trash, omap object, task or blocklist entry.
func (c *Cluster) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nss = map[ceph.PoolSpec]*namespace{}
	c.tasks, c.blocklist = nil, nil
	c.manualTasks, c.noTasks = false, false
}

// AddPool creates a pool with 100 GiB available.
func (c *Cluster) AddPool(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pools[name] = true
	c.avail[name] = 100 << 30
}

// SetAvailable sets what ceph df reports as a pool's max_avail.
func (c *Cluster) SetAvailable(pool string, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.avail[pool] = n
}

// AddUser adds (or changes) a cephx user.
func (c *Cluster) AddUser(user, key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.users[user] = key
}

// SetRelease makes the cluster's monitors run release r.
func (c *Cluster) SetRelease(r ceph.Release) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.release = r
}

// SetClock sets the cluster's clock (creation times of images and
// snapshots).
func (c *Cluster) SetClock(now func() time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = now
}

// ManualTasks makes the manager keep its tasks until RunTasks.
func (c *Cluster) ManualTasks(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.manualTasks = on
}

// NoTaskModule makes the manager answer that it has no rbd_support.
func (c *Cluster) NoTaskModule(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.noTasks = on
}

// Blocklisted returns the blocklisted addresses.
func (c *Cluster) Blocklisted() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.blocklist)
}

// Dialer gives clients of this cluster: a target whose user is not one
// of the cluster's, or whose key is not that user's, is refused as the
// real cluster refuses it.
func (c *Cluster) Dialer() ceph.Dialer { return dialer{c} }

type dialer struct{ c *Cluster }

func (d dialer) Dial(ctx context.Context, t ceph.Target) (ceph.Client, error) {
	user := t.User
	if user == "" {
		user = "admin" // the config file's identity
	} else if key, ok := d.c.users[user]; !ok || (t.Key != "" && key != t.Key) {
		op := "connect to the Ceph cluster as client." + user + " at " + strings.Join(t.Monitors, ",")
		return nil, errdefs.Wrap(errdefs.ErrPrecondition, &ceph.Error{Op: op, Errno: ceph.EACCES}, "%s: the cluster refused the cephx key (wrong key, or no such user)", op)
	}
	d.c.mu.Lock()
	rel := d.c.release
	d.c.mu.Unlock()
	if rel.Before(ceph.OldestSupported) {
		return nil, errdefs.Precondition("the Ceph cluster at %s runs Ceph %s; Spindle needs %d.%d (%s) or newer", strings.Join(t.Monitors, ","), rel, ceph.OldestSupported.Major, ceph.OldestSupported.Minor, ceph.OldestSupported.Name)
	}
	return &client{c: d.c, user: user}, nil
}

// Client is a client of the cluster as user admin, without a Dialer.
func (c *Cluster) Client() ceph.Client { return &client{c: c, user: "admin"} }

type client struct {
	c    *Cluster
	user string
}

// call is one call of a client: its name and what it names.
type call struct {
	Op    string
	Image ceph.ImageSpec
	Snap  string
	Keys  []string
}

// begin locks the cluster for a call (the returned function unlocks it),
// unless the call's context has ended.
func (cl *client) begin(ctx context.Context, c call) (func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: stopped by the request's own deadline or cancellation: %w", c.Op, err)
	}
	cl.c.mu.Lock()
	return cl.c.mu.Unlock, nil
}

func errno(n int, op string, args ...any) error { return ceph.Errorf(n, op, args...) }

func (c *Cluster) ns(p ceph.PoolSpec) (*namespace, error) {
	if !c.pools[p.Pool] {
		return nil, errno(ceph.ENOENT, "open pool %s", p.Pool)
	}
	n := c.nss[p]
	if n == nil {
		n = &namespace{images: map[string]*image{}, omap: map[string]map[string][]byte{}}
		c.nss[p] = n
	}
	return n, nil
}

// byName finds a live (not trashed) image by name.
func (c *Cluster) byName(spec ceph.ImageSpec) (*image, error) {
	n, err := c.ns(spec.PoolSpec)
	if err != nil {
		return nil, err
	}
	for _, img := range n.images {
		if img.name == spec.Name && !img.trashed {
			return img, nil
		}
	}
	return nil, errno(ceph.ENOENT, "open image %s", spec)
}

func (c *Cluster) byID(p ceph.PoolSpec, id string) (*image, error) {
	n, err := c.ns(p)
	if err != nil {
		return nil, err
	}
	if img := n.images[id]; img != nil {
		return img, nil
	}
	return nil, errno(ceph.ENOENT, "open image ID %s", p.Image(id))
}

func (img *image) snap(name string) *snapshot {
	for _, s := range img.snaps {
		if s.name == name {
			return s
		}
	}
	return nil
}

func (img *image) snapByID(id uint64) *snapshot {
	for _, s := range img.snaps {
		if s.id == id {
			return s
		}
	}
	return nil
}

func newID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// children are the clones of img@snapID, trashed ones too.
func (c *Cluster) children(img *image, snapID uint64) []*image {
	var out []*image
	for _, n := range c.nss {
		for _, ch := range n.images {
			if ch.parent != nil && ch.parent.pool == img.pool && ch.parent.imageID == img.id && ch.parent.snapID == snapID {
				out = append(out, ch)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// hasChildren also counts snapshots of other images that still hang
// from img@snapID (a clone flattened without deep-flatten).
func (c *Cluster) hasChildren(img *image, snapID uint64) bool {
	if len(c.children(img, snapID)) > 0 {
		return true
	}
	for _, n := range c.nss {
		for _, other := range n.images {
			for _, s := range other.snaps {
				if s.parent != nil && s.parent.pool == img.pool && s.parent.imageID == img.id && s.parent.snapID == snapID {
					return true
				}
			}
		}
	}
	return false
}

// detach drops a parent reference and removes the parent's snapshot if
// it waits in the trash namespace for its last clone, as librbd does.
func (c *Cluster) detach(p *parentRef) {
	if p == nil {
		return
	}
	parent, err := c.byID(p.pool, p.imageID)
	if err != nil {
		return
	}
	s := parent.snapByID(p.snapID)
	if s == nil || s.ns != ceph.SnapTrash || c.hasChildren(parent, p.snapID) {
		return
	}
	parent.snaps = slices.DeleteFunc(parent.snaps, func(x *snapshot) bool { return x == s })
}

// defaultFeatures are Ceph's rbd_default_features.
var defaultFeatures = []string{"deep-flatten", "exclusive-lock", "fast-diff", "layering", "object-map"}

func features(opts ceph.ImageOptions) ([]string, error) {
	f := slices.Clone(opts.Features)
	if len(f) == 0 {
		f = slices.Clone(defaultFeatures)
	}
	known := map[string]string{"layering": "", "exclusive-lock": "", "object-map": "exclusive-lock", "fast-diff": "object-map", "deep-flatten": "", "journaling": "exclusive-lock", "striping": ""}
	for _, x := range f {
		need, ok := known[x]
		if !ok || (need != "" && !slices.Contains(f, need)) {
			return nil, fmt.Errorf("feature %q", x)
		}
	}
	if opts.DataPool != "" {
		f = append(f, "data-pool")
	}
	if opts.StripeUnit > 0 || opts.StripeCount > 1 {
		f = append(f, "striping")
	}
	slices.Sort(f)
	return slices.Compact(f), nil
}

func (cl *client) Release(ctx context.Context) (ceph.Release, error) {
	unlock, err := cl.begin(ctx, call{Op: "Release"})
	if err != nil {
		return ceph.Release{}, err
	}
	defer unlock()
	return cl.c.release, nil
}

func (cl *client) PoolAvailable(ctx context.Context, pool string) (int64, error) {
	unlock, err := cl.begin(ctx, call{Op: "PoolAvailable", Image: ceph.ImageSpec{PoolSpec: ceph.PoolSpec{Pool: pool}}})
	if err != nil {
		return 0, err
	}
	defer unlock()
	if !cl.c.pools[pool] {
		return 0, errdefs.NotFound("ceph df lists no pool %s", pool)
	}
	return cl.c.avail[pool], nil
}

func (cl *client) ManagerClients(ctx context.Context) ([]string, error) {
	unlock, err := cl.begin(ctx, call{Op: "ManagerClients"})
	if err != nil {
		return nil, err
	}
	defer unlock()
	return slices.Clone(cl.c.mgrClients), nil
}

func (cl *client) Blocklist(ctx context.Context, addr string) error {
	unlock, err := cl.begin(ctx, call{Op: "Blocklist"})
	if err != nil {
		return err
	}
	defer unlock()
	cl.c.blocklist = append(cl.c.blocklist, addr)
	// A blocklisted client's watches go (the real cluster drops them once
	// the client's session is refused).
	for _, n := range cl.c.nss {
		for _, img := range n.images {
			img.watchers = slices.DeleteFunc(img.watchers, func(w string) bool { return w == addr })
		}
	}
	return nil
}

func (cl *client) addTask(ctx context.Context, op call, t ceph.Task) error {
	unlock, err := cl.begin(ctx, op)
	if err != nil {
		return err
	}
	defer unlock()
	c := cl.c
	if c.noTasks {
		return fmt.Errorf("%w: %v", ceph.ErrTasksUnsupported, errno(ceph.EINVAL, "rbd task add"))
	}
	for _, x := range c.tasks {
		if x.Action == t.Action && x.Pool == t.Pool && x.Image == t.Image && x.ImageID == t.ImageID {
			return nil // the manager answers with the task it has
		}
	}
	switch t.Action {
	case ceph.TaskFlatten:
		img, err := c.byName(t.Pool.Image(t.Image))
		if err != nil {
			return err
		}
		if img.parent == nil {
			return nil // flattened already
		}
	case ceph.TaskTrashRemove:
		img, err := c.byID(t.Pool, t.ImageID)
		if err != nil {
			return err
		}
		if !img.trashed {
			return errno(ceph.EINVAL, "rbd task add trash remove %s: image is not in the trash", t.Pool.Image(t.ImageID))
		}
	}
	c.nextTask++
	t.ID = fmt.Sprintf("task-%d", c.nextTask)
	t.Progress = -1
	t.Message = fmt.Sprintf("%s %s", t.Action, t.Pool.Image(t.Image+t.ImageID))
	c.tasks = append(c.tasks, &task{Task: t, pool: t.Pool})
	if !c.manualTasks {
		c.runTasksLocked()
	}
	return nil
}

// RunTasks runs the manager's queued tasks (ManualTasks).
func (c *Cluster) RunTasks() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runTasksLocked()
}

func (c *Cluster) runTasksLocked() {
	var keep []*task
	for _, t := range c.tasks {
		switch t.Action {
		case ceph.TaskFlatten:
			if img, err := c.byName(t.Pool.Image(t.Image)); err == nil {
				if err := c.flatten(img); err != nil {
					t.RetryMessage = err.Error()
					keep = append(keep, t)
				}
			}
		case ceph.TaskTrashRemove:
			if img, err := c.byID(t.Pool, t.ImageID); err == nil {
				if err := c.remove(img); err != nil {
					t.RetryMessage = err.Error()
					keep = append(keep, t)
				}
			}
		}
	}
	c.tasks = keep
}

func (cl *client) AddFlattenTask(ctx context.Context, spec ceph.ImageSpec) error {
	return cl.addTask(ctx, call{Op: "AddFlattenTask", Image: spec}, ceph.Task{Action: ceph.TaskFlatten, Pool: spec.PoolSpec, Image: spec.Name})
}

func (cl *client) AddTrashRemoveTask(ctx context.Context, pool ceph.PoolSpec, id string) error {
	return cl.addTask(ctx, call{Op: "AddTrashRemoveTask", Image: pool.Image(id)}, ceph.Task{Action: ceph.TaskTrashRemove, Pool: pool, ImageID: id})
}

func (cl *client) Tasks(ctx context.Context) ([]ceph.Task, error) {
	unlock, err := cl.begin(ctx, call{Op: "Tasks"})
	if err != nil {
		return nil, err
	}
	defer unlock()
	if cl.c.noTasks {
		return nil, ceph.ErrTasksUnsupported
	}
	out := make([]ceph.Task, 0, len(cl.c.tasks))
	for _, t := range cl.c.tasks {
		out = append(out, t.Task)
	}
	return out, nil
}

func (cl *client) CreateImage(ctx context.Context, spec ceph.ImageSpec, size uint64, opts ceph.ImageOptions) error {
	unlock, err := cl.begin(ctx, call{Op: "CreateImage", Image: spec})
	if err != nil {
		return err
	}
	defer unlock()
	return cl.c.create(spec, size, opts, nil)
}

func (c *Cluster) create(spec ceph.ImageSpec, size uint64, opts ceph.ImageOptions, parent *parentRef) error {
	n, err := c.ns(spec.PoolSpec)
	if err != nil {
		return err
	}
	if _, err := c.byName(spec); err == nil {
		return errno(ceph.EEXIST, "create image %s", spec)
	}
	if opts.DataPool != "" && !c.pools[opts.DataPool] {
		return errno(ceph.ENOENT, "create image %s: data pool %s", spec, opts.DataPool)
	}
	f, err := features(opts)
	if err != nil {
		return errno(ceph.EINVAL, "create image %s: %v", spec, err)
	}
	if parent != nil {
		if !slices.Contains(f, "layering") {
			return errno(ceph.EINVAL, "clone %s: the clone needs the layering feature", spec)
		}
		f = append(f, "operations")
		slices.Sort(f)
	}
	img := &image{id: newID(), name: spec.Name, pool: spec.PoolSpec, size: size, features: f, created: c.now(),
		parent: parent, meta: map[string]string{}, dataPool: opts.DataPool}
	if parent != nil {
		// A clone starts with its parent's metadata, as librbd copies it.
		if p, err := c.byID(parent.pool, parent.imageID); err == nil {
			img.meta = maps.Clone(p.meta)
		}
	}
	n.images[img.id] = img
	return nil
}

func (cl *client) CloneImage(ctx context.Context, parent ceph.ImageSpec, snap string, child ceph.ImageSpec, opts ceph.ImageOptions) error {
	unlock, err := cl.begin(ctx, call{Op: "CloneImage", Image: child, Snap: parent.At(snap)})
	if err != nil {
		return err
	}
	defer unlock()
	c := cl.c
	p, err := c.byName(parent)
	if err != nil {
		return err
	}
	s := p.snap(snap)
	if s == nil || s.ns != ceph.SnapUser {
		return errno(ceph.ENOENT, "clone %s: no such snapshot", parent.At(snap))
	}
	if !slices.Contains(p.features, "layering") {
		return errno(ceph.ENOSYS, "clone %s: the parent has no layering feature", parent.At(snap))
	}
	return c.create(child, s.size, opts, &parentRef{pool: p.pool, imageID: p.id, snapID: s.id})
}

func (c *Cluster) parentInfo(p *parentRef) *ceph.Parent {
	if p == nil {
		return nil
	}
	out := &ceph.Parent{Pool: p.pool.Pool, Namespace: p.pool.Namespace, ImageID: p.imageID, SnapID: p.snapID}
	if img, err := c.byID(p.pool, p.imageID); err == nil {
		out.Image, out.Trash = img.name, img.trashed
		if s := img.snapByID(p.snapID); s != nil {
			out.Snapshot = s.name
		}
	}
	return out
}

func (c *Cluster) info(img *image, s *snapshot) *ceph.ImageInfo {
	info := &ceph.ImageInfo{ID: img.id, Size: img.size, Features: slices.Clone(img.features), Created: img.created, Parent: c.parentInfo(img.parent)}
	if s != nil {
		info.Size = s.size
		info.Parent = c.parentInfo(s.parent)
	}
	return info
}

func (cl *client) StatImage(ctx context.Context, spec ceph.ImageSpec, snap string) (*ceph.ImageInfo, error) {
	unlock, err := cl.begin(ctx, call{Op: "StatImage", Image: spec, Snap: snap})
	if err != nil {
		return nil, err
	}
	defer unlock()
	img, err := cl.c.byName(spec)
	if err != nil {
		return nil, err
	}
	var s *snapshot
	if snap != "" {
		if s = img.snap(snap); s == nil {
			return nil, errno(ceph.ENOENT, "open snapshot %s", spec.At(snap))
		}
	}
	return cl.c.info(img, s), nil
}

func (cl *client) DescribeImage(ctx context.Context, spec ceph.ImageSpec) (*ceph.ImageInfo, map[string]string, error) {
	unlock, err := cl.begin(ctx, call{Op: "DescribeImage", Image: spec})
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	img, err := cl.c.byName(spec)
	if err != nil {
		return nil, nil, err
	}
	return cl.c.info(img, nil), maps.Clone(img.meta), nil
}

// metadataOf is a copy of the image's metadata, never nil (as Ceph's
// listing is an empty map for an image without any).
func metadataOf(img *image) map[string]string {
	meta := maps.Clone(img.meta)
	if meta == nil {
		meta = map[string]string{}
	}
	return meta
}

func (cl *client) ImageHeader(ctx context.Context, spec ceph.ImageSpec) (*ceph.ImageHeader, error) {
	img, unlock, err := cl.image(ctx, call{Op: "ImageHeader", Image: spec})
	if err != nil {
		return nil, err
	}
	defer unlock()
	return &ceph.ImageHeader{ID: img.id, Size: img.size, Features: cl.c.info(img, nil).Features, Created: img.created, Metadata: metadataOf(img), Snapshots: len(img.snaps)}, nil
}

// image finds a live image for a call, under the lock.
func (cl *client) image(ctx context.Context, op call) (*image, func(), error) {
	unlock, err := cl.begin(ctx, op)
	if err != nil {
		return nil, nil, err
	}
	img, err := cl.c.byName(op.Image)
	if err != nil {
		unlock()
		return nil, nil, err
	}
	return img, unlock, nil
}

func (cl *client) ResizeImage(ctx context.Context, spec ceph.ImageSpec, size uint64) error {
	img, unlock, err := cl.image(ctx, call{Op: "ResizeImage", Image: spec})
	if err != nil {
		return err
	}
	defer unlock()
	img.size = size
	return nil
}

func (cl *client) RenameImage(ctx context.Context, spec ceph.ImageSpec, newName string) error {
	img, unlock, err := cl.image(ctx, call{Op: "RenameImage", Image: spec})
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := cl.c.byName(spec.PoolSpec.Image(newName)); err == nil {
		return errno(ceph.EEXIST, "rename image %s to %s", spec, newName)
	}
	img.name = newName
	return nil
}

// remove removes an image and its data (a trashed one too).
func (c *Cluster) remove(img *image) error {
	if len(img.snaps) > 0 {
		return errno(ceph.ENOTEMPTY, "remove image %s: image has snapshots", img.pool.Image(img.name))
	}
	if len(img.watchers) > 0 {
		return errno(ceph.EBUSY, "remove image %s: image still has watchers", img.pool.Image(img.name))
	}
	delete(c.nss[img.pool].images, img.id)
	c.detach(img.parent)
	return nil
}

func (cl *client) RemoveImage(ctx context.Context, spec ceph.ImageSpec) error {
	img, unlock, err := cl.image(ctx, call{Op: "RemoveImage", Image: spec})
	if err != nil {
		return err
	}
	defer unlock()
	return cl.c.remove(img)
}

func (cl *client) ListImages(ctx context.Context, pool ceph.PoolSpec) ([]string, error) {
	unlock, err := cl.begin(ctx, call{Op: "ListImages", Image: pool.Image("")})
	if err != nil {
		return nil, err
	}
	defer unlock()
	n, err := cl.c.ns(pool)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, img := range n.images {
		if !img.trashed {
			out = append(out, img.name)
		}
	}
	slices.Sort(out)
	return out, nil
}

func (c *Cluster) flatten(img *image) error {
	if img.parent == nil {
		return errno(ceph.EINVAL, "flatten image %s: image has no parent", img.pool.Image(img.name))
	}
	p := img.parent
	img.parent = nil
	if slices.Contains(img.features, "deep-flatten") {
		for _, s := range img.snaps {
			s.parent = nil
		}
	}
	c.detach(p)
	return nil
}

func (cl *client) FlattenImage(ctx context.Context, spec ceph.ImageSpec) error {
	img, unlock, err := cl.image(ctx, call{Op: "FlattenImage", Image: spec})
	if err != nil {
		return err
	}
	defer unlock()
	return cl.c.flatten(img)
}

func (cl *client) ImageMetadata(ctx context.Context, spec ceph.ImageSpec) (map[string]string, error) {
	img, unlock, err := cl.image(ctx, call{Op: "ImageMetadata", Image: spec})
	if err != nil {
		return nil, err
	}
	defer unlock()
	return maps.Clone(img.meta), nil
}

func (cl *client) ImageMetadataValue(ctx context.Context, spec ceph.ImageSpec, key string) (string, error) {
	img, unlock, err := cl.image(ctx, call{Op: "ImageMetadataValue", Image: spec, Keys: []string{key}})
	if err != nil {
		return "", err
	}
	defer unlock()
	v, ok := img.meta[key]
	if !ok {
		return "", errno(ceph.ENOENT, "get metadata %s of %s", key, spec)
	}
	return v, nil
}

func (cl *client) SetImageMetadata(ctx context.Context, spec ceph.ImageSpec, kv map[string]string) error {
	img, unlock, err := cl.image(ctx, call{Op: "SetImageMetadata", Image: spec, Keys: slices.Sorted(maps.Keys(kv))})
	if err != nil {
		return err
	}
	defer unlock()
	for k, v := range kv {
		if v == "" {
			delete(img.meta, k)
		} else {
			img.meta[k] = v
		}
	}
	return nil
}

func snapInfos(img *image) []ceph.SnapInfo {
	out := make([]ceph.SnapInfo, 0, len(img.snaps))
	for _, s := range img.snaps {
		out = append(out, ceph.SnapInfo{ID: s.id, Name: s.name, Namespace: s.ns, Protected: s.protected, Created: s.created})
	}
	return out
}

func (cl *client) Snapshots(ctx context.Context, spec ceph.ImageSpec) ([]ceph.SnapInfo, error) {
	img, unlock, err := cl.image(ctx, call{Op: "Snapshots", Image: spec})
	if err != nil {
		return nil, err
	}
	defer unlock()
	return snapInfos(img), nil
}

func (cl *client) SnapshotsOfID(ctx context.Context, pool ceph.PoolSpec, id string) ([]ceph.SnapInfo, error) {
	unlock, err := cl.begin(ctx, call{Op: "SnapshotsOfID", Image: pool.Image(id)})
	if err != nil {
		return nil, err
	}
	defer unlock()
	img, err := cl.c.byID(pool, id)
	if err != nil {
		return nil, err
	}
	return snapInfos(img), nil
}

func (cl *client) CreateSnapshot(ctx context.Context, spec ceph.ImageSpec, snap string) error {
	img, unlock, err := cl.image(ctx, call{Op: "CreateSnapshot", Image: spec, Snap: snap})
	if err != nil {
		return err
	}
	defer unlock()
	if img.snap(snap) != nil {
		return errno(ceph.EEXIST, "create snapshot %s", spec.At(snap))
	}
	cl.c.nextSnap++
	var parent *parentRef
	if img.parent != nil {
		p := *img.parent
		parent = &p
	}
	img.snaps = append(img.snaps, &snapshot{id: cl.c.nextSnap, name: snap, ns: ceph.SnapUser, created: cl.c.now(), size: img.size, parent: parent})
	return nil
}

func (cl *client) RemoveSnapshot(ctx context.Context, spec ceph.ImageSpec, snap string) error {
	img, unlock, err := cl.image(ctx, call{Op: "RemoveSnapshot", Image: spec, Snap: snap})
	if err != nil {
		return err
	}
	defer unlock()
	s := img.snap(snap)
	if s == nil {
		return errno(ceph.ENOENT, "remove snapshot %s", spec.At(snap))
	}
	if s.protected {
		return errno(ceph.EBUSY, "remove snapshot %s: snapshot is protected", spec.At(snap))
	}
	if cl.c.hasChildren(img, s.id) {
		// Format 2: it waits in the trash namespace for its last clone.
		s.ns, s.name = ceph.SnapTrash, newUUID()
		return nil
	}
	img.snaps = slices.DeleteFunc(img.snaps, func(x *snapshot) bool { return x == s })
	return nil
}

func newUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func (cl *client) UnprotectSnapshot(ctx context.Context, spec ceph.ImageSpec, snap string) error {
	img, unlock, err := cl.image(ctx, call{Op: "UnprotectSnapshot", Image: spec, Snap: snap})
	if err != nil {
		return err
	}
	defer unlock()
	s := img.snap(snap)
	switch {
	case s == nil:
		return errno(ceph.ENOENT, "unprotect snapshot %s", spec.At(snap))
	case !s.protected:
		return nil
	case slices.ContainsFunc(cl.c.children(img, s.id), func(ch *image) bool { return ch.cloneV1 }):
		return errno(ceph.EBUSY, "unprotect snapshot %s: clones of format 1 hang from it", spec.At(snap))
	}
	s.protected = false
	return nil
}

func (cl *client) Children(ctx context.Context, spec ceph.ImageSpec, snap string) ([]ceph.Child, error) {
	img, unlock, err := cl.image(ctx, call{Op: "Children", Image: spec, Snap: snap})
	if err != nil {
		return nil, err
	}
	defer unlock()
	s := img.snap(snap)
	if s == nil {
		return nil, errno(ceph.ENOENT, "open snapshot %s", spec.At(snap))
	}
	var out []ceph.Child
	for _, ch := range cl.c.children(img, s.id) {
		out = append(out, ceph.Child{Pool: ch.pool.Pool, Namespace: ch.pool.Namespace, Image: ch.name, ImageID: ch.id, Trash: ch.trashed})
	}
	return out, nil
}

func (cl *client) TrashMove(ctx context.Context, spec ceph.ImageSpec) error {
	img, unlock, err := cl.image(ctx, call{Op: "TrashMove", Image: spec})
	if err != nil {
		return err
	}
	defer unlock()
	img.trashed, img.trashedAt = true, cl.c.now()
	return nil
}

func (cl *client) Trash(ctx context.Context, pool ceph.PoolSpec) ([]ceph.TrashEntry, error) {
	unlock, err := cl.begin(ctx, call{Op: "Trash", Image: pool.Image("")})
	if err != nil {
		return nil, err
	}
	defer unlock()
	n, err := cl.c.ns(pool)
	if err != nil {
		return nil, err
	}
	var out []ceph.TrashEntry
	for _, img := range n.images {
		if img.trashed {
			out = append(out, ceph.TrashEntry{ID: img.id, Name: img.name})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name+out[i].ID < out[j].Name+out[j].ID })
	return out, nil
}

func (cl *client) TrashRemove(ctx context.Context, pool ceph.PoolSpec, id string) error {
	unlock, err := cl.begin(ctx, call{Op: "TrashRemove", Image: pool.Image(id)})
	if err != nil {
		return err
	}
	defer unlock()
	img, err := cl.c.byID(pool, id)
	if err != nil {
		return err
	}
	if !img.trashed {
		return errno(ceph.ENOENT, "remove trashed image %s: not in the trash", pool.Image(id))
	}
	return cl.c.remove(img)
}

func (cl *client) Watchers(ctx context.Context, spec ceph.ImageSpec) ([]string, error) {
	img, unlock, err := cl.image(ctx, call{Op: "Watchers", Image: spec})
	if err != nil {
		return nil, err
	}
	defer unlock()
	return slices.Clone(img.watchers), nil
}

func (cl *client) Locks(ctx context.Context, spec ceph.ImageSpec) ([]ceph.Lock, error) {
	img, unlock, err := cl.image(ctx, call{Op: "Locks", Image: spec})
	if err != nil {
		return nil, err
	}
	defer unlock()
	return slices.Clone(img.locks), nil
}

func (cl *client) InspectImage(ctx context.Context, spec ceph.ImageSpec) (*ceph.Inspection, error) {
	img, unlock, err := cl.image(ctx, call{Op: "InspectImage", Image: spec})
	if err != nil {
		return nil, err
	}
	defer unlock()
	return &ceph.Inspection{Info: *cl.c.info(img, nil), Metadata: metadataOf(img), Watchers: slices.Clone(img.watchers), Locks: slices.Clone(img.locks), Snapshots: snapInfos(img)}, nil
}

func (cl *client) BreakLock(ctx context.Context, spec ceph.ImageSpec, lock ceph.Lock) error {
	img, unlock, err := cl.image(ctx, call{Op: "BreakLock", Image: spec})
	if err != nil {
		return err
	}
	defer unlock()
	n := len(img.locks)
	img.locks = slices.DeleteFunc(img.locks, func(l ceph.Lock) bool { return l.Client == lock.Client && l.Cookie == lock.Cookie })
	if len(img.locks) == n {
		return errno(ceph.ENOENT, "break lock %s of %s", lock.Cookie, spec)
	}
	return nil
}

func (cl *client) omap(ctx context.Context, op string, pool ceph.PoolSpec, object string, keys []string) (*namespace, func(), error) {
	unlock, err := cl.begin(ctx, call{Op: op, Image: pool.Image(object), Keys: keys})
	if err != nil {
		return nil, nil, err
	}
	n, err := cl.c.ns(pool)
	if err != nil {
		unlock()
		return nil, nil, err
	}
	return n, unlock, nil
}

func (cl *client) SetOmap(ctx context.Context, pool ceph.PoolSpec, object string, kv map[string][]byte) error {
	n, unlock, err := cl.omap(ctx, "SetOmap", pool, object, slices.Sorted(maps.Keys(kv)))
	if err != nil {
		return err
	}
	defer unlock()
	if n.omap[object] == nil {
		n.omap[object] = map[string][]byte{}
	}
	for k, v := range kv {
		n.omap[object][k] = slices.Clone(v)
	}
	return nil
}

func (cl *client) OmapValue(ctx context.Context, pool ceph.PoolSpec, object, key string) ([]byte, error) {
	n, unlock, err := cl.omap(ctx, "OmapValue", pool, object, []string{key})
	if err != nil {
		return nil, err
	}
	defer unlock()
	v, ok := n.omap[object][key]
	if !ok {
		return nil, errno(ceph.ENOENT, "read omap key %s of %s/%s", key, pool, object)
	}
	return slices.Clone(v), nil
}

func (cl *client) OmapKeys(ctx context.Context, pool ceph.PoolSpec, object string) ([]string, error) {
	n, unlock, err := cl.omap(ctx, "OmapKeys", pool, object, nil)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return slices.Sorted(maps.Keys(n.omap[object])), nil
}

func (cl *client) RemoveOmapKeys(ctx context.Context, pool ceph.PoolSpec, object string, keys []string) error {
	n, unlock, err := cl.omap(ctx, "RemoveOmapKeys", pool, object, keys)
	if err != nil {
		return err
	}
	defer unlock()
	for _, k := range keys {
		delete(n.omap[object], k)
	}
	return nil
}

var _ ceph.Client = (*client)(nil)

// Protect protects a snapshot, as releases before Mimic's clone format 2
// needed for clones (and earlier versions of Spindle did).
func (c *Cluster) Protect(spec ceph.ImageSpec, snap string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	img, err := c.byName(spec)
	if err != nil {
		return err
	}
	s := img.snap(snap)
	if s == nil {
		return errno(ceph.ENOENT, "protect snapshot %s", spec.At(snap))
	}
	s.protected = true
	return nil
}

// CloneV1 makes child a clone of format 1 of parent@snap, which must be
// protected, as Ceph before Mimic (and earlier versions of Spindle) made
// them.
func (c *Cluster) CloneV1(parent ceph.ImageSpec, snap string, child ceph.ImageSpec) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, err := c.byName(parent)
	if err != nil {
		return err
	}
	s := p.snap(snap)
	switch {
	case s == nil:
		return errno(ceph.ENOENT, "clone %s", parent.At(snap))
	case !s.protected:
		return errno(ceph.EINVAL, "clone %s: parent snapshot must be protected", parent.At(snap))
	}
	if err := c.create(child, s.size, ceph.ImageOptions{Features: []string{"layering"}}, &parentRef{pool: p.pool, imageID: p.id, snapID: s.id}); err != nil {
		return err
	}
	img, _ := c.byName(child)
	img.cloneV1 = true
	return nil
}

// Watch opens the image as a client at addr would (a node that mapped
// it); the returned function closes it.
func (c *Cluster) Watch(spec ceph.ImageSpec, addr string) (func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	img, err := c.byName(spec)
	if err != nil {
		return nil, err
	}
	img.watchers = append(img.watchers, addr)
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if i := slices.Index(img.watchers, addr); i >= 0 {
			img.watchers = slices.Delete(img.watchers, i, i+1)
		}
	}, nil
}

// Lock takes an advisory lock on the image.
func (c *Cluster) Lock(spec ceph.ImageSpec, lock ceph.Lock) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	img, err := c.byName(spec)
	if err != nil {
		return err
	}
	img.locks = append(img.locks, lock)
	return nil
}

// Everything lists what the cluster holds in a pool (namespace), as the
// real cluster's listings show it: "image", "image@snap" (snapshots of
// another namespace "image@<trash>..."), "trash:name" and omap objects
// "omap:object": what a pool Spindle emptied must not hold but its own
// records.
func (c *Cluster) Everything(p ceph.PoolSpec) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nss[p]
	if n == nil {
		return nil
	}
	var out []string
	for _, img := range n.images {
		name := img.name
		if img.trashed {
			name = "trash:" + name
		}
		out = append(out, name)
		for _, s := range img.snaps {
			if s.ns == ceph.SnapUser {
				out = append(out, name+"@"+s.name)
			} else {
				out = append(out, name+"@<"+string(s.ns)+">")
			}
		}
	}
	for obj, kv := range n.omap {
		if len(kv) > 0 {
			out = append(out, "omap:"+obj)
		}
	}
	slices.Sort(out)
	return out
}
