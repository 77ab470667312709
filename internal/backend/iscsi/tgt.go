package iscsi

import (
	"bufio"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// tgt administers tgtd with tgtadm. tgtd names targets by a number (tid)
// as well as the IQN; tids are found by listing the targets, and a new
// target takes the lowest free one. One mutex serialises this process's
// changes; callers also hold the pool lock, which serialises processes.
type tgt struct {
	run    *command.Runner
	socket string // TGT_IPC_SOCKET; "" for tgtd's default
	mu     sync.Mutex
}

func newTgt(run *command.Runner, socket string) *tgt { return &tgt{run: run, socket: socket} }

// tgtTarget is one target of "tgtadm --mode target --op show".
type tgtTarget struct {
	TID      int
	IQN      string
	LUNs     map[int]tgtLUN
	Accounts []tgtAccount
	ACL      []string
	Nexus    []tgtNexus
}

type tgtLUN struct {
	Path   string
	Serial string
}

type tgtAccount struct {
	User     string
	Outgoing bool
}

// tgtNexus is a session (an I_T nexus) and its connections.
type tgtNexus struct {
	SID       int
	Initiator string
	CIDs      []int
}

func (t *tgt) adm(ctx context.Context, args ...string) (string, error) {
	return t.admSecret(ctx, false, args...)
}

// admSecret runs tgtadm; with secret the arguments (an account password)
// stay out of errors and logs.
func (t *tgt) admSecret(ctx context.Context, secret bool, args ...string) (string, error) {
	c := command.Cmd{Name: "tgtadm", Args: append([]string{"--lld", "iscsi"}, args...), SecretArgs: secret}
	if t.socket != "" {
		c.Env = []string{"TGT_IPC_SOCKET=" + t.socket}
	}
	out, err := t.run.Exec(ctx, c)
	if err != nil && strings.Contains(command.Stderr(err), "can't send the request to the tgt daemon") {
		return "", errdefs.Wrap(errdefs.ErrUnavailable, err, "tgtd is not reachable (control socket %s)", t.socketName())
	}
	return string(out), err
}

func (t *tgt) socketName() string {
	if t.socket == "" {
		return "tgtd's default"
	}
	return t.socket
}

// show lists every target.
func (t *tgt) show(ctx context.Context) ([]tgtTarget, error) {
	out, err := t.adm(ctx, "--mode", "target", "--op", "show")
	if err != nil {
		return nil, err
	}
	return parseTgtShow(out)
}

func (t *tgt) find(ctx context.Context, iqn string) (*tgtTarget, []tgtTarget, error) {
	all, err := t.show(ctx)
	if err != nil {
		return nil, nil, err
	}
	for i := range all {
		if all[i].IQN == iqn {
			return &all[i], all, nil
		}
	}
	return nil, all, nil
}

func (t *tgt) Probe(ctx context.Context) error {
	_, err := t.adm(ctx, "--mode", "sys", "--op", "show")
	return err
}

func (t *tgt) Targets(ctx context.Context) ([]string, error) {
	all, err := t.show(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(all))
	for _, tt := range all {
		out = append(out, tt.IQN)
	}
	return out, nil
}

func (t *tgt) Apply(ctx context.Context, e Export) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur, err := t.findOrCreate(ctx, e.IQN)
	if err != nil {
		return err
	}
	tid := strconv.Itoa(cur.TID)
	if lun, ok := cur.LUNs[LUN]; !ok || lun.Path != e.ImagePath {
		if ok {
			if _, err := t.adm(ctx, "--mode", "logicalunit", "--op", "delete", "--tid", tid, "--lun", strconv.Itoa(LUN)); err != nil {
				return fmt.Errorf("replace LUN %d of %s: %w", LUN, e.IQN, err)
			}
		}
		if err := t.newLUN(ctx, tid, e); err != nil {
			return err
		}
	} else if lun.Serial != e.Serial {
		if err := t.setSerial(ctx, tid, e); err != nil {
			return err
		}
	}
	if err := t.applyACL(ctx, cur, e); err != nil {
		return err
	}
	if e.CHAP.keep() {
		return nil
	}
	return t.applyCHAP(ctx, cur, e)
}

