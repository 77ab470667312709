package rbdstatic

// The test binary (spindle-storage.test, built by
// hack/local-cluster/build.sh with E2E_SUITE=1): Kubernetes' e2e.test set
// up as k8s.io/kubernetes/test/e2e's own e2e_test.go sets it up (the
// framework's flags, AfterReadingAllFlags, e2e.RunE2ETests with the
// suite's SynchronizedBeforeSuite), with this package's driver instead of
// the YAML testdrivers. Run it with ginkgo as e2e.test is run, with the
// -spindle.* flags of Config after "--".

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	storageframework "k8s.io/kubernetes/test/e2e/storage/framework"
	"k8s.io/kubernetes/test/e2e/storage/testsuites"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"

	// What e2e.test links in to dump a failed test's cluster state,
	// gather metrics and wait for nodes.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
)

var (
	cfg    Config
	driver = New(&cfg)
)

// The specs are named as the YAML testdrivers' are ("External Storage
// [Driver: spindle.csi.dev] ..."), so the same focus selects them. Of
// testsuites.CSISuites only the pre-provisioned patterns register: the
// driver implements no other volume type.
var _ = framework.Describe(describeArgs()...)

func describeArgs() []interface{} {
	args := append([]interface{}{"External Storage"}, storageframework.GetDriverNameWithFeatureTags(driver)...)
	return append(args, func() { storageframework.DefineTestSuites(driver, testsuites.CSISuites) })
}

func TestMain(m *testing.M) {
	cfg.RegisterFlags(flag.CommandLine)
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unknown additional command line arguments: %s\n", flag.Args())
		os.Exit(1)
	}
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) { e2e.RunE2ETests(t) }
