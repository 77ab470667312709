package cephtest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/spindle-csi/spindle/internal/ceph"
)

// Call is one call a client makes, as an interceptor's hook sees it.
type Call struct {
	Op    string // the ceph.Client method: "CreateImage", "SetImageMetadata", ...
	Image ceph.ImageSpec
	Snap  string   // the snapshot the call names, if any
	Keys  []string // the metadata or omap keys it sets or removes
}

// Intercept wraps d: every call of its clients runs hook first, and an
// error hook returns is the call's answer (nothing reaches the cluster).
// Failures are injected so, at any step, on the fake and on a real
// cluster alike.
func Intercept(d ceph.Dialer, hook func(context.Context, Call) error) ceph.Dialer {
	return interceptor{d: d, hook: hook}
}

type interceptor struct {
	d    ceph.Dialer
	hook func(context.Context, Call) error
}

func (i interceptor) Dial(ctx context.Context, t ceph.Target) (ceph.Client, error) {
	c, err := i.d.Dial(ctx, t)
	if err != nil {
		return nil, err
	}
	return intercepted{c: c, hook: i.hook}, nil
}

type intercepted struct {
	c    ceph.Client
	hook func(context.Context, Call) error
}

func (i intercepted) Release(ctx context.Context) (ceph.Release, error) {
	if err := i.hook(ctx, Call{Op: "Release"}); err != nil {
		return ceph.Release{}, err
	}
	return i.c.Release(ctx)
}

func (i intercepted) PoolAvailable(ctx context.Context, pool string) (int64, error) {
	if err := i.hook(ctx, Call{Op: "PoolAvailable", Image: ceph.ImageSpec{PoolSpec: ceph.PoolSpec{Pool: pool}}}); err != nil {
		return 0, err
	}
	return i.c.PoolAvailable(ctx, pool)
}

func (i intercepted) ManagerClients(ctx context.Context) ([]string, error) {
	if err := i.hook(ctx, Call{Op: "ManagerClients"}); err != nil {
		return nil, err
	}
	return i.c.ManagerClients(ctx)
}

func (i intercepted) Blocklist(ctx context.Context, addr string) error {
	if err := i.hook(ctx, Call{Op: "Blocklist"}); err != nil {
		return err
	}
	return i.c.Blocklist(ctx, addr)
}

func (i intercepted) AddFlattenTask(ctx context.Context, image ceph.ImageSpec) error {
	if err := i.hook(ctx, Call{Op: "AddFlattenTask", Image: image}); err != nil {
		return err
	}
	return i.c.AddFlattenTask(ctx, image)
}

func (i intercepted) AddTrashRemoveTask(ctx context.Context, pool ceph.PoolSpec, imageID string) error {
	if err := i.hook(ctx, Call{Op: "AddTrashRemoveTask", Image: pool.Image(imageID)}); err != nil {
		return err
	}
	return i.c.AddTrashRemoveTask(ctx, pool, imageID)
}

func (i intercepted) Tasks(ctx context.Context) ([]ceph.Task, error) {
	if err := i.hook(ctx, Call{Op: "Tasks"}); err != nil {
		return nil, err
	}
	return i.c.Tasks(ctx)
}

func (i intercepted) CreateImage(ctx context.Context, image ceph.ImageSpec, size uint64, opts ceph.ImageOptions) error {
	if err := i.hook(ctx, Call{Op: "CreateImage", Image: image}); err != nil {
		return err
	}
	return i.c.CreateImage(ctx, image, size, opts)
}

func (i intercepted) CloneImage(ctx context.Context, parent ceph.ImageSpec, snap string, child ceph.ImageSpec, opts ceph.ImageOptions) error {
	if err := i.hook(ctx, Call{Op: "CloneImage", Image: child, Snap: parent.At(snap)}); err != nil {
		return err
	}
	return i.c.CloneImage(ctx, parent, snap, child, opts)
}

func (i intercepted) StatImage(ctx context.Context, image ceph.ImageSpec, snap string) (*ceph.ImageInfo, error) {
	if err := i.hook(ctx, Call{Op: "StatImage", Image: image, Snap: snap}); err != nil {
		return nil, err
	}
	return i.c.StatImage(ctx, image, snap)
}

func (i intercepted) DescribeImage(ctx context.Context, image ceph.ImageSpec) (*ceph.ImageInfo, map[string]string, error) {
	if err := i.hook(ctx, Call{Op: "DescribeImage", Image: image}); err != nil {
		return nil, nil, err
	}
	return i.c.DescribeImage(ctx, image)
}

