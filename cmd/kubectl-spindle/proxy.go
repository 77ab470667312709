package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/spindle-csi/spindle/internal/opsapi"
)

// The chart's labels (charts/spindle/templates/_helpers.tpl,
// spindle.selectorLabels): the plugin finds the driver's pods by them, so it
// needs no node IP, no hostNetwork and no port open beyond the pod network.
const (
	// DefaultPodSelector is app.kubernetes.io/name of the chart's pods
	// (the chart's name, or its nameOverride).
	DefaultPodSelector = "app.kubernetes.io/name=spindle"
	componentLabel     = "app.kubernetes.io/component"
	componentNode      = "node"
	componentCtrl      = "controller"
	// metricsPortName is the name the chart gives the driver container's
	// --metrics-address port.
	metricsPortName = "metrics"
	driverContainer = "spindle"
	defaultDriver   = "spindle.csi.dev"
)

// PermissionError is an API request that RBAC refused. It names the verb,
// the resource and the namespace, and the user the API server saw, so that
// an operator can ask for exactly the missing rule.
type PermissionError struct {
	Verb, Resource string
	Namespace      string // "" for a cluster-wide request
	User           string // from the API server's message; "" when it names none
	Err            error
}

// forbiddenUser finds the user in the API server's refusal:
// `pods "x" is forbidden: User "alice" cannot get resource "pods/proxy" ...`.
var forbiddenUser = regexp.MustCompile(`User "([^"]*)"`)

// asPermissionError turns an API server's 403 into a PermissionError and
// leaves any other error as it is.
func asPermissionError(err error, verb, resource, namespace string) error {
	if !apierrors.IsForbidden(err) {
		return err
	}
	pe := &PermissionError{Verb: verb, Resource: resource, Namespace: namespace, Err: err}
	if m := forbiddenUser.FindStringSubmatch(err.Error()); m != nil {
		pe.User = m[1]
	}
	return pe
}

func (e *PermissionError) where() string {
	if e.Namespace == "" {
		return "in any namespace"
	}
	return "in namespace " + e.Namespace
}

func (e *PermissionError) Error() string {
	who := ""
	if e.User != "" {
		who = fmt.Sprintf(" for user %q", e.User)
	}
	return fmt.Sprintf("cannot %s %s %s: RBAC needs verb %q on resource %q%s (the API server said: %v)",
		e.Verb, e.Resource, e.where(), e.Verb, e.Resource, who, e.Err)
}

func (e *PermissionError) Unwrap() error { return e.Err }

// Fix is the kubectl commands that grant the missing rule: a Role in the
// namespace, or a ClusterRole for a cluster-wide request.
func (e *PermissionError) Fix() string {
	name := "spindle-operator-" + strings.NewReplacer("/", "-").Replace(e.Resource)
	subject := "--user=" + e.User
	if sa, ok := strings.CutPrefix(e.User, "system:serviceaccount:"); ok {
		subject = "--serviceaccount=" + sa
	} else if e.User == "" {
		subject = "--user=<you>"
	}
	rule := fmt.Sprintf("--verb=%s --resource=%s", e.Verb, e.Resource)
	if e.Namespace == "" {
		return fmt.Sprintf("kubectl create clusterrole %s %s && kubectl create clusterrolebinding %s --clusterrole=%s %s", name, rule, name, name, subject)
	}
	return fmt.Sprintf("kubectl create role %s -n %s %s && kubectl create rolebinding %s -n %s --role=%s %s",
		name, e.Namespace, rule, name, e.Namespace, name, subject)
}

// podFinder finds the driver's pods by the chart's labels: the node plugin
// of a node, a controller. It lists them once per command.
type podFinder struct {
	kube      kubernetes.Interface
	namespace string // --driver-namespace; "" looks in every namespace
	selector  string // --pod-selector
	driver    string // --driver: pods of another install of the chart are not ours

	mu     sync.Mutex
	loaded map[string][]corev1.Pod // component -> pods
}

func (f *podFinder) selectorOf(component string) string {
	return f.selector + "," + componentLabel + "=" + component
}

// pods lists the component's pods (once) that serve f.driver.
func (f *podFinder) pods(ctx context.Context, component string) ([]corev1.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if pods, ok := f.loaded[component]; ok {
		return pods, nil
	}
	list, err := f.kube.CoreV1().Pods(f.namespace).List(ctx, metav1.ListOptions{LabelSelector: f.selectorOf(component)})
	if err != nil {
		return nil, asPermissionError(err, "list", "pods", f.namespace)
	}
	var pods []corev1.Pod
	for _, p := range list.Items {
		if servesDriver(&p, f.driver) {
			pods = append(pods, p)
		}
	}
	// Ready and running first, then by name: the same pod every time.
	sort.SliceStable(pods, func(i, j int) bool {
		if ri, rj := podReady(&pods[i]), podReady(&pods[j]); ri != rj {
			return ri
		}
		return pods[i].Namespace+"/"+pods[i].Name < pods[j].Namespace+"/"+pods[j].Name
	})
	if f.loaded == nil {
		f.loaded = map[string][]corev1.Pod{}
	}
	f.loaded[component] = pods
	return pods, nil
}