// findOrCreate returns the target named iqn, creating it with the lowest
// free tid. Another instance sharing this tgtd may take that tid between
// the listing and the creation ("this target already exists"): list again
// and retry.
func (t *tgt) findOrCreate(ctx context.Context, iqn string) (*tgtTarget, error) {
	var err error
	for range 3 {
		cur, all, ferr := t.find(ctx, iqn)
		if ferr != nil || cur != nil {
			return cur, ferr
		}
		tid := freeTID(all)
		_, err = t.adm(ctx, "--mode", "target", "--op", "new", "--tid", strconv.Itoa(tid), "--targetname", iqn)
		if err == nil {
			return &tgtTarget{TID: tid, IQN: iqn, LUNs: map[int]tgtLUN{}}, nil
		}
		if !strings.Contains(command.Stderr(err), "already exists") {
			break
		}
	}
	return nil, fmt.Errorf("create target %s: %w", iqn, err)
}

// newLUN adds LUN 1 on the image with the volume's serial and SCSI ID.
func (t *tgt) newLUN(ctx context.Context, tid string, e Export) error {
	args := []string{"--mode", "logicalunit", "--op", "new", "--tid", tid, "--lun", strconv.Itoa(LUN),
		"--backing-store", e.ImagePath, "--bstype", "rdwr"}
	if e.DirectIO {
		args = append(args, "--bsoflags", "direct")
	}
	if _, err := t.adm(ctx, args...); err != nil {
		return fmt.Errorf("add LUN %d of %s: %w", LUN, e.IQN, err)
	}
	return t.setSerial(ctx, tid, e)
}

func (t *tgt) setSerial(ctx context.Context, tid string, e Export) error {
	if _, err := t.adm(ctx, "--mode", "logicalunit", "--op", "update", "--tid", tid, "--lun", strconv.Itoa(LUN),
		"--params", "scsi_sn="+e.Serial+",scsi_id="+e.Serial); err != nil {
		return fmt.Errorf("set the serial of LUN %d of %s: %w", LUN, e.IQN, err)
	}
	return nil
}

// applyACL makes the ACL exactly e.Initiators. Entries that are not
// initiator names (addresses, "ALL") are removed too: they would let other
// initiators in.
func (t *tgt) applyACL(ctx context.Context, cur *tgtTarget, e Export) error {
	tid := strconv.Itoa(cur.TID)
	for _, a := range cur.ACL {
		if slices.Contains(e.Initiators, a) {
			continue
		}
		kind := "--initiator-address"
		if strings.HasPrefix(a, "iqn.") || strings.HasPrefix(a, "eui.") || strings.HasPrefix(a, "naa.") {
			kind = "--initiator-name"
		}
		if _, err := t.adm(ctx, "--mode", "target", "--op", "unbind", "--tid", tid, kind, a); err != nil {
			return fmt.Errorf("remove %s from the ACL of %s: %w", a, cur.IQN, err)
		}
	}
	// An ACL only guards logins: end the sessions of initiators that are
	// no longer allowed (a revoked node must stop writing now).
	for _, n := range cur.Nexus {
		if slices.Contains(e.Initiators, n.Initiator) {
			continue
		}
		if err := t.dropSession(ctx, cur, n); err != nil {
			return err
		}
	}
	for _, i := range e.Initiators {
		if slices.Contains(cur.ACL, i) {
			continue
		}
		if _, err := t.adm(ctx, "--mode", "target", "--op", "bind", "--tid", tid, "--initiator-name", i); err != nil {
			return fmt.Errorf("add %s to the ACL of %s: %w", i, cur.IQN, err)
		}
	}
	return nil
}

