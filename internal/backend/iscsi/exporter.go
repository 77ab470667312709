package iscsi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spindle-csi/spindle/internal/atomicfile"
	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/backend/filestore"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// recordsDir, inside the pool, holds one small record per published volume
// that says whether its target requires CHAP (never the credentials), so a
// target rebuilt without them fails closed. The filestore ignores dot names.
const recordsDir = ".iscsi"

// exportRecord is the pool's note about a volume's target.
type exportRecord struct {
	CHAP bool `json:"chap"`
}

// targets keeps one iSCSI target per published volume in step with the
// volume's grants: backend.GrantExporter records the grants in the image
// metadata, and these hooks put the granted nodes' initiators in the
// target's ACL (with the CHAP accounts of the publish's secrets) and take
// them out again.
type targets struct {
	backend.NoExportHooks
	store    *filestore.Store
	tool     targetTool
	cfg      Config
	instance string
}

var _ backend.ExportHooks = (*targets)(nil)

// targetIQN is the IQN of the image's target.
func (e *targets) targetIQN(imageID string) string {
	return TargetIQN(e.cfg.TargetPrefix, e.instance, imageID)
}

// export is what the image's target must look like with these attachments.
func (e *targets) export(img *backend.Image, chap *CHAP) (Export, error) {
	x := Export{
		IQN:       e.targetIQN(img.ID),
		ImagePath: e.store.ImagePath(img.ID),
		Serial:    Serial(e.instance, img.ID),
		CHAP:      chap,
		DirectIO:  img.MutableParameters[MutableParamDirectIO] == "true",
	}
	for _, a := range img.Attachments {
		iqn, err := InitiatorIQN(e.cfg.InitiatorPrefix, a.NodeID)
		if err != nil {
			return Export{}, err
		}
		x.Initiators = append(x.Initiators, iqn)
	}
	slices.Sort(x.Initiators)
	return x, nil
}

// CheckPublish: the node ID must make an initiator name, and the CHAP
// secrets (if any) must be complete.
func (e *targets) CheckPublish(ctx context.Context, att backend.Attachment) error {
	if _, err := InitiatorIQN(e.cfg.InitiatorPrefix, att.NodeID); err != nil {
		return err
	}
	_, err := chapFrom(backend.SecretsFrom(ctx))
	return err
}

// Apply applies the volume's whole target on every publish, a repeated one
// too, which so rebuilds a target lost with a tgtd restart. A new
// initiator that could not be applied does not stay in the ACL.
func (e *targets) Apply(ctx context.Context, img, before *backend.Image) error {
	chap, err := chapFrom(backend.SecretsFrom(ctx))
	if err != nil {
		return err
	}
	err = e.apply(ctx, img, chap, len(before.Attachments) > 0)
	if err != nil && len(img.Attachments) > len(before.Attachments) {
		if rerr := e.applyACLOnly(ctx, before); rerr != nil {
			err = errors.Join(err, fmt.Errorf("roll back the ACL: %w", rerr))
		}
	}
	return err
}

// PublishContext: where to log in and which LUN is the volume's.
func (e *targets) PublishContext(img *backend.Image) map[string]string {
	return map[string]string{
		ContextPortals:   strings.Join(e.cfg.Portals, ","),
		ContextTargetIQN: e.targetIQN(img.ID),
		ContextLUN:       strconv.Itoa(LUN),
		ContextSerial:    Serial(e.instance, img.ID),
	}
}

// apply makes the target match img's attachments and chap. A target that
// requires CHAP keeps requiring it while the volume stays published: a
// publish without credentials is refused rather than opening the LUN.
func (e *targets) apply(ctx context.Context, img *backend.Image, chap *CHAP, published bool) error {
	rec, err := e.readRecord(img.ID)
	if err != nil {
		return err
	}
	if published && rec.CHAP && chap == nil {
		return errdefs.Precondition("volume %s is published with CHAP and this ControllerPublishVolume carries no CHAP secrets (%s, %s); refusing to drop authentication", img.ID, SecretUser, SecretPassword)
	}
	if want := (exportRecord{CHAP: chap != nil}); want != rec {
		if err := e.writeRecord(img.ID, want); err != nil {
			return err
		}
	}
	x, err := e.export(img, chap)
	if err != nil {
		return err
	}
	return e.tool.Apply(ctx, x)
}

// applyACLOnly sets the target's ACL to img's attachments without
// touching its CHAP accounts (for which it has no credentials); with no
// attachments left the target goes.
func (e *targets) applyACLOnly(ctx context.Context, img *backend.Image) error {
	if len(img.Attachments) == 0 {
		if err := e.tool.Remove(ctx, e.targetIQN(img.ID)); err != nil {
			return err
		}
		return e.removeRecord(img.ID)
	}
	x, err := e.export(img, nil)
	if err != nil {
		return err
	}
	return e.tool.Apply(ctx, keepCHAP(x))
}

// keepCHAP marks an export whose CHAP accounts are to be left as they are.
func keepCHAP(x Export) Export {
	x.CHAP = &CHAP{User: keepAccounts}
	return x
}

