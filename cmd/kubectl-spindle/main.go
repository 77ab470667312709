// Command kubectl-spindle is the operators' view of Spindle volumes, as a
// kubectl plugin (`kubectl spindle ...`): every PV of the driver with its
// attachments (volumes), the whole chain from a claim to the device on the
// node (describe), and what is stuck or leaked (doctor); these only read.
// rotate-key changes an encrypted volume's key while it is in use; adopt
// moves a claim of ceph-csi's RBD driver onto Spindle in place.
// It reaches the driver's node plugins and controller through the API
// server's pod proxy, with the user's own credentials and kubectl's flags.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

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
	// config are kubectl's flags: --kubeconfig, --context, -n, --as, ...
	config          *genericclioptions.ConfigFlags
	allNamespaces   bool
	output, driver  string
	nodePort        int
	controllerPort  int
	nodeAddresses   []string
	controllerURL   string
	driverNamespace string
	podSelector     string
	stuckAfter      time.Duration
}

// namespaceFlag is -n as given ("" without it, or with -A).
func (o *options) namespaceFlag() string {
	if o.allNamespaces || o.config == nil || o.config.Namespace == nil {
		return ""
	}
	return *o.config.Namespace
}

// clients are what the commands talk to; tests inject fakes.
type clients struct {
	kube       kubernetes.Interface
	namespace  string // the namespace -n or the kubeconfig context says
	nodes      NodePlugins
	controller Controller // nil: images are not checked
	rotator    KeyRotator
	adopter    AdoptController
	now        time.Time
}

// run is main without the exit. makeClients is nil in production.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, makeClients func(options) (*clients, error)) int {
	if makeClients == nil {
		makeClients = realClients
	}
	code := exitOK
	root := newRootCommand(stdout, stderr, makeClients, &code)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
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

// realClients loads the kubeconfig the way kubectl does (kubectl's flags,
// $KUBECONFIG, ~/.kube/config, in-cluster) and builds the clients.
func realClients(o options) (*clients, error) {
	rest, err := o.config.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	ns, _, err := o.config.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	kube, err := kubernetes.NewForConfig(rest)
	if err != nil {
		return nil, err
	}
	overridesByNode, err := parseNodeAddresses(o.nodeAddresses)
	if err != nil {
		return nil, err
	}
	// A proxied request waits as long as --request-timeout allows, or 20s.
	timeout := 20 * time.Second
	if rest.Timeout > 0 {
		timeout = rest.Timeout
	}
	pods := &podFinder{kube: kube, namespace: o.driverNamespace, selector: o.podSelector, driver: o.driver}
	proxy := &podProxy{kube: kube, timeout: timeout}
	httpClient := &http.Client{Timeout: timeout}
	controller := &proxyController{pods: pods, proxy: proxy, port: o.controllerPort}
	c := &clients{
		kube: kube, namespace: ns, now: time.Now(),
		nodes: &nodePlugins{client: httpClient, overrides: overridesByNode,
			proxy: &proxyNodePlugins{pods: pods, proxy: proxy, port: o.nodePort}},
		controller: controller, adopter: controller,
	}
	if o.controllerURL != "" {
		c.controller = &httpController{client: httpClient, url: o.controllerURL}
		c.adopter = &httpAdopter{client: &http.Client{}, url: o.controllerURL}
	}
	// A rotation's steps are bounded by rotationTimeout, not the reads' timeout.
	c.rotator = &rotator{client: &http.Client{}, nodes: c.nodes.(*nodePlugins), controller: o.controllerURL,
		pods: pods, proxy: proxy, nodePort: o.nodePort, ctrlPort: o.controllerPort}
	return c, nil
}

// parseNodeAddresses reads --node-address NODE=HOST:PORT flags.
func parseNodeAddresses(flags []string) (map[string]string, error) {
	byNode := map[string]string{}
	for _, a := range flags {
		node, addr, ok := strings.Cut(a, "=")
		if !ok || node == "" || addr == "" {
			return nil, fmt.Errorf("--node-address=%q: want NODE=HOST:PORT", a)
		}
		byNode[node] = addr
	}
	return byNode, nil
}