func (t *tgt) dropSession(ctx context.Context, cur *tgtTarget, n tgtNexus) error {
	for _, cid := range n.CIDs {
		_, err := t.adm(ctx, "--mode", "conn", "--op", "delete", "--tid", strconv.Itoa(cur.TID), "--sid", strconv.Itoa(n.SID), "--cid", strconv.Itoa(cid))
		if err != nil && !strings.Contains(command.Stderr(err), "can't find the") {
			return fmt.Errorf("end the session of %s on %s: %w", n.Initiator, cur.IQN, err)
		}
	}
	return nil
}

// applyCHAP binds exactly the accounts e.CHAP names, creating the missing
// ones. An existing account keeps its password: tgtd cannot show or update
// one (see the package comment).
func (t *tgt) applyCHAP(ctx context.Context, cur *tgtTarget, e Export) error {
	tid := strconv.Itoa(cur.TID)
	want := []tgtAccount{}
	if e.CHAP != nil {
		want = append(want, tgtAccount{User: e.CHAP.User})
		if e.CHAP.Mutual() {
			want = append(want, tgtAccount{User: e.CHAP.MutualUser, Outgoing: true})
		}
	}
	for _, a := range cur.Accounts {
		if slices.Contains(want, a) {
			continue
		}
		args := []string{"--mode", "account", "--op", "unbind", "--tid", tid, "--user", a.User}
		if a.Outgoing {
			args = append(args, "--outgoing")
		}
		if _, err := t.adm(ctx, args...); err != nil {
			return fmt.Errorf("unbind a CHAP account from %s: %w", cur.IQN, err)
		}
	}
	if len(want) == 0 {
		return nil
	}
	accounts, err := t.accounts(ctx)
	if err != nil {
		return err
	}
	passwords := map[string]string{e.CHAP.User: e.CHAP.Password}
	if e.CHAP.Mutual() {
		passwords[e.CHAP.MutualUser] = e.CHAP.MutualPassword
	}
	for _, a := range want {
		if !slices.Contains(accounts, a.User) {
			// tgtadm takes the password on its command line only.
			if _, err := t.admSecret(ctx, true, "--mode", "account", "--op", "new", "--user", a.User, "--password", passwords[a.User]); err != nil &&
				!strings.Contains(command.Stderr(err), "already exists") {
				return fmt.Errorf("create a CHAP account for %s: %w", cur.IQN, err)
			}
		}
		if slices.Contains(cur.Accounts, a) {
			continue
		}
		args := []string{"--mode", "account", "--op", "bind", "--tid", tid, "--user", a.User}
		if a.Outgoing {
			args = append(args, "--outgoing")
		}
		if _, err := t.adm(ctx, args...); err != nil {
			return fmt.Errorf("bind a CHAP account to %s: %w", cur.IQN, err)
		}
	}
	return nil
}

// accounts lists tgtd's CHAP accounts by user name.
func (t *tgt) accounts(ctx context.Context) ([]string, error) {
	out, err := t.adm(ctx, "--mode", "account", "--op", "show")
	if err != nil {
		return nil, err
	}
	var users []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "    ") {
			users = append(users, strings.TrimSpace(line))
		}
	}
	return users, nil
}

func (t *tgt) Remove(ctx context.Context, iqn string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur, _, err := t.find(ctx, iqn)
	if err != nil || cur == nil {
		return err
	}
	// --force: the target goes even with sessions; the volume is no
	// longer published anywhere, so a session left is one to cut.
	_, err = t.adm(ctx, "--mode", "target", "--op", "delete", "--force", "--tid", strconv.Itoa(cur.TID))
	if err != nil && strings.Contains(command.Stderr(err), "can't find the target") {
		return nil
	}
	return err
}

