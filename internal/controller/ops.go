package controller

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/kms"
	"github.com/spindle-csi/spindle/internal/metrics"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// What the operators ask of the controller side (kubectl-spindle, through
// the endpoints internal/driver serves): adopting another driver's image,
// rotating an encrypted volume's key, the backends' background work.

// AdoptRequest asks for an image of another driver (kubectl spindle adopt)
// to become a volume in place.
type AdoptRequest struct {
	// Name is the volume's CSI name (its new PersistentVolume's).
	Name string
	// Handle and Attributes find the image, as a pre-provisioned volume's
	// do (backend.Instances.Static).
	Handle     string
	Attributes map[string]string
	// Parameters are the claim's new StorageClass's, checked as
	// CreateVolume checks them.
	Parameters map[string]string
	AccessType backend.AccessType
	FsType     string // "" leaves it to the parameters or the default
	// Secrets are the backend's credentials the request carries; the
	// controller's own are never lent to it.
	Secrets map[string]string
	DryRun  bool
}

// Adopt gives the image r names a volume's records, in place
// (backend.Adopter): no data moves. It returns the volume, and in a dry
// run who has the image open.
func (c *Controller) Adopt(ctx context.Context, r AdoptRequest) (vol *Volume, openBy []string, err error) {
	inst, _, image, err := c.instances.Static("handle", r.Handle, r.Attributes)
	if err != nil {
		return nil, nil, err
	}
	adopter, ok := inst.Store.(backend.Adopter)
	if !ok {
		return nil, nil, errdefs.InvalidArgument("backend %s cannot adopt images", inst.Key())
	}
	params, err := c.parseParameters(r.Parameters)
	if err != nil {
		return nil, nil, err
	}
	if params.encrypted {
		return nil, nil, errdefs.InvalidArgument("the StorageClass's parameters.%s is \"true\", but adopt keeps the image's data where it is, in clear: it cannot become an encrypted volume in place; adopt it into a class without %s, or copy its data onto an encrypted volume", paramEncrypted, paramEncrypted)
	}
	if params.instance != inst.Key() {
		return nil, nil, errdefs.InvalidArgument("the image is in backend %s, but the StorageClass parameters pick backend %s", inst.Key(), params.instance)
	}
	spec := backend.AdoptSpec{ImageID: image, Name: r.Name, AccessType: r.AccessType, Parameters: params.shaping, DryRun: r.DryRun}
	switch spec.AccessType {
	case backend.AccessMount:
		fsType := r.FsType
		if fsType == "" {
			fsType = params.fsType
		}
		fs, err := blockdev.LookupFilesystem(fsType)
		if err != nil {
			return nil, nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "fsType")
		}
		spec.FsType = fs.Name
	case backend.AccessBlock:
	default:
		return nil, nil, errdefs.InvalidArgument("accessType %q must be mount or block", r.AccessType)
	}
	release, err := c.locks.Acquire("adopt/"+inst.Key()+"/"+image, "image "+image)
	if err != nil {
		return nil, nil, err
	}
	defer release()
	res, err := adopter.Adopt(backend.WithSecretsOnly(ctx, r.Secrets), spec)
	if err != nil {
		return nil, nil, err
	}
	if vol, err = c.describe(inst, res.Image); err != nil {
		return nil, nil, err
	}
	c.log.Info("adopted an image", zap.String("volumeID", vol.ID), zap.String("name", r.Name), zap.Bool("dryRun", r.DryRun), zap.Strings("openBy", res.OpenBy))
	return vol, res.OpenBy, nil
}

