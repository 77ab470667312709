// Command kubectl-spindle is the operators' view of Spindle volumes, as a
// kubectl plugin (`kubectl spindle ...`): every PV of the driver with its
// attachments (volumes), the whole chain from a claim to the device on the
// node (describe), and what is stuck or leaked (doctor). It only reads.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

const usage = `kubectl spindle: Spindle volumes from claim to device.

Usage:
  kubectl spindle volumes [flags]             every PV of the driver, its attachments per node
  kubectl spindle describe PVC|PV|VOLUME-ID   the chain PVC -> PV -> attachments -> node device
                                              and staging path -> pods, with events
  kubectl spindle doctor [flags]              stuck attachments, missing images, leaked devices
                                              and mounts, each with the command that fixes it

describe takes a claim in the namespace (-n), pvc/NAME, pv/NAME or a volume
handle (loop/default/pvc-...). doctor changes nothing; it exits 1 when it
found problems.

Flags:
`

// exit codes
const (
	exitOK       = 0
	exitFindings = 1 // doctor found problems
	exitError    = 2
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr, nil))
}

// options are the command-line flags.
type options struct {
	kubeconfig, kubeContext, namespace string
	output, driver                     string
	nodePort                           int
	nodeAddresses                      []string
	controllerURL                      string
	stuckAfter                         time.Duration
}

// clients are what the commands talk to; tests inject fakes.
type clients struct {
	kube       kubernetes.Interface
	namespace  string // the namespace -n or the kubeconfig context says
	nodes      NodePlugins
	controller Controller // nil without --controller-url
	now        time.Time
}

// run is main without the exit. makeClients is nil in production.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, makeClients func(options) (*clients, error)) int {
	fs := pflag.NewFlagSet("kubectl-spindle", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	var o options
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	fs.StringVar(&o.kubeContext, "context", "", "the kubeconfig context to use")
	fs.StringVarP(&o.namespace, "namespace", "n", "", "namespace: of the claim describe looks up; volumes shows only claims of it (default: all)")
	fs.StringVarP(&o.output, "output", "o", "table", "output format: table, json or yaml")
	fs.StringVar(&o.driver, "driver", "spindle.csi.dev", "the CSI driver name")
	fs.IntVar(&o.nodePort, "node-port", 9808, "port of the node plugins' --metrics-address, on each node's InternalIP")
	fs.StringArrayVar(&o.nodeAddresses, "node-address", nil, "NODE=HOST:PORT (or URL) of a node plugin's metrics address, overriding the node's annotation "+NodeAddressAnnotation+" and InternalIP:--node-port; repeatable")
	fs.StringVar(&o.controllerURL, "controller-url", "", "the controller's metrics address (http://HOST:PORT); doctor checks PVs against its /images (skipped when empty)")
	fs.DurationVar(&o.stuckAfter, "stuck-after", 5*time.Minute, "doctor: how old an attach or detach error, or an unfinished detach, must be to count as stuck")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return exitOK
		}
		return exitError
	}
	switch o.output {
	case "table", "json", "yaml":
	default:
		fmt.Fprintf(stderr, "kubectl-spindle: -o %q: must be table, json or yaml\n", o.output)
		return exitError
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return exitError
	}
	if makeClients == nil {
		makeClients = realClients
	}
	c, err := makeClients(o)
	if err != nil {
		fmt.Fprintf(stderr, "kubectl-spindle: %v\n", err)
		return exitError
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	var result any
	var printTable func(io.Writer)
	code := exitOK
	switch cmd {
	case "volumes", "volume", "vol":
		if len(rest) != 0 {
			fmt.Fprintln(stderr, "kubectl-spindle: volumes takes no arguments")
			return exitError
		}
		vols, err := Volumes(ctx, c.kube, o.driver, o.namespace)
		if err != nil {
			fmt.Fprintf(stderr, "kubectl-spindle: %v\n", err)
			return exitError
		}
		result = vols
		printTable = func(w io.Writer) { _ = printVolumesTable(w, vols, c.now) }
	case "describe":
		if len(rest) != 1 {
			fmt.Fprintln(stderr, "kubectl-spindle: describe takes one PVC, PV or volume ID")
			return exitError
		}
		d, err := Describe(ctx, c.kube, o.driver, c.namespace, rest[0], c.nodes)
		if err != nil {
			fmt.Fprintf(stderr, "kubectl-spindle: %v\n", err)
			return exitError
		}
		result = d
		printTable = func(w io.Writer) { printDescription(w, d, c.now) }
	case "doctor":
		if len(rest) != 0 {
			fmt.Fprintln(stderr, "kubectl-spindle: doctor takes no arguments")
			return exitError
		}
		findings, err := Doctor(ctx, c.kube, DoctorOptions{
			Driver: o.driver, StuckAfter: o.stuckAfter, Now: c.now, Nodes: c.nodes, Controller: c.controller,
		})
		if err != nil {
			fmt.Fprintf(stderr, "kubectl-spindle: %v\n", err)
			return exitError
		}
		if findings == nil {
			findings = []Finding{}
		}
		if c.controller == nil && o.output == "table" {
			fmt.Fprintln(stderr, "note: --controller-url not given; PVs were not checked for missing images")
		}
		result = findings
		printTable = func(w io.Writer) { printFindings(w, findings) }
		if len(findings) > 0 {
			code = exitFindings
		}
	default:
		fmt.Fprintf(stderr, "kubectl-spindle: unknown command %q\n", cmd)
		fs.Usage()
		return exitError
	}
	if err := write(stdout, o.output, result, printTable); err != nil {
		fmt.Fprintf(stderr, "kubectl-spindle: %v\n", err)
		return exitError
	}
	return code
}

func write(w io.Writer, format string, v any, table func(io.Writer)) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	table(w)
	return nil
}

// realClients loads the kubeconfig the way kubectl does (--kubeconfig,
// $KUBECONFIG, ~/.kube/config, in-cluster) and builds the clients.
func realClients(o options) (*clients, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: o.kubeContext}
	overrides.Context.Namespace = o.namespace
	cfg := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	rest, err := cfg.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	ns, _, err := cfg.Namespace()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	kube, err := kubernetes.NewForConfig(rest)
	if err != nil {
		return nil, err
	}
	overridesByNode := map[string]string{}
	for _, a := range o.nodeAddresses {
		node, addr, ok := strings.Cut(a, "=")
		if !ok || node == "" || addr == "" {
			return nil, fmt.Errorf("--node-address=%q: want NODE=HOST:PORT", a)
		}
		overridesByNode[node] = addr
	}
	httpClient := &http.Client{Timeout: 20 * time.Second}
	c := &clients{
		kube: kube, namespace: ns, now: time.Now(),
		nodes: &httpNodePlugins{client: httpClient, overrides: overridesByNode, port: o.nodePort},
	}
	if o.controllerURL != "" {
		c.controller = &httpController{client: httpClient, url: o.controllerURL}
	}
	return c, nil
}
