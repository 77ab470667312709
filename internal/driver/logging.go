package driver

import (
	"context"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/spindle-csi/spindle/internal/backend"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// quietMethods are polled by kubelet and the sidecars; they log at debug level.
var quietMethods = map[string]bool{
	"Probe": true, "GetPluginInfo": true, "GetPluginCapabilities": true,
	"ControllerGetCapabilities": true, "NodeGetCapabilities": true, "NodeGetInfo": true,
	"NodeGetVolumeStats": true,
}

// interceptors wrap every RPC, outermost first: observe logs one line per
// RPC (method, volume ID, duration, code and the request with secrets
// stripped) and records its metrics; recoverPanic turns a panic into
// INTERNAL instead of a dead plugin; errorsToStatus maps handler errors to
// gRPC codes (errors.go); withSecrets hands the request's secrets to the
// backends in the context.
// checkDecoded and checkBounds refuse, before anything else looks at it, a
// request that could not be decoded or that carries more than Spindle
// accepts (bounds.go).
func (d *Driver) interceptors() []grpc.UnaryServerInterceptor {
	return []grpc.UnaryServerInterceptor{d.observe, d.recoverPanic, errorsToStatus, d.codec.checkDecoded, checkBounds, withSecrets}
}

func (d *Driver) observe(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	elapsed := time.Since(start)
	d.logRPC(info.FullMethod, req, resp, elapsed, err)
	d.observeRPC(info.FullMethod, elapsed, err)
	return resp, err
}

func (d *Driver) recoverPanic(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			d.log.Error("panic in RPC handler", zap.String("method", info.FullMethod), zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
			resp, err = nil, status.Errorf(codes.Internal, "internal error in %s: %v", info.FullMethod, r)
		}
	}()
	return handler(ctx, req)
}

func errorsToStatus(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	return resp, toStatus(err)
}

// withSecrets: secrets reach the backend in the context
// (backend.SecretsFrom), the same way for every RPC that carries them.
func withSecrets(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if r, ok := req.(interface{ GetSecrets() map[string]string }); ok {
		ctx = backend.WithSecrets(ctx, r.GetSecrets())
	}
	return handler(ctx, req)
}

// observeRPC records the RPC's latency by method and code, and a failed
// one's reason. err is the status the caller gets.
func (d *Driver) observeRPC(fullMethod string, elapsed time.Duration, err error) {
	method := fullMethod[strings.LastIndex(fullMethod, "/")+1:]
	code := status.Code(err)
	reason := ""
	if err != nil {
		reason = reasonOf(code)
	}
	d.metrics.ObserveRPC(method, code.String(), reason, elapsed)
}

func (d *Driver) logRPC(fullMethod string, req, resp any, elapsed time.Duration, err error) {
	method := fullMethod[strings.LastIndex(fullMethod, "/")+1:]
	code := status.Code(err)
	level := zapcore.InfoLevel
	switch {
	case code == codes.Internal || code == codes.Unknown || code == codes.DataLoss:
		level = zapcore.ErrorLevel
	case err != nil:
		level = zapcore.WarnLevel
	case quietMethods[method]:
		level = zapcore.DebugLevel
	}
	ce := d.log.Check(level, "rpc")
	if ce == nil {
		return
	}
	fields := []zap.Field{
		zap.String("method", method),
		zap.Duration("duration", elapsed),
		zap.String("code", code.String()),
	}
	if v, ok := req.(interface{ GetVolumeId() string }); ok && v.GetVolumeId() != "" {
		fields = append(fields, zap.String("volumeID", clip(v.GetVolumeId(), maxLoggedValue)))
	}
	if r, ok := req.(*csi.CreateVolumeRequest); ok {
		// The volume ID of a CreateVolume is in its answer; the name ties
		// a refused one to its PVC.
		fields = append(fields, zap.String("name", clip(r.GetName(), maxLoggedValue)))
		if v, ok := resp.(*csi.CreateVolumeResponse); ok && v.GetVolume().GetVolumeId() != "" {
			fields = append(fields, zap.String("volumeID", v.GetVolume().GetVolumeId()))
		}
	}
	if v, ok := req.(interface{ GetNodeId() string }); ok && v.GetNodeId() != "" {
		fields = append(fields, zap.String("nodeID", clip(v.GetNodeId(), maxLoggedValue)))
	}
	if m, ok := req.(proto.Message); ok {
		fields = append(fields, zap.String("request", sanitize(m)))
	}
	if err != nil {
		fields = append(fields, zap.String("error", clip(status.Convert(err).Message(), maxLoggedError)))
	}
	ce.Write(fields...)
}