// Key rotation of an encrypted volume while it is in use, in three steps
// that kubectl-spindle makes through the API server's pod proxy:
//
//  1. the controller makes the next passphrase, wraps it with the volume's
//     KMS and records it beside the current one (Encryption.NextWrappedKey),
//     after proving the request's secrets unwrap the current one
//     (PlanKeyRotation);
//  2. the node plugin that stages the volume unwraps both and rekeys the
//     LUKS header (node.Volumes.RotateKey): the next key into a free
//     keyslot, proven, then the current one's keyslot destroyed;
//  3. the controller makes the next key the volume's, keeping the replaced
//     one (PreviousWrappedKey) until the next rotation (CommitKey).
//
// Each step is idempotent and every state between them stages: publish
// carries all three wrapped keys and the node tries them in turn. Only the
// controller writes the image's record (an iSCSI node reads no pool), and
// only the node touches the header (only it has the device).

// keeper is the volume's store's way to change its key, locked.
func (c *Controller) keeper(id volumeid.ID) (backend.EncryptionKeeper, *backend.Instance, func(), error) {
	inst, release, err := c.lockVolume(id)
	if err != nil {
		return nil, nil, nil, err
	}
	keeper, ok := inst.Store.(backend.EncryptionKeeper)
	if !ok {
		release()
		return nil, nil, nil, errdefs.Precondition("backend %s cannot change a volume's key", inst.Key())
	}
	return keeper, inst, release, nil
}

