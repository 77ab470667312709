package rbd

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Keys of the publish_context: what a node needs to map the image (never a
// key: the node gets its credentials from the NodeStage secrets). The
// read-only flag travels as backend.ContextReadOnly. The monitors are
// those of the moment of the publish, for operators: a node resolves the
// cluster's monitors itself on every call (clustermap.go), since a
// VolumeAttachment keeps its publish_context while monitors move.
const (
	ContextClusterID    = "clusterID"
	ContextMonitors     = "monitors"
	ContextPool         = "pool"
	ContextNamespace    = "radosNamespace"
	ContextImage        = "image"
	ContextMounter      = "mounter"
	ContextMapOptions   = "mapOptions"
	ContextUnmapOptions = "unmapOptions"
)

// ledger is the store as backend.GrantExporter records grants in it: the
// attachments are the image's spindle.attachments metadata, changed under
// this process's lock of the image.
type ledger struct{ s *Store }

var _ backend.Ledger = ledger{}

func (l ledger) Node(ctx context.Context, nodeID string) (*backend.NodeInfo, error) {
	info, err := l.s.lookupNode(ctx, nodeID)
	if err != nil {
		return nil, err
	}
	return &info, nil
}

func (l ledger) Get(ctx context.Context, imageID string) (*backend.Image, error) {
	return l.s.Get(ctx, imageID)
}

// UpdateGrants implements backend.Ledger. withPool counts under limitMu,
// so two publishes racing for a node's last slot count one after the other.
func (l ledger) UpdateGrants(ctx context.Context, imageID string, withPool bool, fn func(img *backend.Image, others []*backend.Image) error) (*backend.Image, error) {
	s := l.s
	r, err := s.volumeRef(imageID)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrNotFound, err, "no volume %s", imageID)
	}
	defer s.locks.lock(imageID)()
	img, err := s.getImage(ctx, imageID)
	if err != nil {
		return nil, err
	}
	var others []*backend.Image
	if withPool {
		s.limitMu.Lock()
		defer s.limitMu.Unlock()
		if others, err = s.listUnlocked(ctx, imageID); err != nil {
			return nil, err
		}
	}
	before := img.Clone()
	if err := fn(img, others); errors.Is(err, backend.ErrUnchanged) {
		return before, nil
	} else if err != nil {
		return nil, err
	}
	v := ""
	if len(img.Attachments) > 0 {
		v = mustJSON(img.Attachments)
	}
	if err := s.setMeta(ctx, r, map[string]string{metaAttachments: v}); err != nil {
		return nil, err
	}
	return img, nil
}

// exportHooks fence a lost node before its volume is granted to another,
// and give the node what it needs to map the image (never a key: the node
// gets its credentials from the NodeStage secrets).
type exportHooks struct {
	backend.NoExportHooks
	s *Store
}

// Granting: with fencing, a read-write single-node grant of a volume that
// no node holds but that still has watchers (its node was lost and the
// volume force-detached) first blocklists those clients.
func (h exportHooks) Granting(ctx context.Context, img *backend.Image, att backend.Attachment) error {
	if !h.s.cfg.Fencing || !att.AccessMode.SingleNode() || att.ReadOnly || len(img.Attachments) > 0 {
		return nil
	}
	r, err := h.s.volumeRef(img.ID)
	if err != nil {
		return err
	}
	return h.s.fence(ctx, r, att.NodeID)
}

func (h exportHooks) PublishContext(img *backend.Image) map[string]string {
	r, _ := h.s.volumeRef(img.ID)
	mounter, mapOpts, unmapOpts := h.s.mapSettings(img, nil)
	return h.s.publishContext(r, mounter, mapOpts, unmapOpts)
}

// publishContext says where the image is and how to map it.
func (s *Store) publishContext(r ref, mounter, mapOpts, unmapOpts string) map[string]string {
	ep, _ := s.c.endpointOf(r.cluster)
	pc := map[string]string{
		ContextClusterID:  r.cluster,
		ContextMonitors:   strings.Join(ep.monitors, ","),
		ContextPool:       r.pool,
		ContextImage:      r.image,
		ContextMounter:    mounter,
		ContextMapOptions: mapOpts,
	}
	if r.namespace != "" {
		pc[ContextNamespace] = r.namespace
	}
	if unmapOpts != "" {
		pc[ContextUnmapOptions] = unmapOpts
	}
	return pc
}

// fence blocklists the clients that still have image open while no node
// holds it: the node that had it was lost and the volume was force-detached
// from it (Kubernetes' non-graceful node shutdown). Until the blocklist
// entry expires (an hour, Ceph's default) those clients can no longer
// write to any image, so the new node cannot be corrupted by the old one.
//
// It returns once the watchers are gone: "ceph osd blocklist add" returns
// when the monitors have committed the entry, and the OSDs drop a
// blocklisted client's watches only when they see the new OSD map; a
// publish that returned before then would have the new node's stage
// refused for a watcher that is already fenced.
func (s *Store) fence(ctx context.Context, r ref, newNode string) error {
	addrs, err := s.watchers(ctx, r)
	if err != nil || len(addrs) == 0 {
		return err
	}
	cl, err := s.client(ctx, r.location)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if err := cl.Blocklist(ctx, a); err != nil {
			return errdefs.Wrap(errdefs.ErrPrecondition, err, "fencing: cannot blocklist client %s that still has image %s open before publishing it to node %q", a, r.spec(), newNode)
		}
	}
	deadline := time.Now().Add(fenceWait)
	for {
		left, err := s.watchers(ctx, r)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(left, func(a string) bool { return slices.Contains(addrs, a) }) {
			return nil
		}
		if time.Now().After(deadline) {
			return errdefs.Unavailable("fencing: blocklisted %s, but after %s image %s still has watchers %s; retry the publish to node %q",
				strings.Join(addrs, ", "), fenceWait, r.spec(), strings.Join(left, ", "), newNode)
		}
		select {
		case <-ctx.Done():
			return errdefs.Wrap(errdefs.ErrUnavailable, ctx.Err(), "fencing: waiting for the blocklisted watchers of image %s to go", r.spec())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// fenceWait bounds how long fence waits for the OSDs to drop the watches
// of the clients it blocklisted.
const fenceWait = 30 * time.Second