// find returns the running pod of component on nodeName ("" for any node).
func (f *podFinder) find(ctx context.Context, component, nodeName string) (*corev1.Pod, error) {
	pods, err := f.pods(ctx, component)
	if err != nil {
		return nil, err
	}
	var notRunning []string
	for i := range pods {
		p := &pods[i]
		if nodeName != "" && p.Spec.NodeName != nodeName {
			continue
		}
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && p.Status.PodIP != "" {
			return p, nil
		}
		notRunning = append(notRunning, fmt.Sprintf("%s/%s is %s", p.Namespace, p.Name, p.Status.Phase))
	}
	where := "in any namespace"
	if f.namespace != "" {
		where = "in namespace " + f.namespace
	}
	what := fmt.Sprintf("no running %s pod of %s (labels %s, %s)", component, f.driver, f.selectorOf(component), where)
	if nodeName != "" {
		what = fmt.Sprintf("no running node plugin pod of %s on node %s (labels %s, %s)", f.driver, nodeName, f.selectorOf(component), where)
	}
	if len(notRunning) > 0 {
		what += ": " + strings.Join(notRunning, ", ")
	}
	if nodeName != "" {
		what += fmt.Sprintf("; a plugin outside the chart is reached with --node-address=%s=HOST:PORT", nodeName)
	}
	return nil, errors.New(what)
}

// servesDriver reports whether the pod's driver container runs for driver
// (its --driver-name, or the driver's default when it has none).
func servesDriver(p *corev1.Pod, driver string) bool {
	c := driverContainerOf(p)
	if c == nil {
		return false
	}
	name := defaultDriver
	if v, ok := argValue(c.Args, "driver-name"); ok {
		name = v
	}
	return name == driver
}

func driverContainerOf(p *corev1.Pod) *corev1.Container {
	for i := range p.Spec.Containers {
		if p.Spec.Containers[i].Name == driverContainer {
			return &p.Spec.Containers[i]
		}
	}
	return nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// argValue finds --name=value or --name value in args.
func argValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// endpointPort is the port of the pod's operators' endpoints: the driver
// container's port named "metrics" (the chart declares it), else the port
// of its --metrics-address, else fallback. A pod whose driver listens on
// loopback only, or not at all, cannot be reached through the API server:
// that is an error saying so.
func endpointPort(p *corev1.Pod, fallback int) (int, error) {
	c := driverContainerOf(p)
	if c == nil {
		return 0, fmt.Errorf("pod %s/%s has no %s container", p.Namespace, p.Name, driverContainer)
	}
	addr, hasAddr := argValue(c.Args, "metrics-address")
	if hasAddr && addr == "" || !hasAddr && len(c.Args) > 0 && !hasNamedPort(c) {
		return 0, fmt.Errorf("pod %s/%s serves no endpoints: its driver runs without --metrics-address (the chart's driver.metrics.enabled)", p.Namespace, p.Name)
	}
	if host, _, err := net.SplitHostPort(addr); err == nil && host != "" {
		if ip := net.ParseIP(host); (ip != nil && ip.IsLoopback() || host == "localhost") && !isLoopbackIP(p.Status.PodIP) {
			return 0, fmt.Errorf("pod %s/%s listens on %s only, which the API server cannot reach at the pod's IP %s (the chart's driver.metrics.bindAddress); give the address with --node-address or --controller-url", p.Namespace, p.Name, addr, p.Status.PodIP)
		}
	}
	for _, port := range c.Ports {
		if port.Name == metricsPortName {
			return int(port.ContainerPort), nil
		}
	}
	if _, port, err := net.SplitHostPort(addr); err == nil {
		if n, err := strconv.Atoi(port); err == nil && n > 0 {
			return n, nil
		}
	}
	return fallback, nil
}

func hasNamedPort(c *corev1.Container) bool {
	for _, p := range c.Ports {
		if p.Name == metricsPortName {
			return true
		}
	}
	return false
}

func isLoopbackIP(s string) bool {
	ip := net.ParseIP(s)
	return ip != nil && ip.IsLoopback()
}

// podProxy GETs a path of a pod's endpoints through the API server's pod
// proxy (/api/v1/namespaces/NS/pods/NAME:PORT/proxy/PATH): it needs only
// "get" on pods/proxy, and reaches a pod wherever the API server can.
type podProxy struct {
	kube    kubernetes.Interface
	timeout time.Duration
}

func (pp *podProxy) getJSON(ctx context.Context, pod *corev1.Pod, port int, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, pp.timeout)
	defer cancel()
	// Not Pods().ProxyGet(): its DoRaw drops the API server's Status, and
	// with it the message that says who was refused what.
	res := pp.kube.CoreV1().RESTClient().Get().Namespace(pod.Namespace).Resource("pods").
		Name(pod.Name + ":" + strconv.Itoa(port)).SubResource("proxy").Suffix(path).Do(ctx)
	if err := res.Error(); err != nil {
		return asPermissionError(err, "get", "pods/proxy", pod.Namespace)
	}
	body, err := res.Raw()
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("pod %s/%s port %d %s: %w", pod.Namespace, pod.Name, port, path, err)
	}
	return nil
}

