// Package sanity runs the kubernetes-csi csi-sanity suite in-process against
// a real Spindle driver over its socket, on a real loop pool, with real
// loop devices, mkfs and mounts. Ginkgo runs one suite per process, so the
// mount and block runs live in the two sub-packages.
package sanity

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"

	"github.com/spindle-csi/spindle/e2e/harness"
)

// idGen makes IDs in Spindle's format, so that "does not exist" tests reach
// the lookup instead of stopping at ID validation.
type idGen struct{ instance string }

func random() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (g idGen) GenerateUniqueValidVolumeID() string {
	return g.instance + "/sanity-missing-" + random()
}
func (idGen) GenerateInvalidVolumeID() string   { return "not-a-spindle-volume-id" }
func (idGen) GenerateUniqueValidNodeID() string { return "sanity-unknown-node-" + random() }
func (idGen) GenerateInvalidNodeID() string     { return "not a node id!" }

// attachLimit is the driver's --max-volumes-per-node in the sanity runs;
// csi-sanity's attach-limit spec publishes this many volumes and one more.
const attachLimit = 8

// Config describes one csi-sanity run.
type Config struct {
	// AccessType is "mount" or "block".
	AccessType string
	// NodeLocal makes the loop instance node-local, so the driver reports
	// topology and the topology specs run too.
	NodeLocal bool
	// Backend names the run in its report ("loop" when empty).
	Backend string
	// Mode, when set, names the attach path in the report instead of the
	// instance, e.g. "kernel/tgt" or "krbd".
	Mode string
	// Instance is the "<type>/<name>" key volumes are created on
	// ("loop/default" when empty); BackendConfig is the driver's --config
	// content that configures it.
	Instance      string
	BackendConfig string
	// Secrets are passed with every call that carries CSI secrets.
	Secrets map[string]string
	// MutableParameters are valid ControllerModifyVolume parameters
	// (the loop backend's directIO when nil).
	MutableParameters map[string]string
	// ControllerAddress, when set, is another driver's controller
	// service (a gRPC target such as 192.168.77.1:7000) that gets every
	// Controller RPC (see EnvController).
	ControllerAddress string
}

// EnvController names, for the RBD and iSCSI runs, a controller service
// that runs elsewhere: `make vmtest` keeps the controller (and its many
// rbd and target-tool calls) on the host, where they are not emulated,
// and sends the guest's driver only Node and Identity RPCs, as a cluster
// does.
const EnvController = "SPINDLE_SANITY_CONTROLLER"

// EnvAccess selects the access type of the in-process runs of backends
// that have one test package (iSCSI, RBD): ginkgo runs one suite per
// process, so `make vmtest` runs their binary once per access type.
const EnvAccess = "SPINDLE_SANITY_ACCESS"

// AccessFromEnv is EnvAccess, "mount" when unset.
func AccessFromEnv(t *testing.T) string {
	switch a := os.Getenv(EnvAccess); a {
	case "":
		return "mount"
	case "mount", "block":
		return a
	default:
		t.Fatalf("%s=%q: want mount or block", EnvAccess, a)
		return ""
	}
}

// Run runs csi-sanity as c describes and reports how many specs ran,
// passed, failed and were skipped.
func Run(t *testing.T, c Config) {
	if c.Backend == "" {
		c.Backend = "loop"
	}
	if c.Instance == "" {
		c.Instance = "loop/default"
	}
	if c.MutableParameters == nil {
		c.MutableParameters = map[string]string{"directIO": "false"}
	}
	accessType, nodeLocal := c.AccessType, c.NodeLocal
	// With ControllerAddress set the driver started here still runs both
	// services, though the suite sends every Controller RPC to the other
	// one: csi-sanity (v5.6.0, node.go) asks the node endpoint's Identity
	// whether the plugin has a controller, and without CONTROLLER_SERVICE
	// there it stages volumes it never published, which Spindle refuses.
	drv := harness.Start(t, harness.Options{MaxVolumesPerNode: attachLimit, NodeLocal: nodeLocal, Config: c.BackendConfig})
	dir := harness.TempDir(t)

	cfg := sanity.NewTestConfig()
	cfg.Address = "unix://" + drv.Socket
	cfg.ControllerAddress = c.ControllerAddress
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.TestVolumeAccessType = accessType
	cfg.TestVolumeSize = 64 << 20
	cfg.IDGen = idGen{instance: c.Instance}
	cfg.IdempotentCount = 3
	cfg.TestVolumeExpandSize = 128 << 20
	cfg.TestNodeVolumeAttachLimit = true
	cfg.TestVolumeMutableParameters = c.MutableParameters
	if c.Instance != "loop/default" {
		cfg.TestVolumeParameters = map[string]string{"backend": c.Instance}
	}
	if len(c.Secrets) > 0 {
		// csi-sanity reads secrets from a file only.
		cfg.SecretsFile = filepath.Join(dir, "secrets.yaml")
		writeSecrets(t, cfg.SecretsFile, c.Secrets)
	}
	harness.CheckNoLeaks(t, drv.PoolDir, dir)

	var summary string
	ginkgo.ReportAfterSuite("spec count", func(r ginkgo.Report) { summary = summarize(r, c) })
	sc := sanity.GinkgoTest(&cfg)
	gomega.RegisterFailHandler(ginkgo.Fail)
	ginkgo.RunSpecs(t, "csi-sanity "+accessType)
	sc.Finalize()

	t.Log(summary)
	report(t, reportName("sanity", c.Backend, accessType, c.Mode), summary)
}

// summarize is a run's report line: how many specs ran, passed, failed and
// were skipped, and each spec that did not run, with why.
func summarize(r ginkgo.Report, c Config) string {
	ran, passed, failed, skipped := 0, 0, 0, 0
	var notRun []string
	for _, s := range r.SpecReports {
		if s.LeafNodeType != types.NodeTypeIt {
			continue
		}
		switch {
		case s.State == types.SpecStateSkipped || s.State == types.SpecStatePending:
			skipped++
			why := s.Failure.Message
			if s.State == types.SpecStatePending {
				why = "pending in csi-sanity itself"
			}
			notRun = append(notRun, fmt.Sprintf("  not run: %s — %s", s.FullText(), why))
		case s.State == types.SpecStatePassed:
			ran++
			passed++
		default:
			ran++
			failed++
		}
	}
	topology := "shared pool"
	if c.NodeLocal {
		topology = "node-local pool, topology on"
	}
	if c.Backend != "loop" {
		topology = c.Instance
	}
	if c.Mode != "" {
		topology = c.Mode
	}
	summary := fmt.Sprintf("csi-sanity (%s, %s, %s): %d of %d specs ran: %d passed, %d failed; %d skipped",
		c.Backend, c.AccessType, topology, ran, r.PreRunStats.TotalSpecs, passed, failed, skipped)
	sort.Strings(notRun)
	if len(notRun) > 0 {
		summary += "\n" + strings.Join(notRun, "\n")
	}
	return summary
}
