package driver

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/spindle-csi/spindle/internal/backend"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// rpcLines returns the "rpc" log entries and forgets every entry so far.
func rpcLines(e *testEnv) []observer.LoggedEntry {
	var out []observer.LoggedEntry
	for _, le := range e.logs.TakeAll() {
		if le.Message == "rpc" {
			out = append(out, le)
		}
	}
	return out
}

func oneRPCLine(t *testing.T, e *testEnv) observer.LoggedEntry {
	t.Helper()
	lines := rpcLines(e)
	if len(lines) != 1 {
		t.Fatalf("%d rpc log lines, want 1: %v", len(lines), lines)
	}
	return lines[0]
}

func TestInterceptorLogsOneLinePerRPC(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.registerNodes(t, defaultKey, "node-a")
	vol := e.mustCreate(t, createReq("pvc-log"))
	e.logs.TakeAll()

	tests := []struct {
		name       string
		call       func() error
		method     string
		level      zapcore.Level
		code       string
		fields     map[string]string // exact values
		errorField string            // substring of the "error" field; "" = no such field
	}{
		{
			name:   "success",
			call:   func() error { return e.ControllerUnpublish(vol, "node-a") },
			method: "ControllerUnpublishVolume", level: zapcore.InfoLevel, code: "OK",
			fields: map[string]string{"volumeID": vol, "nodeID": "node-a"},
		},
		{
			name: "create logs the new volume's ID",
			call: func() error {
				_, err := e.CreateVolume(createReq("pvc-log-2"))
				return err
			},
			method: "CreateVolume", level: zapcore.InfoLevel, code: "OK",
			fields: map[string]string{"volumeID": "loop/default/pvc-log-2", "name": "pvc-log-2"},
		},
		{
			name: "refused create logs the name",
			call: func() error {
				req := createReq("pvc-log-3")
				req.Parameters = map[string]string{"nope": "x"}
				_, err := e.CreateVolume(req)
				return err
			},
			method: "CreateVolume", level: zapcore.WarnLevel, code: "InvalidArgument",
			fields: map[string]string{"name": "pvc-log-3"}, errorField: "unknown key",
		},
		{
			name: "client error",
			call: func() error {
				_, err := e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: "node-z", VolumeCapability: mountCap("ext4", snw)})
				return err
			},
			method: "ControllerPublishVolume", level: zapcore.WarnLevel, code: "NotFound",
			fields: map[string]string{"volumeID": vol, "nodeID": "node-z"}, errorField: `node "node-z" has not registered`,
		},
		{
			name:   "quiet method",
			call:   func() error { _, err := e.Probe(); return err },
			method: "Probe", level: zapcore.DebugLevel, code: "OK",
		},
		{
			name: "internal error",
			call: func() error {
				_, err := e.d.interceptor(context.Background(), &csi.DeleteVolumeRequest{VolumeId: vol},
					&grpc.UnaryServerInfo{FullMethod: "/csi.v1.Controller/DeleteVolume"},
					func(context.Context, any) (any, error) { return nil, fmt.Errorf("metadata is corrupt") })
				return err
			},
			method: "DeleteVolume", level: zapcore.ErrorLevel, code: "Internal",
			fields: map[string]string{"volumeID": vol}, errorField: "metadata is corrupt",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if (err == nil) != (tt.code == "OK") {
				t.Fatalf("call returned %v, want code %s", err, tt.code)
			}
			line := oneRPCLine(t, e)
			if line.Level != tt.level {
				t.Fatalf("level %s, want %s", line.Level, tt.level)
			}
			fields := line.ContextMap()
			if fields["method"] != tt.method || fields["code"] != tt.code {
				t.Fatalf("method %v code %v, want %s %s", fields["method"], fields["code"], tt.method, tt.code)
			}
			for k, v := range tt.fields {
				if fields[k] != v {
					t.Fatalf("field %s = %v, want %q (all: %v)", k, fields[k], v, fields)
				}
			}
			var hasDuration bool
			for _, f := range line.Context {
				if f.Key == "duration" && f.Type == zapcore.DurationType && f.Integer >= 0 {
					hasDuration = true
				}
			}
			if !hasDuration {
				t.Fatalf("no duration field in %v", fields)
			}
			if req, _ := fields["request"].(string); req == "" || !strings.HasPrefix(req, "{") {
				t.Fatalf("request field %q is not the JSON request", fields["request"])
			}
			errField, hasErr := fields["error"].(string)
			if tt.errorField == "" && hasErr {
				t.Fatalf("error field %q on a successful call", errField)
			}
			if tt.errorField != "" && !strings.Contains(errField, tt.errorField) {
				t.Fatalf("error field %q does not contain %q", errField, tt.errorField)
			}
		})
	}
}