// keepAccounts, as a CHAP user, tells a target tool to keep the accounts it
// has. It cannot be a real user: user names may not contain blanks.
const keepAccounts = " keep "

func (c *CHAP) keep() bool { return c != nil && c.User == keepAccounts }

// Revoked: the node's initiator leaves the ACL and loses its sessions;
// the last one takes the target with it.
func (e *targets) Revoked(ctx context.Context, img *backend.Image) error {
	return e.applyACLOnly(ctx, img)
}

// Gone: a target an interrupted delete left behind goes.
func (e *targets) Gone(ctx context.Context, imageID string) error {
	return e.tool.Remove(ctx, e.targetIQN(imageID))
}

// Reconcile makes the target host match the pool, as after a tgtd restart:
// every published volume gets its target back (those published with CHAP
// locked, with an empty ACL, until their next publish brings the
// credentials); targets of this instance that belong to no published volume
// go. A controller runs it when it starts (backend.Reconciler); it returns
// the targets it rebuilt or removed.
func (s *Store) Reconcile(ctx context.Context) ([]string, error) {
	return s.targets.reconcile(ctx)
}

func (e *targets) reconcile(ctx context.Context) ([]string, error) {
	imgs, err := e.store.List(ctx)
	if err != nil {
		return nil, err
	}
	existing, err := e.tool.Targets(ctx)
	if err != nil {
		return nil, err
	}
	var changed []string
	var errs []error
	want := map[string]bool{}
	for _, img := range imgs {
		if len(img.Attachments) == 0 {
			continue
		}
		iqn := e.targetIQN(img.ID)
		want[iqn] = true
		x, err := e.export(img, nil)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rec, err := e.readRecord(img.ID)
		switch {
		case err != nil:
			errs = append(errs, err)
			continue
		case slices.Contains(existing, iqn):
			x = keepCHAP(x)
		case rec.CHAP:
			x.Initiators = nil // locked until the next publish
		}
		if err := e.tool.Apply(ctx, x); err != nil {
			errs = append(errs, fmt.Errorf("volume %s: %w", img.ID, err))
			continue
		}
		if !slices.Contains(existing, iqn) {
			changed = append(changed, "rebuilt target "+iqn)
		}
	}
	ours := e.cfg.TargetPrefix + ":" + e.instance + "."
	for _, iqn := range existing {
		if strings.HasPrefix(iqn, ours) && !want[iqn] {
			if err := e.tool.Remove(ctx, iqn); err != nil {
				errs = append(errs, err)
				continue
			}
			changed = append(changed, "removed target "+iqn)
		}
	}
	return changed, errors.Join(errs...)
}

func (e *targets) recordPath(id string) string {
	return filepath.Join(e.store.Dir(), recordsDir, id+".json")
}

func (e *targets) readRecord(id string) (exportRecord, error) {
	var rec exportRecord
	data, err := os.ReadFile(e.recordPath(id))
	if os.IsNotExist(err) {
		return rec, nil
	}
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, fmt.Errorf("export record %s is corrupt: %w", e.recordPath(id), err)
	}
	return rec, nil
}

func (e *targets) writeRecord(id string, rec exportRecord) error {
	if err := os.MkdirAll(filepath.Dir(e.recordPath(id)), 0o750); err != nil {
		return err
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return atomicfile.Write(e.recordPath(id), append(data, '\n'), 0o600)
}

func (e *targets) removeRecord(id string) error {
	return atomicfile.Remove(e.recordPath(id))
}

// Store is the filestore pool with the target kept in step: Delete removes
// a target an interrupted unpublish left, Expand makes a published LUN take
// the new size.
type Store struct {
	*filestore.Store
	targets *targets
}

var (
	_ backend.ImageStore = (*Store)(nil)
	_ backend.Reconciler = (*Store)(nil)
)

// Delete implements backend.ImageStore.
func (s *Store) Delete(ctx context.Context, id string) error {
	if err := s.Store.Delete(ctx, id); err != nil {
		return err
	}
	// An unreachable tgtd holds no target to remove (it forgets them all
	// when it restarts); the controller's start-up reconcile removes strays.
	if err := s.targets.tool.Remove(ctx, s.targets.targetIQN(id)); err != nil && errdefs.KindOf(err) != errdefs.ErrUnavailable {
		return err
	}
	return s.targets.removeRecord(id)
}

// Expand implements backend.ImageStore. The LUN is resized on every call
// for a published volume, so a retry after a failed resize completes it.
func (s *Store) Expand(ctx context.Context, id string, newBytes int64) (*backend.Image, error) {
	img, err := s.Store.Expand(ctx, id, newBytes)
	if err != nil || len(img.Attachments) == 0 {
		return img, err
	}
	x, err := s.targets.export(img, nil)
	if err != nil {
		return nil, err
	}
	if err := s.targets.tool.Resize(ctx, x); err != nil {
		return nil, err
	}
	return img, nil
}

// Probe implements backend.ImageStore: the pool and the target are usable.
func (s *Store) Probe(ctx context.Context) error {
	if err := s.Store.Probe(ctx); err != nil {
		return err
	}
	return s.targets.tool.Probe(ctx)
}
