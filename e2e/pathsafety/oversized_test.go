//go:build root

package pathsafety

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/spindle-csi/spindle/e2e/harness"
	"github.com/spindle-csi/spindle/e2e/lifecycle"
	"github.com/spindle-csi/spindle/internal/testutil"
)

// rawBytes sends a request's bytes as they are: what a proto encoder would
// refuse to produce (a string that is not UTF-8).
type rawBytes struct{}

func (rawBytes) Marshal(v any) ([]byte, error) {
	if b, ok := v.([]byte); ok {
		return b, nil
	}
	return nil, errors.New("rawBytes marshals []byte only")
}
func (rawBytes) Unmarshal(data []byte, v any) error { *(v.(*[]byte)) = data; return nil }
func (rawBytes) Name() string                       { return "proto" }

// TestOversizedAndUndecodableRequests sends the spindle binary, as it is
// deployed, requests that are refused for their size or their encoding,
// sixteen at a time: each is INVALID_ARGUMENT, the driver's peak resident
// memory stays under 100 MiB and its log grows by under 1 MiB (one
// CreateVolume with a 3 MiB name used to write a 40 MB log line, and
// sixteen took the driver to 2.4 GiB).
func TestOversizedAndUndecodableRequests(t *testing.T) {
	binary := os.Getenv("SPINDLE_BINARY")
	if binary == "" {
		t.Skip("SPINDLE_BINARY is not set: the spindle binary to test is missing (make test builds it into bin/)")
	}
	testutil.RequireRoot(t, "run the driver with its loop pool")
	work := harness.TempDir(t)
	drv, err := harness.StartProcess(harness.ProcessOptions{Binary: binary, WorkDir: work, LogLevel: "info"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := drv.Stop(); err != nil {
			t.Error(err)
		}
	})
	logPath := filepath.Join(work, "spindle.log")
	logSize := func() int64 {
		st, err := os.Stat(logPath)
		if err != nil {
			t.Fatal(err)
		}
		return st.Size()
	}
	logBefore := logSize()
	staging := filepath.Join(work, "staging")
	hugeName := strings.Repeat("n", 3<<20)
	undecodable := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte{0xff, 0xfe, 'x'})
	requests := []struct {
		name string
		call func(ctx context.Context) error
		want string
	}{
		{"CreateVolume with a 3 MiB name", func(ctx context.Context) error {
			_, err := drv.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: hugeName, VolumeCapabilities: []*csi.VolumeCapability{lifecycle.MountCapability("ext4")}})
			return err
		}, "of which name holds 3145728; the maximum is 1048576"},
		{"CreateVolume with 1 MiB of mkfsOptions", func(ctx context.Context) error {
			_, err := drv.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-mkfs", VolumeCapabilities: []*csi.VolumeCapability{lifecycle.MountCapability("ext4")},
				Parameters: map[string]string{"mkfsOptions": strings.Repeat("-O", 1<<19)}})
			return err
		}, "of which parameters holds"},
		{"NodeStageVolume with a 3 MiB volume context", func(ctx context.Context) error {
			_, err := drv.Node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "loop/default/pvc-x", StagingTargetPath: staging,
				VolumeCapability: lifecycle.MountCapability("ext4"), VolumeContext: map[string]string{"mkfsOptions": hugeName}})
			return err
		}, "of which volume_context holds"},
		{"CreateVolume that is not UTF-8", func(ctx context.Context) error {
			var resp []byte
			return drv.Conn.Invoke(ctx, "/csi.v1.Controller/CreateVolume", undecodable, &resp, grpc.ForceCodec(rawBytes{}))
		}, "was not decoded"},
	}
	for _, r := range requests {
		t.Run(r.name, func(t *testing.T) {
			var wg sync.WaitGroup
			errs := make([]error, 16)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = r.call(context.Background())
				}()
			}
			wg.Wait()
			for _, err := range errs {
				st, _ := status.FromError(err)
				if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), r.want) {
					t.Fatalf("answer %v, want INVALID_ARGUMENT saying %q", err, r.want)
				}
			}
		})
	}
	peak, err := drv.PeakRSSBytes()
	if err != nil {
		t.Fatal(err)
	}
	grown := logSize() - logBefore
	t.Logf("%d refused requests: driver peak RSS %.1f MiB, log grew %d bytes", 16*len(requests), float64(peak)/(1<<20), grown)
	if peak > 100<<20 {
		t.Errorf("the driver's peak RSS was %.1f MiB, want under 100 MiB", float64(peak)/(1<<20))
	}
	if grown > 1<<20 {
		t.Errorf("the log grew %d bytes, want under 1 MiB", grown)
	}
	if _, err := drv.Identity.Probe(context.Background(), &csi.ProbeRequest{}); err != nil {
		t.Fatalf("the driver does not answer afterwards: %v", err)
	}
}
