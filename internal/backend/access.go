package backend

import (
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Admit decides whether att may be added to an image's existing attachments.
// It is the one place that enforces access modes, shared by every exporter.
//
// It returns already=true when the same node is attached with the same mode
// and read-only flag (a repeated publish, a no-op); ErrAlreadyExists when the
// same node is attached with other flags; ErrPrecondition, naming the holder,
// when another node's attachment excludes this one.
func Admit(img *Image, att Attachment) (already bool, err error) {
	for _, e := range img.Attachments {
		if e.NodeID != att.NodeID {
			continue
		}
		if e.AccessMode == att.AccessMode && e.ReadOnly == att.ReadOnly {
			return true, nil
		}
		return false, errdefs.AlreadyExists("volume %s is already published to node %q with access mode %s, read-only=%t; asked for %s, read-only=%t",
			img.ID, e.NodeID, e.AccessMode, e.ReadOnly, att.AccessMode, att.ReadOnly)
	}
	for _, e := range img.Attachments {
		switch {
		case att.AccessMode.SingleNode():
			return false, errdefs.Precondition("volume %s is published to node %q; access mode %s allows one node at a time",
				img.ID, e.NodeID, att.AccessMode)
		case e.AccessMode.SingleNode():
			return false, errdefs.Precondition("volume %s is published to node %q with single-node access mode %s",
				img.ID, e.NodeID, e.AccessMode)
		case att.AccessMode == MultiNodeSingleWriter && !att.ReadOnly && !e.ReadOnly:
			return false, errdefs.Precondition("volume %s already has a writer on node %q; access mode %s allows one writer",
				img.ID, e.NodeID, att.AccessMode)
		}
	}
	return false, nil
}

// Detached returns the attachments without nodeID, and whether it was there.
func Detached(atts []Attachment, nodeID string) ([]Attachment, bool) {
	out := atts[:0:0]
	found := false
	for _, a := range atts {
		if a.NodeID == nodeID {
			found = true
			continue
		}
		out = append(out, a)
	}
	return out, found
}

// OneWriterNode is the access check of a backend whose images hold one
// filesystem (or raw device) that one kernel caches: any single-node mode,
// and multi-node read-only; no multi-node writers, which would need a
// cluster filesystem. backendName and why go into the refusal, e.g. "loop"
// and "a loop image can be written from one node only".
func OneWriterNode(backendName, why string, t AccessType, m AccessMode) error {
	switch {
	case t != AccessMount && t != AccessBlock:
		return errdefs.InvalidArgument("access type %q is neither mount nor block", t)
	case m.SingleNode(), m == MultiNodeReaderOnly:
		return nil
	case m == MultiNodeSingleWriter || m == MultiNodeMultiWriter:
		return errdefs.InvalidArgument("access mode %s is not supported by the %s backend: %s", m, backendName, why)
	default:
		return errdefs.InvalidArgument("access mode %q is not supported by the %s backend", m, backendName)
	}
}

// PublishedTo counts the images published to nodeID, for an exporter that
// enforces a node's MaxVolumesPerNode.
func PublishedTo(imgs []*Image, nodeID string) int64 {
	var n int64
	for _, img := range imgs {
		for _, a := range img.Attachments {
			if a.NodeID == nodeID {
				n++
				break
			}
		}
	}
	return n
}

// GrantOf returns nodeID's attachment of img, or ErrPrecondition when
// ControllerPublish has not granted that node access: a node attaches only
// what it was published.
func GrantOf(img *Image, nodeID string) (*Attachment, error) {
	for i := range img.Attachments {
		if img.Attachments[i].NodeID == nodeID {
			return &img.Attachments[i], nil
		}
	}
	return nil, errdefs.Precondition("volume %s is not published to node %q (ControllerPublishVolume has not granted this node access)", img.ID, nodeID)
}
