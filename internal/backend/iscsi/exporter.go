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
	pool     *pool
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
func (e *targets) export(fs *filestore.Store, img *backend.Image, chap *CHAP) (Export, error) {
	x := Export{
		IQN:       e.targetIQN(img.ID),
		ImagePath: fs.ImagePath(img.ID),
		Serial:    Serial(e.instance, img.ID),
		CHAP:      chap,
		DirectIO:  backend.DirectIO(img, false),
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
	fs, err := e.pool.open()
	if err != nil {
		return err
	}
	err = e.apply(ctx, fs, img, chap, len(before.Attachments) > 0)
	if err != nil && len(img.Attachments) > len(before.Attachments) {
		if rerr := e.applyACLOnly(ctx, fs, before); rerr != nil {
			err = errors.Join(err, fmt.Errorf("roll back the ACL: %w", rerr))
		}
	}
	return err
}

// PublishContext: where to log in and which LUN is the volume's, and what
// the node must know of the image, which it cannot read anywhere else (see
// formatted.go): whether it may ever be formatted, its fs type and access
// type. The exporter adds the node's initiator.
func (e *targets) PublishContext(img *backend.Image) map[string]string {
	pc := map[string]string{
		ContextPortals:    strings.Join(e.cfg.Portals, ","),
		ContextTargetIQN:  e.targetIQN(img.ID),
		ContextLUN:        strconv.Itoa(LUN),
		ContextSerial:     Serial(e.instance, img.ID),
		ContextFormatted:  strconv.FormatBool(neverFormat(img)),
		ContextAccessType: string(img.AccessType),
	}
	if img.FsType != "" {
		pc[ContextFsType] = img.FsType
	}
	return pc
}

// apply makes the target match img's attachments and chap. A target that
// requires CHAP keeps requiring it while the volume stays published: a
// publish without credentials is refused rather than opening the LUN.
func (e *targets) apply(ctx context.Context, fs *filestore.Store, img *backend.Image, chap *CHAP, published bool) error {
	rec, err := e.readRecord(fs, img.ID)
	if err != nil {
		return err
	}
	if published && rec.CHAP && chap == nil {
		return errdefs.Precondition("volume %s is published with CHAP and this ControllerPublishVolume carries no CHAP secrets (%s, %s); refusing to drop authentication", img.ID, SecretUser, SecretPassword)
	}
	if want := (exportRecord{CHAP: chap != nil}); want != rec {
		if err := e.writeRecord(fs, img.ID, want); err != nil {
			return err
		}
	}
	x, err := e.export(fs, img, chap)
	if err != nil {
		return err
	}
	return e.tool.Apply(ctx, x)
}

// applyACLOnly sets the target's ACL to img's attachments without
// touching its CHAP accounts (for which it has no credentials); with no
// attachments left the target goes.
func (e *targets) applyACLOnly(ctx context.Context, fs *filestore.Store, img *backend.Image) error {
	if len(img.Attachments) == 0 {
		if err := e.tool.Remove(ctx, e.targetIQN(img.ID)); err != nil {
			return err
		}
		return e.removeRecord(fs, img.ID)
	}
	x, err := e.export(fs, img, nil)
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
	fs, err := e.pool.open()
	if err != nil {
		return err
	}
	return e.applyACLOnly(ctx, fs, img)
}

// Gone: a target an interrupted delete left behind goes.
func (e *targets) Gone(ctx context.Context, imageID string) error {
	return e.tool.Remove(ctx, e.targetIQN(imageID))
}

func (e *targets) reconcile(ctx context.Context, fs *filestore.Store) ([]string, error) {
	imgs, err := fs.List(ctx)
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
		x, err := e.export(fs, img, nil)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rec, err := e.readRecord(fs, img.ID)
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

func (e *targets) recordPath(fs *filestore.Store, id string) string {
	return filepath.Join(fs.Dir(), recordsDir, id+".json")
}

func (e *targets) readRecord(fs *filestore.Store, id string) (exportRecord, error) {
	var rec exportRecord
	data, err := os.ReadFile(e.recordPath(fs, id))
	if os.IsNotExist(err) {
		return rec, nil
	}
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, fmt.Errorf("export record %s is corrupt: %w", e.recordPath(fs, id), err)
	}
	return rec, nil
}

func (e *targets) writeRecord(fs *filestore.Store, id string, rec exportRecord) error {
	if err := os.MkdirAll(filepath.Dir(e.recordPath(fs, id)), 0o750); err != nil {
		return err
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return atomicfile.Write(e.recordPath(fs, id), append(data, '\n'), 0o600)
}

func (e *targets) removeRecord(fs *filestore.Store, id string) error {
	return atomicfile.Remove(e.recordPath(fs, id))
}

// exporter is the one backend.GrantExporter with what an iSCSI node needs
// from the controller besides the target, since it reads no pool: before
// the grant, the store learns from the image whether it was formatted
// (formatted.go); after it, the publish_context names the initiator the
// target's ACL now admits, which the node checks is its own.
type exporter struct {
	*backend.GrantExporter
	store *Store
	cfg   Config
}

var _ backend.Exporter = exporter{}

// Publish implements backend.Exporter.
func (e exporter) Publish(ctx context.Context, imageID string, att backend.Attachment) (map[string]string, error) {
	// What the grant checks first (the initiator name, the CHAP secrets),
	// before anything looks at the image.
	if err := e.Hooks.CheckPublish(ctx, att); err != nil {
		return nil, err
	}
	if err := e.store.learnFormatted(ctx, imageID); err != nil {
		return nil, err
	}
	pc, err := e.GrantExporter.Publish(ctx, imageID, att)
	if err != nil {
		return nil, err
	}
	initiator, err := InitiatorIQN(e.cfg.InitiatorPrefix, att.NodeID)
	if err != nil {
		return nil, err
	}
	pc[ContextInitiator] = initiator
	return pc, nil
}
