package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/spindle-csi/spindle/internal/opsapi"
)

// fakeRotator records the requests rotate-key makes and answers them.
type fakeRotator struct {
	posts   []string
	bodies  []any
	failOn  string
	staging string
}

func (f *fakeRotator) answer(who, path string, in, out any) error {
	f.posts = append(f.posts, who+" "+path)
	f.bodies = append(f.bodies, in)
	if path == f.failOn {
		return errors.New("HTTP 503: kms vault-a (Vault transit at http://127.0.0.1:8200, path transit) is unreachable")
	}
	switch o := out.(type) {
	case *opsapi.KeyRotation:
		r := in.(opsapi.RotateKeyRequest)
		*o = opsapi.KeyRotation{VolumeID: r.VolumeID, KMSID: "secrets", KeyOwner: "volume/pvc-a", WrappedKey: "w1", NextWrappedKey: "w2"}
	case *opsapi.RotatedKey:
		*o = opsapi.RotatedKey{VolumeID: in.(opsapi.KeyRotation).VolumeID, Node: "node-1", StagingPath: f.staging}
	}
	return nil
}

func (f *fakeRotator) PostController(_ context.Context, path string, in, out any) error {
	return f.answer("controller", path, in, out)
}

func (f *fakeRotator) PostNode(_ context.Context, n *corev1.Node, path string, in, out any) error {
	return f.answer("node/"+n.Name, path, in, out)
}

func encryptedPV() *corev1.PersistentVolume {
	p := pv("pvc-a", "loop/default/pvc-a", "apps", "data-a")
	p.Spec.CSI.NodeStageSecretRef = &corev1.SecretReference{Namespace: "kms", Name: "volume-kek"}
	return p
}

func TestRotateKey(t *testing.T) {
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kms", Name: "volume-kek"}, Data: map[string][]byte{"encryptionPassphrase": []byte("s3cret-of-16-bytes")}}
	client := fake.NewClientset(encryptedPV(), pvc("apps", "data-a", "pvc-a"), va("pvc-a", "node-1", attached), readyNode("node-1", true), secret)
	r := &fakeRotator{staging: "/var/lib/kubelet/plugins/kubernetes.io/csi/spindle.csi.dev/abc/globalmount"}
	got, err := RotateKey(context.Background(), client, testDriver, "apps", "pvc/data-a", r)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"controller " + opsapi.PathRotateKey, "node/node-1 " + opsapi.PathRekey, "controller " + opsapi.PathCommitKey}
	if strings.Join(r.posts, ",") != strings.Join(want, ",") {
		t.Fatalf("posts %v, want %v", r.posts, want)
	}
	if s := r.bodies[0].(opsapi.RotateKeyRequest).Secrets["encryptionPassphrase"]; s != "s3cret-of-16-bytes" {
		t.Fatalf("the controller got secret %q", s)
	}
	if rot := r.bodies[1].(opsapi.KeyRotation); rot.NextWrappedKey != "w2" || rot.Secrets["encryptionPassphrase"] == "" {
		t.Fatalf("the node got %+v", rot)
	}
	if c := r.bodies[2].(opsapi.CommitKeyRequest); c.NextWrappedKey != "w2" || c.VolumeID != "loop/default/pvc-a" {
		t.Fatalf("commit %+v", c)
	}
	if got.Node != "node-1" || got.StagingPath != r.staging || got.SecretRef != "kms/volume-kek" || got.KMSID != "secrets" {
		t.Fatalf("result %+v", got)
	}

	// The node cannot rekey: nothing is committed, and the message says
	// how to finish.
	r = &fakeRotator{failOn: opsapi.PathRekey}
	_, err = RotateKey(context.Background(), client, testDriver, "apps", "pvc/data-a", r)
	if err == nil || !strings.Contains(err.Error(), "run rotate-key again") || len(r.posts) != 2 {
		t.Fatalf("RotateKey with the node failing = %v after %v", err, r.posts)
	}

	// Not attached anywhere: refused before any request.
	detached := fake.NewClientset(encryptedPV(), pvc("apps", "data-a", "pvc-a"), secret)
	r = &fakeRotator{}
	_, err = RotateKey(context.Background(), detached, testDriver, "apps", "data-a", r)
	if err == nil || !strings.Contains(err.Error(), "is attached to no node") || len(r.posts) != 0 {
		t.Fatalf("RotateKey of a detached volume = %v, posts %v", err, r.posts)
	}
}

// A driver's refusal reaches the user as the driver said it.
func TestPostJSONAnswers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == opsapi.PathCommitKey {
			w.WriteHeader(http.StatusPreconditionFailed)
			_ = json.NewEncoder(w).Encode(opsapi.Error{Error: "no rotation of volume loop/default/pvc-a to that key is under way"})
			return
		}
		_ = json.NewEncoder(w).Encode(opsapi.RotatedKey{Node: "node-1"})
	}))
	defer srv.Close()
	var out opsapi.RotatedKey
	if err := postJSON(context.Background(), srv.Client(), srv.URL+opsapi.PathRekey, rotationTimeout, opsapi.KeyRotation{}, &out); err != nil || out.Node != "node-1" {
		t.Fatalf("postJSON = %+v, %v", out, err)
	}
	err := postJSON(context.Background(), srv.Client(), srv.URL+opsapi.PathCommitKey, rotationTimeout, opsapi.CommitKeyRequest{}, nil)
	if err == nil || !strings.Contains(err.Error(), "HTTP 412: no rotation of volume loop/default/pvc-a to that key is under way") {
		t.Fatalf("postJSON of a refusal = %v", err)
	}
}