// PlanKeyRotation is step 1: it returns the volume's key with the next
// one (a rotation that stopped is resumed with its next key, if that still
// unwraps).
func (c *Controller) PlanKeyRotation(ctx context.Context, id volumeid.ID, secrets map[string]string) (*backend.Encryption, error) {
	keeper, inst, release, err := c.keeper(id)
	if err != nil {
		return nil, err
	}
	defer release()
	img, err := inst.Store.Get(ctx, id.Image)
	if err != nil {
		return nil, err
	}
	if img.Encryption == nil {
		return nil, errdefs.Precondition("volume %s is not encrypted", id)
	}
	e := img.Encryption.Clone()
	cur, err := c.Unwrap(ctx, e, secrets)
	if err != nil {
		return nil, err
	}
	clear(cur)
	if e.NextWrappedKey != "" {
		next, err := c.Unwrap(ctx, &backend.Encryption{KMSID: e.KMSID, KeyOwner: e.KeyOwner, WrappedKey: e.NextWrappedKey}, secrets)
		clear(next)
		if err != nil {
			c.log.Warn("the next key of an earlier rotation does not unwrap; making another", zap.String("volumeID", id.String()), zap.Error(err))
			e.NextWrappedKey = ""
		}
	}
	if e.NextWrappedKey == "" {
		pass, err := kms.NewPassphrase()
		if err != nil {
			return nil, err
		}
		wrapped, err := c.wrap(ctx, e.KMSID, e.KeyOwner, pass, secrets)
		clear(pass)
		if err != nil {
			return nil, err
		}
		e.NextWrappedKey = wrapped.WrappedKey
		if err := keeper.SetEncryption(ctx, id.Image, e); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// CommitKey is step 3: next, the key the node rekeyed the header to,
// becomes the volume's. Committing it again is fine.
func (c *Controller) CommitKey(ctx context.Context, id volumeid.ID, next string) error {
	keeper, inst, release, err := c.keeper(id)
	if err != nil {
		return err
	}
	defer release()
	img, err := inst.Store.Get(ctx, id.Image)
	if err != nil {
		return err
	}
	e := img.Encryption.Clone()
	switch {
	case e == nil:
		return errdefs.Precondition("volume %s is not encrypted", id)
	case e.WrappedKey == next && next != "":
		return nil // committed before
	case e.NextWrappedKey == "" || e.NextWrappedKey != next:
		return errdefs.Precondition("no rotation of volume %s to that key is under way", id)
	}
	e.PreviousWrappedKey, e.WrappedKey, e.NextWrappedKey = e.WrappedKey, e.NextWrappedKey, ""
	return keeper.SetEncryption(ctx, id.Image, e)
}

// Backends hand long work (flattening a copy-on-write clone, removing a
// large image) to background tasks and answer at once; a controller keeps
// them going: every backend.MaintainInterval it lets each instance that
// has upkeep (backend.Maintainer) redo what a restart dropped and remove
// what waited for something else to go first, and it shows the tasks
// (backend.TaskReporter) in its metrics and its /images document.

// maintainTimeout bounds one instance's round of upkeep: each call in it
// has its own deadline; this only keeps a stuck round from holding up the
// next.
const maintainTimeout = 5 * time.Minute

// taskListTimeout bounds listing an instance's tasks for a scrape or for
// /images.
const taskListTimeout = 10 * time.Second

// reconcileTimeout bounds an instance's start-up repair.
const reconcileTimeout = 2 * time.Minute

// Reconcile repairs what a crash or a restart elsewhere left behind in each
// instance (backend.Reconciler), as a controller opens them. A backend that
// does not answer now is no reason not to serve: Probe reports it, and the
// next start (for iSCSI, each volume's next publish) repairs it.
func (c *Controller) Reconcile(ctx context.Context) {
	c.eachInstance(ctx, reconcileTimeout, "repaired backend state", "could not repair backend state",
		func(ctx context.Context, store backend.ImageStore) (bool, []string, error) {
			r, ok := store.(backend.Reconciler)
			if !ok {
				return false, nil, nil
			}
			changed, err := r.Reconcile(ctx)
			return true, changed, err
		})
}

// Maintain runs the upkeep of every instance (backend.Maintainer) every
// backend.MaintainInterval until ctx ends.
func (c *Controller) Maintain(ctx context.Context) {
	tick := time.NewTicker(backend.MaintainInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c.eachInstance(ctx, maintainTimeout, "backend upkeep", "backend upkeep failed; retried in a minute",
			func(ctx context.Context, store backend.ImageStore) (bool, []string, error) {
				m, ok := store.(backend.Maintainer)
				if !ok {
					return false, nil, nil
				}
				changed, err := m.Maintain(ctx)
				return true, changed, err
			})
	}
}

// eachInstance runs step on every instance's store, each within timeout,
// and logs what it changed (changedMsg) and why it failed (failedMsg),
// unless ctx ended meanwhile. step reports whether the store takes part.
func (c *Controller) eachInstance(ctx context.Context, timeout time.Duration, changedMsg, failedMsg string, step func(context.Context, backend.ImageStore) (ran bool, changed []string, err error)) {
	for _, key := range c.instances.Keys() {
		sctx, cancel := context.WithTimeout(ctx, timeout)
		ran, changed, err := step(sctx, c.instances[key].Store)
		cancel()
		if !ran {
			continue
		}
		for _, ch := range changed {
			c.log.Info(changedMsg, zap.String("backend", key), zap.String("change", ch))
		}
		if err != nil && ctx.Err() == nil {
			c.log.Warn(failedMsg, zap.String("backend", key), zap.Error(err))
		}
	}
}

// Tasks lists one instance's background tasks; ok is false when it runs
// none.
func (c *Controller) Tasks(ctx context.Context, key string) (tasks []backend.Task, ok bool, err error) {
	r, ok := c.instances[key].Store.(backend.TaskReporter)
	if !ok {
		return nil, false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, taskListTimeout)
	defer cancel()
	tasks, err = r.Tasks(ctx)
	return tasks, true, err
}

// BackgroundTasks is what the background-task gauges show.
func (c *Controller) BackgroundTasks() ([]metrics.BackgroundTask, error) {
	var out []metrics.BackgroundTask
	var firstErr error
	for _, key := range c.instances.Keys() {
		tasks, _, err := c.Tasks(context.Background(), key)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		for _, t := range tasks {
			out = append(out, metrics.BackgroundTask{Backend: key, Action: t.Action, Image: t.Image, Progress: t.Progress, InProgress: t.InProgress})
		}
	}
	return out, firstErr
}