// Resize re-adds LUN 1: tgtd reads a backing file's size when the LUN is
// created and has no operation to read it again. Sessions stay up; the
// initiator sees the new capacity at its next READ CAPACITY (a rescan).
func (t *tgt) Resize(ctx context.Context, e Export) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur, _, err := t.find(ctx, e.IQN)
	if err != nil || cur == nil {
		return err
	}
	tid := strconv.Itoa(cur.TID)
	if _, ok := cur.LUNs[LUN]; ok {
		if _, err := t.adm(ctx, "--mode", "logicalunit", "--op", "delete", "--tid", tid, "--lun", strconv.Itoa(LUN)); err != nil {
			return fmt.Errorf("resize LUN %d of %s: %w", LUN, e.IQN, err)
		}
	}
	return t.newLUN(ctx, tid, e)
}

// freeTID is the lowest tid no target has.
func freeTID(all []tgtTarget) int {
	used := map[int]bool{}
	for _, t := range all {
		used[t.TID] = true
	}
	tid := 1
	for used[tid] {
		tid++
	}
	return tid
}

// parseTgtShow reads "tgtadm --mode target --op show". The layout is
// indentation: "Target N: iqn" at column 0, sections at 4, entries at 8,
// LUN attributes at 12.
func parseTgtShow(out string) ([]tgtTarget, error) {
	var targets []tgtTarget
	var cur *tgtTarget
	var section string
	lun, nexus := -1, -1
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		indent := len(line) - len(strings.TrimLeft(line, " "))
		switch {
		case trimmed == "":
			continue
		case indent == 0 && strings.HasPrefix(line, "Target "):
			head, iqn, ok := strings.Cut(strings.TrimPrefix(line, "Target "), ": ")
			tid, err := strconv.Atoi(head)
			if !ok || err != nil {
				return nil, fmt.Errorf("tgtadm printed an unexpected target line %q", line)
			}
			targets = append(targets, tgtTarget{TID: tid, IQN: strings.TrimSpace(iqn), LUNs: map[int]tgtLUN{}})
			cur = &targets[len(targets)-1]
			section = ""
		case cur == nil:
			return nil, fmt.Errorf("tgtadm printed %q before any target", line)
		case indent == 4:
			section = strings.TrimSuffix(trimmed, ":")
			lun, nexus = -1, -1
		case section == "LUN information" && strings.HasPrefix(trimmed, "LUN: "):
			n, err := strconv.Atoi(strings.TrimPrefix(trimmed, "LUN: "))
			if err != nil {
				return nil, fmt.Errorf("tgtadm printed an unexpected LUN line %q", line)
			}
			lun = n
			cur.LUNs[lun] = tgtLUN{}
		case section == "LUN information" && lun >= 0:
			l := cur.LUNs[lun]
			if v, ok := strings.CutPrefix(trimmed, "Backing store path: "); ok {
				l.Path = v
			} else if v, ok := strings.CutPrefix(trimmed, "SCSI SN: "); ok {
				l.Serial = v
			}
			cur.LUNs[lun] = l
		case section == "I_T nexus information" && strings.HasPrefix(trimmed, "I_T nexus: "):
			sid, err := strconv.Atoi(strings.TrimPrefix(trimmed, "I_T nexus: "))
			if err != nil {
				return nil, fmt.Errorf("tgtadm printed an unexpected nexus line %q", line)
			}
			cur.Nexus = append(cur.Nexus, tgtNexus{SID: sid})
			nexus = len(cur.Nexus) - 1
		case section == "I_T nexus information" && nexus >= 0:
			n := &cur.Nexus[nexus]
			if v, ok := strings.CutPrefix(trimmed, "Initiator: "); ok {
				n.Initiator, _, _ = strings.Cut(v, " ")
			} else if v, ok := strings.CutPrefix(trimmed, "Connection: "); ok {
				if cid, err := strconv.Atoi(v); err == nil {
					n.CIDs = append(n.CIDs, cid)
				}
			}
		case section == "Account information" && indent == 8:
			user, outgoing := strings.CutSuffix(trimmed, " (outgoing)")
			cur.Accounts = append(cur.Accounts, tgtAccount{User: user, Outgoing: outgoing})
		case section == "ACL information" && indent == 8:
			cur.ACL = append(cur.ACL, trimmed)
		}
	}
	return targets, sc.Err()
}