// proxyNodePlugins reads each node plugin's /volumes through its pod's proxy.
type proxyNodePlugins struct {
	pods  *podFinder
	proxy *podProxy
	port  int // --node-port: the port when the pod declares none
}

func (p *proxyNodePlugins) NodeVolumes(ctx context.Context, node *corev1.Node) (*opsapi.NodeVolumes, error) {
	pod, err := p.pods.find(ctx, componentNode, node.Name)
	if err != nil {
		return nil, err
	}
	port, err := endpointPort(pod, p.port)
	if err != nil {
		return nil, err
	}
	var nv opsapi.NodeVolumes
	if err := p.proxy.getJSON(ctx, pod, port, opsapi.PathVolumes, &nv); err != nil {
		return nil, fmt.Errorf("node plugin of %s (pod %s/%s, through the API server): %w", node.Name, pod.Namespace, pod.Name, err)
	}
	return &nv, nil
}

// proxyController reaches a controller's endpoints (/images, adopt)
// through its pod's proxy.
type proxyController struct {
	pods  *podFinder
	proxy *podProxy
	port  int // --controller-port: the port when the pod declares none
}

// pod is the controller's pod and the port of its endpoints.
func (p *proxyController) pod(ctx context.Context) (*corev1.Pod, int, error) {
	pod, err := p.pods.find(ctx, componentCtrl, "")
	if err != nil {
		return nil, 0, fmt.Errorf("controller: %w", err)
	}
	port, err := endpointPort(pod, p.port)
	if err != nil {
		return nil, 0, fmt.Errorf("controller: %w", err)
	}
	return pod, port, nil
}

func (p *proxyController) Images(ctx context.Context) (*opsapi.Images, error) {
	pod, port, err := p.pod(ctx)
	if err != nil {
		return nil, err
	}
	var imgs opsapi.Images
	if err := p.proxy.getJSON(ctx, pod, port, opsapi.PathImages, &imgs); err != nil {
		return nil, fmt.Errorf("controller (pod %s/%s, through the API server): %w", pod.Namespace, pod.Name, err)
	}
	return &imgs, nil
}

// answerOf decodes a driver's answer: out on 200, its {"error"} otherwise.
func answerOf(status int, body []byte, out any) error {
	if status != http.StatusOK {
		var e opsapi.Error
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return fmt.Errorf("HTTP %d: %s", status, e.Error)
		}
		return fmt.Errorf("HTTP %d: %s", status, strings.TrimSpace(string(body)))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(body, out)
}

// postJSON POSTs in to a driver's endpoint at url (--controller-url, a
// node's direct address) within timeout and decodes its answer into out.
func postJSON(ctx context.Context, client *http.Client, url string, timeout time.Duration, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	data, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("POST %s: %w", url, err)
	}
	if err := answerOf(resp.StatusCode, body, out); err != nil {
		return fmt.Errorf("POST %s: %w", url, err)
	}
	return nil
}

// postJSON POSTs to a pod's endpoint through the API server's proxy
// within timeout (or the request timeout, when longer): it needs "create"
// on pods/proxy.
func (pp *podProxy) postJSON(ctx context.Context, pod *corev1.Pod, port int, path string, timeout time.Duration, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, max(pp.timeout, timeout))
	defer cancel()
	data, err := json.Marshal(in)
	if err != nil {
		return err
	}
	var status int
	body, err := pp.kube.CoreV1().RESTClient().Post().Namespace(pod.Namespace).Resource("pods").
		Name(pod.Name+":"+strconv.Itoa(port)).SubResource("proxy").Suffix(path).
		SetHeader("Content-Type", "application/json").Body(data).Do(ctx).StatusCode(&status).Raw()
	if err != nil && status == 0 {
		return asPermissionError(err, "create", "pods/proxy", pod.Namespace)
	}
	if status == http.StatusForbidden && !isDriverAnswer(body) {
		return asPermissionError(err, "create", "pods/proxy", pod.Namespace)
	}
	if err := answerOf(status, body, out); err != nil {
		return fmt.Errorf("pod %s/%s port %d %s: %w", pod.Namespace, pod.Name, port, path, err)
	}
	return nil
}

// isDriverAnswer tells the driver's own error body from the API server's.
func isDriverAnswer(body []byte) bool {
	var e opsapi.Error
	return json.Unmarshal(body, &e) == nil && e.Error != ""
}