func (i intercepted) ResizeImage(ctx context.Context, image ceph.ImageSpec, size uint64) error {
	if err := i.hook(ctx, Call{Op: "ResizeImage", Image: image}); err != nil {
		return err
	}
	return i.c.ResizeImage(ctx, image, size)
}

func (i intercepted) RenameImage(ctx context.Context, image ceph.ImageSpec, newName string) error {
	if err := i.hook(ctx, Call{Op: "RenameImage", Image: image}); err != nil {
		return err
	}
	return i.c.RenameImage(ctx, image, newName)
}

func (i intercepted) RemoveImage(ctx context.Context, image ceph.ImageSpec) error {
	if err := i.hook(ctx, Call{Op: "RemoveImage", Image: image}); err != nil {
		return err
	}
	return i.c.RemoveImage(ctx, image)
}

func (i intercepted) ListImages(ctx context.Context, pool ceph.PoolSpec) ([]string, error) {
	if err := i.hook(ctx, Call{Op: "ListImages", Image: pool.Image("")}); err != nil {
		return nil, err
	}
	return i.c.ListImages(ctx, pool)
}

func (i intercepted) FlattenImage(ctx context.Context, image ceph.ImageSpec) error {
	if err := i.hook(ctx, Call{Op: "FlattenImage", Image: image}); err != nil {
		return err
	}
	return i.c.FlattenImage(ctx, image)
}

func (i intercepted) ImageMetadata(ctx context.Context, image ceph.ImageSpec) (map[string]string, error) {
	if err := i.hook(ctx, Call{Op: "ImageMetadata", Image: image}); err != nil {
		return nil, err
	}
	return i.c.ImageMetadata(ctx, image)
}

func (i intercepted) ImageMetadataValue(ctx context.Context, image ceph.ImageSpec, key string) (string, error) {
	if err := i.hook(ctx, Call{Op: "ImageMetadataValue", Image: image, Keys: []string{key}}); err != nil {
		return "", err
	}
	return i.c.ImageMetadataValue(ctx, image, key)
}

func (i intercepted) SetImageMetadata(ctx context.Context, image ceph.ImageSpec, kv map[string]string) error {
	if err := i.hook(ctx, Call{Op: "SetImageMetadata", Image: image, Keys: slices.Sorted(maps.Keys(kv))}); err != nil {
		return err
	}
	return i.c.SetImageMetadata(ctx, image, kv)
}

func (i intercepted) Snapshots(ctx context.Context, image ceph.ImageSpec) ([]ceph.SnapInfo, error) {
	if err := i.hook(ctx, Call{Op: "Snapshots", Image: image}); err != nil {
		return nil, err
	}
	return i.c.Snapshots(ctx, image)
}

func (i intercepted) SnapshotsOfID(ctx context.Context, pool ceph.PoolSpec, imageID string) ([]ceph.SnapInfo, error) {
	if err := i.hook(ctx, Call{Op: "SnapshotsOfID", Image: pool.Image(imageID)}); err != nil {
		return nil, err
	}
	return i.c.SnapshotsOfID(ctx, pool, imageID)
}

func (i intercepted) CreateSnapshot(ctx context.Context, image ceph.ImageSpec, snap string) error {
	if err := i.hook(ctx, Call{Op: "CreateSnapshot", Image: image, Snap: snap}); err != nil {
		return err
	}
	return i.c.CreateSnapshot(ctx, image, snap)
}

func (i intercepted) RemoveSnapshot(ctx context.Context, image ceph.ImageSpec, snap string) error {
	if err := i.hook(ctx, Call{Op: "RemoveSnapshot", Image: image, Snap: snap}); err != nil {
		return err
	}
	return i.c.RemoveSnapshot(ctx, image, snap)
}

func (i intercepted) UnprotectSnapshot(ctx context.Context, image ceph.ImageSpec, snap string) error {
	if err := i.hook(ctx, Call{Op: "UnprotectSnapshot", Image: image, Snap: snap}); err != nil {
		return err
	}
	return i.c.UnprotectSnapshot(ctx, image, snap)
}

func (i intercepted) Children(ctx context.Context, image ceph.ImageSpec, snap string) ([]ceph.Child, error) {
	if err := i.hook(ctx, Call{Op: "Children", Image: image, Snap: snap}); err != nil {
		return nil, err
	}
	return i.c.Children(ctx, image, snap)
}