// Secrets never reach a log line, whether the call succeeds or fails.
func TestInterceptorStripsSecrets(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.registerNodes(t, defaultKey, "node-a")
	const secret = "s3cr3t-Chap-P4ssw0rd"
	secrets := func() map[string]string {
		return map[string]string{"node.session.auth.password": secret, "userKey": secret + "-2"}
	}
	vol := e.mustCreate(t, createReq("pvc-secret"))
	e.logs.TakeAll()

	tests := []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"CreateVolume", func() error {
			req := createReq("pvc-secret-2")
			req.Secrets = secrets()
			_, err := e.CreateVolume(req)
			return err
		}, codes.OK},
		{"CreateVolume refused", func() error {
			req := createReq("")
			req.Secrets = secrets()
			_, err := e.CreateVolume(req)
			return err
		}, codes.InvalidArgument},
		{"ControllerPublishVolume", func() error {
			_, err := e.ControllerPublish(&csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: "node-a", VolumeCapability: mountCap("ext4", snw), Secrets: secrets()})
			return err
		}, codes.OK},
		{"NodeStageVolume refused", func() error {
			return e.NodeStage(&csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: "relative", VolumeCapability: mountCap("ext4", snw), Secrets: secrets()})
		}, codes.InvalidArgument},
		{"NodeStageVolume failed in the backend", func() error {
			return e.NodeStage(&csi.NodeStageVolumeRequest{VolumeId: "loop/default/pvc-missing", StagingTargetPath: filepath.Join(t.TempDir(), "s"), VolumeCapability: mountCap("ext4", snw), Secrets: secrets()})
		}, codes.NotFound},
		{"NodePublishVolume", func() error {
			return e.NodePublish(&csi.NodePublishVolumeRequest{VolumeId: vol, TargetPath: "/t", StagingTargetPath: "/s", Secrets: secrets()})
		}, codes.InvalidArgument},
		{"DeleteVolume", func() error {
			_, err := call(e, "/csi.v1.Controller/DeleteVolume", e.cs.DeleteVolume, &csi.DeleteVolumeRequest{VolumeId: "loop/default/pvc-secret-2", Secrets: secrets()})
			return err
		}, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantCode(t, tt.call(), tt.code)
			entries := e.logs.TakeAll()
			var rpc *observer.LoggedEntry
			for i, le := range entries {
				text := le.Message + " " + fmt.Sprint(le.ContextMap())
				if strings.Contains(text, secret) {
					t.Fatalf("secret in log line: %s", text)
				}
				if le.Message == "rpc" {
					rpc = &entries[i]
				}
			}
			if rpc == nil {
				t.Fatal("no rpc log line")
			}
			req, _ := rpc.ContextMap()["request"].(string)
			if strings.Count(req, secretMask) != 2 || !strings.Contains(req, "node.session.auth.password") {
				t.Fatalf("request %s: want both secret values replaced by %s, keys kept", req, secretMask)
			}
		})
	}
}

func TestSanitizeDoesNotChangeTheRequest(t *testing.T) {
	t.Parallel()
	req := &csi.NodeStageVolumeRequest{VolumeId: "loop/default/a", Secrets: map[string]string{"k": "v"}}
	orig := proto.Clone(req)
	out := sanitize(req)
	if !proto.Equal(req, orig) {
		t.Fatalf("sanitize changed the request: %v", req)
	}
	if strings.Contains(out, `"v"`) || !strings.Contains(out, secretMask) || !strings.Contains(out, "loop/default/a") {
		t.Fatalf("sanitize = %s", out)
	}
}