// secretMask replaces every value of a field marked csi_secret.
const secretMask = "***stripped***"

// What a log line carries of a request: each value clipped, and the whole
// request rendering at most maxLoggedRequest bytes, so that a request that
// is refused for its size costs a line of ordinary length.
const (
	maxLoggedValue   = 256
	maxLoggedError   = 2048
	maxLoggedRequest = 8192
)

// clip shortens s to at most n bytes (on a rune boundary), saying how long
// it was.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "...(" + strconv.Itoa(len(s)) + " bytes)"
}

// sanitize renders a request as JSON with every field that the CSI spec
// marks csi_secret masked, at any depth, and every string clipped.
func sanitize(m proto.Message) string {
	c := proto.Clone(m)
	stripSecrets(c.ProtoReflect())
	clipStrings(c.ProtoReflect(), 0)
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(c)
	if err != nil {
		return fmt.Sprintf("<unprintable request: %v>", err)
	}
	return clip(string(b), maxLoggedRequest)
}

// clipStrings clips every string of m (map values and list items too) to
// maxLoggedValue bytes, and drops the map entries and list items past
// maxLoggedEntries.
func clipStrings(m protoreflect.Message, depth int) {
	const maxLoggedEntries = 32
	if depth > maxDepth {
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			n := 0
			var drop []protoreflect.MapKey
			mp.Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				n++
				switch {
				case n > maxLoggedEntries || len(k.String()) > maxLoggedValue:
					drop = append(drop, k)
				case fd.MapValue().Kind() == protoreflect.StringKind:
					mp.Set(k, protoreflect.ValueOfString(clip(mv.String(), maxLoggedValue)))
				case fd.MapValue().Kind() == protoreflect.MessageKind:
					clipStrings(mv.Message(), depth+1)
				}
				return true
			})
			for _, k := range drop {
				mp.Clear(k)
			}
		case fd.IsList():
			list := m.Mutable(fd).List()
			if list.Len() > maxLoggedEntries {
				list.Truncate(maxLoggedEntries)
			}
			for i := 0; i < list.Len(); i++ {
				switch fd.Kind() {
				case protoreflect.StringKind:
					list.Set(i, protoreflect.ValueOfString(clip(list.Get(i).String(), maxLoggedValue)))
				case protoreflect.MessageKind:
					clipStrings(list.Get(i).Message(), depth+1)
				}
			}
		case fd.Kind() == protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString(clip(v.String(), maxLoggedValue)))
		case fd.Kind() == protoreflect.BytesKind && len(v.Bytes()) > maxLoggedValue:
			m.Set(fd, protoreflect.ValueOfBytes(v.Bytes()[:maxLoggedValue]))
		case fd.Kind() == protoreflect.MessageKind:
			clipStrings(v.Message(), depth+1)
		}
		return true
	})
}

func stripSecrets(m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if isSecret(fd) {
			switch {
			case fd.IsMap():
				mp := m.Mutable(fd).Map()
				mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
					mp.Set(k, protoreflect.ValueOfString(secretMask))
					return true
				})
			case fd.Kind() == protoreflect.StringKind && !fd.IsList():
				m.Set(fd, protoreflect.ValueOfString(secretMask))
			default:
				m.Clear(fd)
			}
			return true
		}
		switch {
		case fd.IsMap():
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					stripSecrets(mv.Message())
					return true
				})
			}
		case fd.IsList():
			if fd.Kind() == protoreflect.MessageKind {
				for i := 0; i < v.List().Len(); i++ {
					stripSecrets(v.List().Get(i).Message())
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			stripSecrets(v.Message())
		}
		return true
	})
}

func isSecret(fd protoreflect.FieldDescriptor) bool {
	opts := fd.Options()
	if opts == nil {
		return false
	}
	secret, ok := proto.GetExtension(opts, csi.E_CsiSecret).(bool)
	return ok && secret
}
