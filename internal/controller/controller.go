// Package controller owns the controller side of every volume, as
// internal/node owns the node side: create (new, from a snapshot, a clone),
// delete, publish and unpublish (access modes, the holder named on a
// conflict), validation of capabilities, modify, expand, snapshots and
// group snapshots, listing, capacity and health, pre-provisioned volumes,
// encryption keys and their rotation, adoption of another driver's images,
// and the backends' upkeep. It works over the backend instances
// (internal/backend) and the KMSs (internal/kms), and returns errors of
// errdefs' kinds. internal/driver translates CSI and the operators' HTTP
// to it and maps its errors to codes; this package knows nothing of gRPC.
//
// Every request names what it acts on by a parsed volume ID (or, for a
// pre-provisioned volume, its handle and attributes): the driver refuses
// an ID Spindle never issued before anything here sees it.
package controller

import (
	"context"

	"go.uber.org/zap"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/kms"
	"github.com/spindle-csi/spindle/internal/oplock"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// Options configure a Controller.
type Options struct {
	// Instances are the backend instances served; DefaultInstance is the
	// key of the one new volumes go to when their parameters name none.
	Instances       backend.Instances
	DefaultInstance string
	// NodeID is the node this process runs on: a node-local instance's
	// volumes live there (topology).
	NodeID string
	// KMS wraps and unwraps encrypted volumes' passphrases.
	KMS *kms.Registry
	// Locks allow one operation per volume at a time; the node side of
	// the same process shares them. New makes its own when nil.
	Locks *oplock.Locks
	Log   *zap.Logger
}

// Controller is the controller side.
type Controller struct {
	instances backend.Instances
	def       string
	nodeID    string
	kms       *kms.Registry
	locks     *oplock.Locks
	log       *zap.Logger
}

// New returns the controller side over opts' instances. It starts nothing:
// Maintain runs the upkeep, Reconcile the start-up repair.
func New(opts Options) *Controller {
	c := &Controller{instances: opts.Instances, def: opts.DefaultInstance, nodeID: opts.NodeID, kms: opts.KMS, locks: opts.Locks, log: opts.Log}
	if c.locks == nil {
		c.locks = oplock.New()
	}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	return c
}

// image returns the instance serving id and the volume's image.
func (c *Controller) image(ctx context.Context, id volumeid.ID) (*backend.Instance, *backend.Image, error) {
	inst, err := c.instances.Serving(id)
	if err != nil {
		return nil, nil, err
	}
	img, err := inst.Store.Get(ctx, id.Image)
	if err != nil {
		return nil, nil, err
	}
	return inst, img, nil
}

// lockVolume returns the instance serving id with the lock of the volume's
// controller operations held, so that a second one on the same volume is
// ABORTED. The instance is looked up first: an unconfigured backend is
// refused before anything is locked.
func (c *Controller) lockVolume(id volumeid.ID) (*backend.Instance, func(), error) {
	inst, err := c.instances.Serving(id)
	if err != nil {
		return nil, nil, err
	}
	release, err := c.locks.Acquire("volume/"+id.String(), "volume "+id.String())
	if err != nil {
		return nil, nil, err
	}
	return inst, release, nil
}

// DefaultInstance is the key of the instance new volumes go to when their
// parameters name none.
func (c *Controller) DefaultInstance() string { return c.def }
