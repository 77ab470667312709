package iscsi

import "context"

// Export is what one volume's target must look like.
type Export struct {
	IQN       string
	ImagePath string
	Serial    string
	// Initiators is the ACL: exactly these initiator names may log in. An
	// empty ACL locks the target (nobody logs in).
	Initiators []string
	// CHAP, when set, is required of every login.
	CHAP *CHAP
	// DirectIO opens the image with O_DIRECT when the LUN is created.
	DirectIO bool
}

// targetTool is an iSCSI target's administration: tgt (tgtadm) or LIO
// (targetcli). Every method is idempotent and safe to repeat after a crash.
type targetTool interface {
	// Apply makes the target exist exactly as e says: LUN 1 on the image
	// with its serial, the ACL, the CHAP accounts. Initiators dropped from
	// the ACL also lose their open sessions, so a revoked node cannot keep
	// writing.
	Apply(ctx context.Context, e Export) error
	// Remove deletes the target and cuts its sessions; a missing target is
	// success.
	Remove(ctx context.Context, iqn string) error
	// Resize makes LUN 1 of the target take its image file's current size;
	// a missing target is success.
	Resize(ctx context.Context, e Export) error
	// Targets lists the IQNs of the targets that exist.
	Targets(ctx context.Context) ([]string, error)
	// Probe reports whether the target can be administered.
	Probe(ctx context.Context) error
}
