package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// fakeAPIServer serves the few API paths kubectl-spindle reads, and the pod
// proxy, over real HTTP: client-go's fake clientset cannot proxy. RBAC is
// a set of refused "user verb resource" triples; the user is the
// impersonated one (--as), else "admin".
type fakeAPIServer struct {
	t       *testing.T
	objects []runtime.Object
	// proxied answers /api/v1/namespaces/NS/pods/NAME:PORT/proxy/PATH by
	// that full path; a path not in it is a pod the API server cannot dial.
	proxied map[string]any
	refused map[string]bool

	mu       sync.Mutex
	requests []string // "user GET path"
}

// newFakeAPIServer starts f and a client of it that acts as user ("" for
// the admin).
func newFakeAPIServer(t *testing.T, f *fakeAPIServer, user string) (*httptest.Server, kubernetes.Interface) {
	t.Helper()
	f.t = t
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	kube, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, Impersonate: rest.ImpersonationConfig{UserName: user}})
	if err != nil {
		t.Fatal(err)
	}
	return srv, kube
}

func (f *fakeAPIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	user := r.Header.Get("Impersonate-User")
	if user == "" {
		user = "admin"
	}
	f.mu.Lock()
	f.requests = append(f.requests, user+" "+r.Method+" "+r.URL.Path)
	f.mu.Unlock()
	path := r.URL.Path
	if _, rest, ok := strings.Cut(path, "/pods/"); ok && strings.Contains(rest, "/proxy/") {
		ns := strings.Split(path, "/")[4]
		if f.refused[user+" get pods/proxy"] {
			f.forbidden(w, user, "get", "pods/proxy", ns, strings.Split(rest, "/")[0])
			return
		}
		body, ok := f.proxied[path]
		if !ok {
			f.status(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "error trying to reach service: dial tcp 10.244.0.9:9808: connect: connection refused")
			return
		}
		if s, isText := body.(string); isText {
			http.Error(w, s, http.StatusInternalServerError)
			return
		}
		_ = json.NewEncoder(w).Encode(body)
		return
	}
	f.serveList(w, r, user)
}

// serveList answers a list of one kind, cluster-wide or in a namespace,
// filtered by labelSelector.
func (f *fakeAPIServer) serveList(w http.ResponseWriter, r *http.Request, user string) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	resource, ns := parts[len(parts)-1], ""
	if len(parts) >= 4 && parts[len(parts)-3] == "namespaces" {
		ns = parts[len(parts)-2]
	}
	if f.refused[user+" list "+resource] {
		f.forbidden(w, user, "list", resource, ns, "")
		return
	}
	sel, err := labels.Parse(r.URL.Query().Get("labelSelector"))
	if err != nil {
		f.status(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error())
		return
	}
	var list runtime.Object
	switch resource {
	case "pods":
		l := &corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}}
		for _, o := range f.objects {
			if p, ok := o.(*corev1.Pod); ok && (ns == "" || p.Namespace == ns) && sel.Matches(labels.Set(p.Labels)) {
				l.Items = append(l.Items, *p)
			}
		}
		list = l
	case "nodes":
		l := &corev1.NodeList{TypeMeta: metav1.TypeMeta{Kind: "NodeList", APIVersion: "v1"}}
		for _, o := range f.objects {
			if n, ok := o.(*corev1.Node); ok {
				l.Items = append(l.Items, *n)
			}
		}
		list = l
	case "persistentvolumes":
		l := &corev1.PersistentVolumeList{TypeMeta: metav1.TypeMeta{Kind: "PersistentVolumeList", APIVersion: "v1"}}
		for _, o := range f.objects {
			if pv, ok := o.(*corev1.PersistentVolume); ok {
				l.Items = append(l.Items, *pv)
			}
		}
		list = l
	case "volumeattachments":
		l := &storagev1.VolumeAttachmentList{TypeMeta: metav1.TypeMeta{Kind: "VolumeAttachmentList", APIVersion: "storage.k8s.io/v1"}}
		for _, o := range f.objects {
			if va, ok := o.(*storagev1.VolumeAttachment); ok {
				l.Items = append(l.Items, *va)
			}
		}
		list = l
	case "csinodes":
		l := &storagev1.CSINodeList{TypeMeta: metav1.TypeMeta{Kind: "CSINodeList", APIVersion: "storage.k8s.io/v1"}}
		for _, o := range f.objects {
			if cn, ok := o.(*storagev1.CSINode); ok {
				l.Items = append(l.Items, *cn)
			}
		}
		list = l
	default:
		f.status(w, http.StatusNotFound, metav1.StatusReasonNotFound, "the server could not find the requested resource")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

// forbidden answers as kube-apiserver's RBAC authorizer does.
func (f *fakeAPIServer) forbidden(w http.ResponseWriter, user, verb, resource, ns, name string) {
	group, _, _ := strings.Cut(resource, "/")
	msg := fmt.Sprintf("%s is forbidden: User %q cannot %s resource %q in API group \"\"", group, user, verb, resource)
	if name != "" {
		msg = fmt.Sprintf("%s %q is forbidden: User %q cannot %s resource %q in API group \"\"", group, name, user, verb, resource)
	}
	if ns != "" {
		msg += fmt.Sprintf(" in the namespace %q", ns)
	} else {
		msg += " at the cluster scope"
	}
	f.status(w, http.StatusForbidden, metav1.StatusReasonForbidden, msg)
}

func (f *fakeAPIServer) status(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(&metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: msg, Reason: reason, Code: int32(code),
	})
}

func (f *fakeAPIServer) requested() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

// driverPod is a pod of the chart: component node (on nodeName) or
// controller, running, with its driver's args and ports.
func driverPod(name, component, nodeName string, change func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name, Labels: map[string]string{
			"app.kubernetes.io/name": "spindle", "app.kubernetes.io/instance": "spindle", componentLabel: component,
		}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{
			Name:  driverContainer,
			Args:  []string{"--mode=" + component, "--driver-name=" + testDriver, "--metrics-address=:9808"},
			Ports: []corev1.ContainerPort{{Name: metricsPortName, ContainerPort: 9808, Protocol: corev1.ProtocolTCP}},
		}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.9",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	if change != nil {
		change(p)
	}
	return p
}