func TestInterceptorRecoversPanics(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	resp, err := e.d.interceptor(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: "loop/default/a"},
		&grpc.UnaryServerInfo{FullMethod: "/csi.v1.Node/NodeUnstageVolume"},
		func(context.Context, any) (any, error) { panic("boom: nil map") })
	if resp != nil {
		t.Fatalf("response %v after a panic", resp)
	}
	wantCode(t, err, codes.Internal, "/csi.v1.Node/NodeUnstageVolume", "boom: nil map")

	var panicLine, rpcLine bool
	for _, le := range e.logs.TakeAll() {
		switch le.Message {
		case "panic in RPC handler":
			panicLine = le.Level == zapcore.ErrorLevel && strings.Contains(fmt.Sprint(le.ContextMap()["stack"]), "TestInterceptorRecoversPanics")
		case "rpc":
			f := le.ContextMap()
			rpcLine = le.Level == zapcore.ErrorLevel && f["code"] == "Internal" && f["method"] == "NodeUnstageVolume" && f["volumeID"] == "loop/default/a"
		}
	}
	if !panicLine || !rpcLine {
		t.Fatalf("panic logged with stack: %t; rpc line with code Internal: %t", panicLine, rpcLine)
	}

	// The driver still serves.
	if _, err := e.Probe(); err != nil {
		t.Fatalf("Probe after a panic: %v", err)
	}
}

// The interceptor turns every handler error into a status with the mapped code.
func TestInterceptorMapsErrors(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	for _, tt := range []struct {
		err  error
		code codes.Code
	}{
		{errdefs.Busy("x"), codes.Aborted},
		{fmt.Errorf("wrapped: %w", errdefs.Exhausted("no loop devices")), codes.ResourceExhausted},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{fmt.Errorf("plain"), codes.Internal},
	} {
		_, err := e.d.interceptor(context.Background(), &csi.ProbeRequest{}, &grpc.UnaryServerInfo{FullMethod: "/csi.v1.Identity/Probe"},
			func(context.Context, any) (any, error) { return nil, tt.err })
		wantCode(t, err, tt.code, tt.err.Error())
	}
}

// Every request that carries CSI secrets hands them to the backend in the
// context; requests without secrets carry none.
func TestInterceptorPassesSecretsToTheBackend(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	tests := []struct {
		method string
		req    any
		want   map[string]string
	}{
		{"/csi.v1.Controller/CreateVolume", &csi.CreateVolumeRequest{Name: "a", Secrets: map[string]string{"userKey": "k1"}}, map[string]string{"userKey": "k1"}},
		{"/csi.v1.Controller/ControllerPublishVolume", &csi.ControllerPublishVolumeRequest{VolumeId: "loop/default/a", Secrets: map[string]string{"password": "p"}}, map[string]string{"password": "p"}},
		{"/csi.v1.Node/NodeStageVolume", &csi.NodeStageVolumeRequest{VolumeId: "loop/default/a", Secrets: map[string]string{"node.session.auth.password": "c"}}, map[string]string{"node.session.auth.password": "c"}},
		{"/csi.v1.Controller/DeleteVolume", &csi.DeleteVolumeRequest{VolumeId: "loop/default/a"}, nil},
		{"/csi.v1.Node/NodeUnstageVolume", &csi.NodeUnstageVolumeRequest{VolumeId: "loop/default/a"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			var got backend.Secrets
			_, err := e.d.interceptor(context.Background(), tt.req, &grpc.UnaryServerInfo{FullMethod: tt.method},
				func(ctx context.Context, _ any) (any, error) {
					got = backend.SecretsFrom(ctx)
					return nil, nil
				})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("backend saw %d secrets, want %d", len(got), len(tt.want))
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("secret %q did not reach the backend", k)
				}
			}
		})
	}
}
