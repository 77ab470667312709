package driver

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/spindle-csi/spindle/internal/config"
)

// Oversized requests are refused INVALID_ARGUMENT naming the field and the
// bound, before they are used, and the log line about them stays short.
func TestOversizedRequestsAreRefused(t *testing.T) {
	e := newTestEnv(t)
	big := strings.Repeat("n", 3<<20)
	many := map[string]string{}
	for i := range 100 {
		many[fmt.Sprintf("k%d", i)] = "v"
	}
	staging := filepath.Join(e.kubelet, "staging")
	longPath := filepath.Join(e.kubelet, strings.Repeat("d/", 2100))
	tests := []struct {
		name string
		call func() error
		want []string
	}{
		{"a 3 MiB name", func() error { _, err := e.CreateVolume(createReq(big)); return err }, []string{"name is 3145728 bytes long; the maximum is 128"}},
		{"100 parameters", func() error {
			r := createReq("pvc-params")
			r.Parameters = many
			_, err := e.CreateVolume(r)
			return err
		}, []string{"parameters has 100 entries; the maximum is 64"}},
		{"1 MiB of mkfsOptions", func() error {
			r := createReq("pvc-mkfs")
			r.Parameters = map[string]string{"mkfsOptions": strings.Repeat("-", 1<<20)}
			_, err := e.CreateVolume(r)
			return err
		}, []string{`parameters["mkfsOptions"] is 1048576 bytes long; the maximum is 4096`}},
		{"2000 bytes of mkfsOptions", func() error {
			r := createReq("pvc-mkfs")
			r.Parameters = map[string]string{"mkfsOptions": strings.Repeat("-E x ", 400)}
			_, err := e.CreateVolume(r)
			return err
		}, []string{"parameters.mkfsOptions is 2000 bytes long; the maximum is 1024"}},
		{"a 100 KiB secret", func() error {
			r := createReq("pvc-secret")
			r.Secrets = map[string]string{"the-key-name": strings.Repeat("s", 100<<10)}
			_, err := e.CreateVolume(r)
			return err
		}, []string{"secrets entry is 102400 bytes long; the maximum is 65536"}},
		{"100 capabilities", func() error {
			r := createReq("pvc-caps")
			for range 100 {
				r.VolumeCapabilities = append(r.VolumeCapabilities, mountCap("ext4", snw))
			}
			_, err := e.CreateVolume(r)
			return err
		}, []string{"volume_capabilities has 101 entries; the maximum is 64"}},
		{"a 4 KiB mount flag", func() error {
			r := createReq("pvc-flags")
			r.VolumeCapabilities = []*csi.VolumeCapability{mountCap("ext4", snw, strings.Repeat("f", 4096))}
			_, err := e.CreateVolume(r)
			return err
		}, []string{"volume_capabilities[0].mount.mount_flags[0] is 4096 bytes long; the maximum is 1024"}},
		{"a 3 MiB volume ID", func() error {
			return e.NodeUnstage(&csi.NodeUnstageVolumeRequest{VolumeId: big, StagingTargetPath: staging})
		}, []string{"volume_id is 3145728 bytes long; the maximum is 1024"}},
		{"a 4 KiB publish context value", func() error {
			return e.NodeStage(&csi.NodeStageVolumeRequest{VolumeId: "loop/default/pvc-x", StagingTargetPath: staging, VolumeCapability: mountCap("ext4", snw),
				PublishContext: map[string]string{"imagePath": strings.Repeat("p", 5000)}})
		}, []string{`publish_context["imagePath"] is 5000 bytes long; the maximum is 4096`}},
		{"a path longer than PATH_MAX", func() error {
			return e.NodeUnpublish(&csi.NodeUnpublishVolumeRequest{VolumeId: "loop/default/pvc-x", TargetPath: longPath})
		}, []string{"target_path is", "the maximum is 4096"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := e.logs.Len()
			wantCode(t, tc.call(), codes.InvalidArgument, tc.want...)
			for _, entry := range e.logs.All()[before:] {
				size := len(entry.Message)
				for _, f := range entry.Context {
					size += len(f.Key) + len(f.String)
				}
				if size > 16<<10 {
					t.Errorf("a log line of %d bytes for a refused request", size)
				}
				if f, ok := entry.ContextMap()["request"].(string); ok && strings.Contains(f, strings.Repeat("s", 300)) {
					t.Error("the log line carries the secret's value")
				}
			}
		})
	}
	if images := e.poolImages(t, defaultKey); len(images) != 0 {
		t.Fatalf("refused requests created %v", images)
	}
}

// rawCodec sends bytes as they are, so a test can send what a proto
// encoder would refuse to produce.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.([]byte); ok {
		return b, nil
	}
	return nil, errors.New("rawCodec marshals []byte only")
}
func (rawCodec) Unmarshal(data []byte, v any) error { *(v.(*[]byte)) = data; return nil }
func (rawCodec) Name() string                       { return "proto" }

// A request grpc-go's codec cannot decode (a string that is not UTF-8) is
// answered INVALID_ARGUMENT through the interceptors, so it is logged like
// every other refusal, instead of INTERNAL before any of them ran.
func TestUndecodableRequestIsInvalidArgument(t *testing.T) {
	e := newTestEnv(t, withMode(config.ModeController))
	socket, err := config.SocketPath(e.d.opts.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	// CreateVolumeRequest.name (field 1) holding the bytes ff fe.
	req := protowire.AppendTag(nil, 1, protowire.BytesType)
	req = protowire.AppendBytes(req, []byte{0xff, 0xfe})
	var resp []byte
	err = conn.Invoke(ctx, "/csi.v1.Controller/CreateVolume", req, &resp, grpc.ForceCodec(rawCodec{}))
	st, _ := status.FromError(err)
	if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "was not decoded") || !strings.Contains(st.Message(), "UTF-8") {
		t.Fatalf("undecodable CreateVolume = %v, want INVALID_ARGUMENT saying it could not be decoded (invalid UTF-8)", err)
	}
	logged := e.logs.FilterField(zap.String("code", "InvalidArgument")).FilterField(zap.String("method", "CreateVolume")).All()
	if len(logged) != 1 {
		t.Fatalf("%d log lines for the undecodable request, want 1", len(logged))
	}
	// A request over the size bound is not decoded at all; the answer names
	// the field that holds most of it.
	_, err = csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{Name: strings.Repeat("n", 2<<20)})
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "of which name holds 2097152; the maximum is 1048576") {
		t.Fatalf("a 2 MiB CreateVolume = %v, want INVALID_ARGUMENT naming the name field and the bound", err)
	}
	// The server is fine afterwards.
	if _, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{}); err != nil {
		t.Fatal(err)
	}
}
