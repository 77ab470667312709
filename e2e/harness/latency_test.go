package harness

import (
	"errors"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The recorder reads the driver's own "rpc" entries: successful calls at
// any level the driver logs them, nothing else.
func TestLatencyCoreRecordsSuccessfulRPCs(t *testing.T) {
	rec := &rpcLatencies{}
	log := zap.New(zapcore.NewTee(zapcore.NewNopCore(), &latencyCore{LevelEnabler: zapcore.InfoLevel, rec: rec}))
	rpc := func(level zapcore.Level, method, code string, d time.Duration) {
		log.With(zap.String("method", method)).Check(level, "rpc").Write(zap.Duration("duration", d), zap.String("code", code))
	}
	rpc(zapcore.InfoLevel, "NodeStageVolume", "OK", 3*time.Second)
	rpc(zapcore.InfoLevel, "NodeStageVolume", "OK", 1*time.Second)
	rpc(zapcore.InfoLevel, "NodeStageVolume", "OK", 2*time.Second)
	rpc(zapcore.InfoLevel, "NodeStageVolume", "OK", 4*time.Second)
	rpc(zapcore.WarnLevel, "NodeStageVolume", "InvalidArgument", time.Millisecond)
	rpc(zapcore.DebugLevel, "Probe", "OK", time.Millisecond) // below Info: the driver's quiet methods
	rpc(zapcore.InfoLevel, "NodeUnstageVolume", "OK", 1500*time.Microsecond)
	log.Error("rpc failed elsewhere", zap.Error(errors.New("x")), zap.String("method", "CreateVolume"), zap.String("code", "OK"))

	got := rec.Lines()
	want := []string{
		"rpc NodeStageVolume: n=4 p50=2s max=4s",
		"rpc NodeUnstageVolume: n=1 p50=1.5ms max=1.5ms",
	}
	if !slices.Equal(got, want) {
		t.Errorf("lines:\n got %q\nwant %q", got, want)
	}
}
