//go:build root

package chart

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

var (
	driverOnce sync.Once
	driverBin  string
	driverErr  error
)

// driver builds cmd/spindle once for the package's tests.
func driver(t *testing.T) string {
	t.Helper()
	driverOnce.Do(func() {
		dir, err := os.MkdirTemp("", "spindle-chart-test-")
		if err != nil {
			driverErr = err
			return
		}
		driverBin = filepath.Join(dir, "spindle")
		out, err := exec.Command("go", "build", "-o", driverBin, "../../cmd/spindle").CombinedOutput()
		if err != nil {
			driverErr = errors.New(string(out))
		}
	})
	if driverErr != nil {
		t.Fatalf("build the driver: %v", driverErr)
	}
	return driverBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if driverBin != "" {
		os.RemoveAll(filepath.Dir(driverBin))
	}
	os.Exit(code)
}

// podSpecs are the rendered workloads' pod specs by workload name.
func podSpecs(t *testing.T, r *rendering) map[string]corev1.PodSpec {
	specs := map[string]corev1.PodSpec{}
	for _, d := range all[appsv1.Deployment](t, r, "Deployment") {
		specs[d.Name] = d.Spec.Template.Spec
	}
	for _, d := range all[appsv1.DaemonSet](t, r, "DaemonSet") {
		specs[d.Name] = d.Spec.Template.Spec
	}
	return specs
}

// The driver accepts the arguments the chart gives it: they pass its flag
// parsing and validation (exit status 2 otherwise), and it gets as far as
// reading the config file (which the test points at a missing path).
func TestDriverAcceptsTheChartsArguments(t *testing.T) {
	helm(t)
	bin := driver(t)
	for _, c := range renderings() {
		t.Run(c.name, func(t *testing.T) {
			r := mustTemplate(t, c.files, c.sets...)
			for workload, spec := range podSpecs(t, r) {
				if a := container(t, spec, "attachd"); a != nil {
					attachDaemonAccepts(t, bin, a.Args)
				}
				d := container(t, spec, "spindle")
				if d == nil {
					continue
				}
				missing := filepath.Join(t.TempDir(), "no-config.yaml")
				var args []string
				for _, a := range d.Args {
					a = strings.ReplaceAll(a, "$(NODE_NAME)", "node-1")
					if strings.HasPrefix(a, "--config=") {
						a = "--config=" + missing
					}
					args = append(args, a)
				}
				cmd := exec.Command(bin, args...)
				done := make(chan struct{})
				var out []byte
				var err error
				go func() { out, err = cmd.CombinedOutput(); close(done) }()
				select {
				case <-done:
				case <-time.After(20 * time.Second):
					_ = cmd.Process.Kill()
					<-done
					t.Fatalf("%s: the driver kept running with %v", workload, args)
				}
				var exit *exec.ExitError
				if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), "no-config.yaml") {
					t.Errorf("%s: spindle %s: %v, want exit status 1 reading the config:\n%s", workload, strings.Join(args, " "), err, out)
				}
			}
		})
	}
}

// sidecarBinaries maps container names to the binaries that
// hack/local-cluster/build.sh builds.
var sidecarBinaries = map[string]string{
	"csi-provisioner":     "csi-provisioner",
	"csi-attacher":        "csi-attacher",
	"csi-resizer":         "csi-resizer",
	"csi-snapshotter":     "csi-snapshotter",
	"snapshot-controller": "snapshot-controller",
}

// Every flag the chart gives a sidecar is one that sidecar has (at the
// versions the local cluster builds; skipped when they are not built).
func TestSidecarsKnowTheirFlags(t *testing.T) {
	helm(t)
	home, _ := os.UserHomeDir()
	binDir := filepath.Join(home, ".cache", "spindle", "local-cluster", "bin")
	usage := map[string]string{}
	for _, b := range sidecarBinaries {
		out, _ := exec.Command(filepath.Join(binDir, b), "--help").CombinedOutput()
		if !strings.Contains(string(out), "-csi-address") && b != "snapshot-controller" || !strings.Contains(string(out), "leader-election") {
			t.Skipf("%s in %s does not run or print its flags (run hack/local-cluster/build.sh): %.200s", b, binDir, out)
		}
		usage[b] = string(out)
	}
	for _, c := range renderings() {
		t.Run(c.name, func(t *testing.T) {
			r := mustTemplate(t, c.files, append(c.sets, "snapshotController.enabled=true")...)
			for workload, spec := range podSpecs(t, r) {
				for _, ctr := range spec.Containers {
					b, ok := sidecarBinaries[ctr.Name]
					if !ok {
						continue
					}
					for _, a := range ctr.Args {
						name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
						if !regexp.MustCompile(`(?m)^\s+--?` + regexp.QuoteMeta(name) + `(\s|$)`).MatchString(usage[b]) {
							t.Errorf("%s: %s has no flag %s", workload, b, a)
						}
					}
				}
			}
		})
	}
}

// attachDaemonAccepts runs the attach daemon with the chart's arguments
// (its socket in a temporary directory): it serves, and stops on SIGTERM
// with exit status 0.
func attachDaemonAccepts(t *testing.T, bin string, chartArgs []string) {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "attachd.sock")
	var args []string
	for _, a := range chartArgs {
		if strings.HasPrefix(a, "--attach-daemon-socket=") {
			a = "--attach-daemon-socket=" + socket
		}
		args = append(args, a)
	}
	cmd := exec.Command(bin, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(socket); err == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("attach daemon %v exited before serving: %v\n%s", args, err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			t.Fatalf("attach daemon %v never made its socket:\n%s", args, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("attach daemon %v stopped with %v:\n%s", args, err, out.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Errorf("attach daemon %v did not stop on SIGTERM", args)
	}
}
