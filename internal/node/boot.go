package node

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Boot identifies one run of the node's kernel. A stage record describes
// mounts and attached devices, and none of them survives a reboot: a record
// written during an earlier boot describes nothing that exists now.
type Boot struct {
	ID   string    // /proc/sys/kernel/random/boot_id: new at every boot
	Time time.Time // when the kernel booted (/proc/stat btime)
}

// The kernel's files a Boot is read from; tests point them elsewhere.
var (
	bootIDFile   = "/proc/sys/kernel/random/boot_id"
	procStatFile = "/proc/stat"
)

// ReadBoot reads this boot's identity from the kernel. Neither file is
// namespaced, so a node plugin in a container reads the node's.
func ReadBoot() (Boot, error) {
	id, err := os.ReadFile(bootIDFile)
	if err != nil {
		return Boot{}, fmt.Errorf("read the boot ID: %w", err)
	}
	b := Boot{ID: strings.TrimSpace(string(id))}
	stat, err := os.ReadFile(procStatFile)
	if err != nil {
		return b, fmt.Errorf("read the boot time: %w", err)
	}
	s := bufio.NewScanner(bytes.NewReader(stat))
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "btime "); ok {
			secs, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return b, fmt.Errorf("%s: btime %q: %w", procStatFile, v, err)
			}
			b.Time = time.Unix(secs, 0).UTC()
			return b, nil
		}
	}
	return b, errors.New(procStatFile + " has no btime line")
}

// currentBoot is read once: it does not change while the driver runs.
var currentBoot = sync.OnceValues(ReadBoot)

// EarlierBoot reports whether rec was written during a boot before b. The
// boot ID says it when both have one; a record without one (written by an
// older driver) is from an earlier boot if it was staged before b began.
// When neither can tell, the record is taken as current.
func (b Boot) EarlierBoot(rec StageRecord) bool {
	if rec.BootID != "" && b.ID != "" {
		return rec.BootID != b.ID
	}
	if rec.StagedAt.IsZero() || b.Time.IsZero() {
		return false
	}
	return rec.StagedAt.Before(b.Time)
}

// ForgetEarlierBoots removes the stage records below root that boot says
// were written during an earlier boot and whose staging path holds no
// mount, and returns them. Kubelet loses its own record of such a volume
// when a power cut catches it unwritten, and then never unstages it; the
// record would be reported as a staged volume forever. If a pod still needs
// the volume, kubelet stages it again and a new record is written.
func ForgetEarlierBoots(h Host, root string, mounts []Mount, boot Boot) ([]FoundStageRecord, error) {
	recs, err := h.StageRecords(root, mounts)
	if err != nil {
		return nil, err
	}
	var forgotten []FoundStageRecord
	var errs []error
	for _, r := range recs {
		if !boot.EarlierBoot(r.Record) || topMountAt(mounts, Resolve(r.StagingPath)) != nil {
			continue
		}
		if err := removeStageRecord(h, r.StagingPath); err != nil {
			errs = append(errs, fmt.Errorf("forget the stage record of %s at %s: %w", r.Record.VolumeID, r.StagingPath, err))
			continue
		}
		forgotten = append(forgotten, r)
	}
	return forgotten, errors.Join(errs...)
}

// ForgetEarlierBoots removes the stage records a reboot left (see the
// function of that name) below Options.StageRecordsRoot, logging each. A
// failure is logged, not returned: the records only describe, and staging
// again replaces them.
func (v *Volumes) ForgetEarlierBoots() {
	root := v.opts.StageRecordsRoot
	if root == "" {
		return
	}
	boot, err := ReadBoot()
	if err != nil {
		v.log.Warn("cannot read this boot's identity; stage records of earlier boots are kept", zap.Error(err))
		if boot.ID == "" {
			return
		}
	}
	mounts, err := v.host.Mounts()
	if err != nil {
		v.log.Warn("cannot read the mount table; stage records of earlier boots are kept", zap.Error(err))
		return
	}
	forgotten, err := ForgetEarlierBoots(v.host, root, mounts, boot)
	for _, r := range forgotten {
		v.log.Info("forgot a stage record from an earlier boot: nothing it describes survives a reboot",
			zap.String("volumeID", r.Record.VolumeID), zap.String("stagingPath", r.StagingPath),
			zap.String("device", r.Record.Device), zap.Time("stagedAt", r.Record.StagedAt))
	}
	if err != nil {
		v.log.Warn("could not forget every stage record of an earlier boot", zap.Error(err))
	}
}
