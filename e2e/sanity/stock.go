package sanity

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/spindle-csi/spindle/e2e/harness"
)

// StockConfig describes a run of the stock csi-sanity binary, as users and
// reviewers run it: its default flags, its own ID generator (IDs such as
// fake-vol-id-6fbd0cfa-e), its default 10 GiB volumes and its default
// directories (/tmp/csi-mount, /tmp/csi-staging), so the driver must allow
// the temporary directory as a path root.
type StockConfig struct {
	// Socket is the driver's CSI socket.
	Socket string
	// AccessType is "mount" or "block" (--csi.testvolumeaccesstype).
	AccessType string
	// Backend names the run in its report.
	Backend string
	// Mode, when set, names the attach path in the report, e.g. "krbd".
	Mode string
	// Secrets, when set, go to every call through --csi.secrets.
	Secrets map[string]string
	// ControllerEndpoint, when set, is another driver's controller
	// service (--csi.controllerendpoint; see EnvController).
	ControllerEndpoint string
}

// stockLock serialises stock runs across test processes: they all use
// csi-sanity's fixed default directories.
const stockLock = "/tmp/spindle-csi-sanity-stock.lock"

// StockBinary returns the stock csi-sanity binary that make test installs
// (hack/csi-sanity.sh) and passes as SPINDLE_CSI_SANITY, or skips.
func StockBinary(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("SPINDLE_CSI_SANITY")
	if bin == "" {
		t.Fatal("SPINDLE_CSI_SANITY is not set: the stock csi-sanity binary is missing (make test installs it with hack/csi-sanity.sh)")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("SPINDLE_CSI_SANITY=%s: %v", bin, err)
	}
	return bin
}

var (
	ansi       = regexp.MustCompile("\x1b\\[[0-9;]*m")
	ranLine    = regexp.MustCompile(`Ran (\d+) of (\d+) Specs`)
	countsLine = regexp.MustCompile(`(\d+) Passed \| (\d+) Failed \| (\d+) Pending \| (\d+) Skipped`)
)

// RunStock runs the stock csi-sanity binary against the driver at c.Socket
// and reports its counts; any failed spec fails the test.
func RunStock(t *testing.T, binary string, c StockConfig) {
	t.Helper()
	lock, err := os.OpenFile(stockLock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Flock(int(lock.Fd()), unix.LOCK_UN) }()

	args := []string{"--csi.endpoint=" + c.Socket}
	if c.ControllerEndpoint != "" {
		args = append(args, "--csi.controllerendpoint="+c.ControllerEndpoint)
	}
	if c.AccessType == "block" {
		args = append(args, "--csi.testvolumeaccesstype=block")
	}
	// For investigating a run, not for CI: e.g. SPINDLE_CSI_SANITY_ARGS=--ginkgo.v
	// shows each spec with its time.
	args = append(args, strings.Fields(os.Getenv("SPINDLE_CSI_SANITY_ARGS"))...)
	if len(c.Secrets) > 0 {
		file := filepath.Join(harness.TempDir(t), "secrets.yaml")
		writeSecrets(t, file, c.Secrets)
		args = append(args, "--csi.secrets="+file)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	runErr := cmd.Run()
	text := ansi.ReplaceAllString(out.String(), "")

	ran, counts := ranLine.FindStringSubmatch(text), countsLine.FindStringSubmatch(text)
	if ran == nil || counts == nil {
		t.Fatalf("csi-sanity %v printed no summary (%v):\n%s", args, runErr, tail(text, 4000))
	}
	n := func(s string) int { v, _ := strconv.Atoi(s); return v }
	version := strings.TrimPrefix(filepath.Base(filepath.Dir(binary)), "csi-sanity-")
	what := c.Backend + ", " + c.AccessType
	if c.Mode != "" {
		what += ", " + c.Mode
	}
	summary := fmt.Sprintf("csi-sanity %s stock binary, default flags (%s): %s of %s specs ran: %s passed, %s failed; %d not run (%s pending, %s skipped)",
		version, what, ran[1], ran[2], counts[1], counts[2], n(counts[3])+n(counts[4]), counts[3], counts[4])
	t.Log(summary)
	report(t, reportName("sanity-stock", c.Backend, c.AccessType, c.Mode), summary)
	if os.Getenv("SPINDLE_CSI_SANITY_ARGS") != "" {
		t.Log(text)
	}
	if runErr != nil || n(counts[2]) > 0 {
		t.Fatalf("csi-sanity %v: %v\n%s", args, runErr, tail(text, 20000))
	}
}

// writeSecrets writes secrets for every call, in csi-sanity's file format.
func writeSecrets(t *testing.T, file string, s map[string]string) {
	t.Helper()
	all := sanity.CSISecrets{
		CreateVolumeSecret: s, DeleteVolumeSecret: s,
		ControllerPublishVolumeSecret: s, ControllerUnpublishVolumeSecret: s,
		ControllerValidateVolumeCapabilitiesSecret: s,
		NodeStageVolumeSecret:                      s, NodePublishVolumeSecret: s,
		CreateSnapshotSecret: s, DeleteSnapshotSecret: s,
		ListSnapshotsSecret: s, GetSnapshotSecret: s,
		ControllerExpandVolumeSecret: s, ControllerModifyVolumeSecret: s,
	}
	data, err := yaml.Marshal(all)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// report writes a summary line where make test prints it from.
// reportName is a report's file name from the run's names: "sanity-iscsi-
// mount-kernel-tgt".
func reportName(parts ...string) string {
	var kept []string
	for _, p := range parts {
		if p != "" {
			kept = append(kept, strings.ReplaceAll(p, "/", "-"))
		}
	}
	return strings.Join(kept, "-")
}

func report(t *testing.T, name, summary string) {
	t.Helper()
	if dir := os.Getenv("SPINDLE_REPORT_DIR"); dir != "" {
		_ = os.MkdirAll(dir, 0o755)
		_ = os.WriteFile(filepath.Join(dir, name+".txt"), []byte(summary+"\n"), 0o644)
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