func (i intercepted) TrashMove(ctx context.Context, image ceph.ImageSpec) error {
	if err := i.hook(ctx, Call{Op: "TrashMove", Image: image}); err != nil {
		return err
	}
	return i.c.TrashMove(ctx, image)
}

func (i intercepted) Trash(ctx context.Context, pool ceph.PoolSpec) ([]ceph.TrashEntry, error) {
	if err := i.hook(ctx, Call{Op: "Trash", Image: pool.Image("")}); err != nil {
		return nil, err
	}
	return i.c.Trash(ctx, pool)
}

func (i intercepted) TrashRemove(ctx context.Context, pool ceph.PoolSpec, imageID string) error {
	if err := i.hook(ctx, Call{Op: "TrashRemove", Image: pool.Image(imageID)}); err != nil {
		return err
	}
	return i.c.TrashRemove(ctx, pool, imageID)
}

func (i intercepted) Watchers(ctx context.Context, image ceph.ImageSpec) ([]string, error) {
	if err := i.hook(ctx, Call{Op: "Watchers", Image: image}); err != nil {
		return nil, err
	}
	return i.c.Watchers(ctx, image)
}

func (i intercepted) InspectImage(ctx context.Context, image ceph.ImageSpec) (*ceph.Inspection, error) {
	if err := i.hook(ctx, Call{Op: "InspectImage", Image: image}); err != nil {
		return nil, err
	}
	return i.c.InspectImage(ctx, image)
}

func (i intercepted) ImageHeader(ctx context.Context, image ceph.ImageSpec) (*ceph.ImageHeader, error) {
	if err := i.hook(ctx, Call{Op: "ImageHeader", Image: image}); err != nil {
		return nil, err
	}
	return i.c.ImageHeader(ctx, image)
}

func (i intercepted) Locks(ctx context.Context, image ceph.ImageSpec) ([]ceph.Lock, error) {
	if err := i.hook(ctx, Call{Op: "Locks", Image: image}); err != nil {
		return nil, err
	}
	return i.c.Locks(ctx, image)
}

func (i intercepted) BreakLock(ctx context.Context, image ceph.ImageSpec, lock ceph.Lock) error {
	if err := i.hook(ctx, Call{Op: "BreakLock", Image: image}); err != nil {
		return err
	}
	return i.c.BreakLock(ctx, image, lock)
}

func (i intercepted) SetOmap(ctx context.Context, pool ceph.PoolSpec, object string, kv map[string][]byte) error {
	if err := i.hook(ctx, Call{Op: "SetOmap", Image: pool.Image(object), Keys: slices.Sorted(maps.Keys(kv))}); err != nil {
		return err
	}
	return i.c.SetOmap(ctx, pool, object, kv)
}

func (i intercepted) OmapValue(ctx context.Context, pool ceph.PoolSpec, object string, key string) ([]byte, error) {
	if err := i.hook(ctx, Call{Op: "OmapValue", Image: pool.Image(object), Keys: []string{key}}); err != nil {
		return nil, err
	}
	return i.c.OmapValue(ctx, pool, object, key)
}

func (i intercepted) OmapKeys(ctx context.Context, pool ceph.PoolSpec, object string) ([]string, error) {
	if err := i.hook(ctx, Call{Op: "OmapKeys", Image: pool.Image(object)}); err != nil {
		return nil, err
	}
	return i.c.OmapKeys(ctx, pool, object)
}

func (i intercepted) RemoveOmapKeys(ctx context.Context, pool ceph.PoolSpec, object string, keys []string) error {
	if err := i.hook(ctx, Call{Op: "RemoveOmapKeys", Image: pool.Image(object), Keys: keys}); err != nil {
		return err
	}
	return i.c.RemoveOmapKeys(ctx, pool, object, keys)
}

var _ ceph.Client = intercepted{}

// Hang is a hook's answer that makes the call wait as a call to an
// unreachable cluster does: until ctx ends, or until the client's call
// limit, which it then answers as the real client does.
func Hang(ctx context.Context, c Call, limit time.Duration) error {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("%s: stopped by the request's own deadline or cancellation: %w", c.Op, ctx.Err())
	case <-t.C:
		return &ceph.DeadlineError{Op: c.Op, Limit: limit}
	}
}
