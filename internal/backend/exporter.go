package backend

import (
	"context"
	"errors"
	"strconv"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Ledger is an image store's record of which nodes may attach its images:
// every backend keeps the grants of ControllerPublish in its images'
// metadata, and GrantExporter runs the one publish algorithm over it.
type Ledger interface {
	// Node returns what a node registered (NodeInfo.MaxVolumesPerNode 0:
	// no limit). A store that keeps a registry of nodes answers
	// ErrNotFound for a node that never registered.
	Node(ctx context.Context, nodeID string) (*NodeInfo, error)
	// Get returns the image, or ErrNotFound.
	Get(ctx context.Context, imageID string) (*Image, error)
	// UpdateGrants changes one image's grants: under the store's lock for
	// the image, fn gets the image as recorded and, with withPool, every
	// other image of the store, read under a lock that no other withPool
	// update holds at the same time (so two publishes racing for a node's
	// last slot count one after the other). fn changes img, which is then
	// written, unless fn returns ErrUnchanged; an image that does not
	// exist is ErrNotFound. It returns the image as recorded afterwards.
	UpdateGrants(ctx context.Context, imageID string, withPool bool, fn func(img *Image, others []*Image) error) (*Image, error)
}

// ErrUnchanged, returned by an update function, ends the update without
// writing anything.
var ErrUnchanged = errors.New("unchanged")

// ExportHooks are what a backend adds to the grants GrantExporter records.
// NoExportHooks implements every hook as nothing to do; a backend embeds
// it and overrides what it needs.
type ExportHooks interface {
	// CheckPublish refuses a publish before anything is looked up (iSCSI:
	// the node ID must make an initiator name, CHAP secrets must parse).
	CheckPublish(ctx context.Context, att Attachment) error
	// Granting runs under the image's lock before a new grant is recorded
	// (RBD fences the client of a lost node here).
	Granting(ctx context.Context, img *Image, att Attachment) error
	// Apply makes the backend's export match img's grants, under the
	// image's lock, on every publish, a repeated one too (iSCSI rebuilds a
	// target its daemon forgot). before is the record as it was: a failed
	// Apply leaves the export as before says.
	Apply(ctx context.Context, img, before *Image) error
	// Revoked runs under the image's lock once a node's grant has left img
	// (iSCSI: the initiator leaves the ACL and loses its sessions).
	Revoked(ctx context.Context, img *Image) error
	// Gone runs when the image of an unpublish no longer exists (iSCSI: a
	// target an interrupted delete left behind goes).
	Gone(ctx context.Context, imageID string) error
	// PublishContext is what a node needs to reach img (never a secret);
	// the exporter adds ContextReadOnly.
	PublishContext(img *Image) map[string]string
}

// NoExportHooks is an ExportHooks with nothing to add.
type NoExportHooks struct{}

func (NoExportHooks) CheckPublish(context.Context, Attachment) error     { return nil }
func (NoExportHooks) Granting(context.Context, *Image, Attachment) error { return nil }
func (NoExportHooks) Apply(context.Context, *Image, *Image) error        { return nil }
func (NoExportHooks) Revoked(context.Context, *Image) error              { return nil }
func (NoExportHooks) Gone(context.Context, string) error                 { return nil }
func (NoExportHooks) PublishContext(*Image) map[string]string            { return map[string]string{} }

// GrantExporter is the one Exporter: it admits an access mode (naming the
// holder of a single-node volume), counts a node's volumes against its
// registered limit, records the grant in the Ledger and builds the
// publish_context, with a backend's hooks around the grant.
type GrantExporter struct {
	// Backend ("loop") and Instance ("loop/default") name it in messages.
	Backend  string
	Instance string
	// OneWriterReason says why the backend serves no multi-node writers
	// (see OneWriterNode).
	OneWriterReason string
	Ledger          Ledger
	Hooks           ExportHooks
}

var _ Exporter = (*GrantExporter)(nil)

// SupportsAccess implements Exporter: one writer node, readers anywhere.
func (e *GrantExporter) SupportsAccess(t AccessType, m AccessMode) error {
	return OneWriterNode(e.Backend, e.OneWriterReason, t, m)
}

// Publish implements Exporter.
func (e *GrantExporter) Publish(ctx context.Context, imageID string, att Attachment) (map[string]string, error) {
	if err := e.Hooks.CheckPublish(ctx, att); err != nil {
		return nil, err
	}
	node, err := e.Ledger.Node(ctx, att.NodeID)
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		// "Published to node A" is what an operator moving a pod needs to
		// read, whether or not the new node has registered yet.
		if img, getErr := e.Ledger.Get(ctx, imageID); getErr == nil {
			if _, conflict := Admit(img, att); conflict != nil {
				return nil, conflict
			}
		}
	}
	if err != nil {
		return nil, err
	}
	limit := node.MaxVolumesPerNode
	img, err := e.Ledger.UpdateGrants(ctx, imageID, limit > 0, func(img *Image, others []*Image) error {
		already, err := Admit(img, att)
		if err != nil {
			return err
		}
		before := img.Clone()
		if !already {
			if n := PublishedTo(others, att.NodeID); limit > 0 && n >= limit {
				return errdefs.Exhausted("node %q already has %d volumes of %s published, which is its limit (MaxVolumesPerNode=%d); unpublish one first", att.NodeID, n, e.Instance, limit)
			}
			if err := e.Hooks.Granting(ctx, img, att); err != nil {
				return err
			}
			img.Attachments = append(img.Attachments, att)
		}
		if err := e.Hooks.Apply(ctx, img, before); err != nil {
			return err
		}
		if already {
			return ErrUnchanged
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The node's grant as recorded: a repeated publish keeps the first.
	readOnly := att.ReadOnly
	if granted, err := GrantOf(img, att.NodeID); err == nil {
		readOnly = granted.ReadOnly
	}
	pc := e.Hooks.PublishContext(img)
	pc[ContextReadOnly] = strconv.FormatBool(readOnly)
	return pc, nil
}

// Unpublish implements Exporter.
func (e *GrantExporter) Unpublish(ctx context.Context, imageID, nodeID string) error {
	_, err := e.Ledger.UpdateGrants(ctx, imageID, false, func(img *Image, _ []*Image) error {
		rest, found := Detached(img.Attachments, nodeID)
		if !found {
			return ErrUnchanged
		}
		img.Attachments = rest
		return e.Hooks.Revoked(ctx, img)
	})
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		// A deleted volume has no grants left to revoke.
		return e.Hooks.Gone(ctx, imageID)
	}
	return err
}
