package driver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

func TestCodeOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"invalid argument", errdefs.InvalidArgument("x"), codes.InvalidArgument},
		{"not found", errdefs.NotFound("x"), codes.NotFound},
		{"already exists", errdefs.AlreadyExists("x"), codes.AlreadyExists},
		{"out of range", errdefs.OutOfRange("x"), codes.OutOfRange},
		{"exhausted", errdefs.Exhausted("x"), codes.ResourceExhausted},
		{"precondition", errdefs.Precondition("x"), codes.FailedPrecondition},
		{"busy", errdefs.Busy("x"), codes.Aborted},
		{"unavailable", errdefs.Unavailable("x"), codes.Unavailable},
		{"deadline", context.DeadlineExceeded, codes.DeadlineExceeded},
		{"canceled", context.Canceled, codes.Canceled},
		{"wrapped deadline", fmt.Errorf("mkfs.ext4 /dev/loop3: %w after 2m0s", context.DeadlineExceeded), codes.DeadlineExceeded},
		{"wrapped canceled", fmt.Errorf("losetup: %w", context.Canceled), codes.Canceled},
		{"kind wrapped by fmt", fmt.Errorf("volume x: %w", errdefs.NotFound("image")), codes.NotFound},
		{"outermost kind wins", errdefs.Wrap(errdefs.ErrPrecondition, errdefs.NotFound("device"), "cannot detach"), codes.FailedPrecondition},
		{"outermost kind wins through fmt", fmt.Errorf("stage: %w", errdefs.Wrap(errdefs.ErrExhausted, errdefs.InvalidArgument("inner"), "outer")), codes.ResourceExhausted},
		{"kind wins over a context error", errdefs.Wrap(errdefs.ErrBusy, context.DeadlineExceeded, "pool locked"), codes.Aborted},
		{"kind in a join", errors.Join(errors.New("first"), errdefs.Precondition("second")), codes.FailedPrecondition},
		{"plain error", errors.New("boom"), codes.Internal},
		{"fs error", &fs.PathError{Op: "open", Path: "/x", Err: fs.ErrNotExist}, codes.Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := codeOf(tt.err); got != tt.want {
				t.Fatalf("codeOf(%v) = %s, want %s", tt.err, got, tt.want)
			}
		})
	}
}

func TestToStatus(t *testing.T) {
	t.Parallel()
	if err := toStatus(nil); err != nil {
		t.Fatalf("toStatus(nil) = %v", err)
	}

	t.Run("kind error", func(t *testing.T) {
		err := toStatus(fmt.Errorf("volume loop/default/a: %w", errdefs.NotFound("image a does not exist")))
		st, ok := status.FromError(err)
		if !ok || st.Code() != codes.NotFound {
			t.Fatalf("toStatus = %v, want NotFound", err)
		}
		if want := "volume loop/default/a: image a does not exist"; st.Message() != want {
			t.Fatalf("message %q, want %q", st.Message(), want)
		}
	})

	t.Run("existing status passes through", func(t *testing.T) {
		in := status.Error(codes.Unauthenticated, "no token")
		if out := toStatus(in); out != in {
			t.Fatalf("toStatus changed a status: %v", out)
		}
	})

	t.Run("wrapped status keeps its code", func(t *testing.T) {
		out := toStatus(fmt.Errorf("calling the target: %w", status.Error(codes.Unavailable, "connection refused")))
		if st, _ := status.FromError(out); st.Code() != codes.Unavailable {
			t.Fatalf("code = %s, want Unavailable", st.Code())
		}
	})

	t.Run("outer kind wins over an inner status", func(t *testing.T) {
		inner := status.Error(codes.NotFound, "no such image")
		out := toStatus(errdefs.Wrap(errdefs.ErrPrecondition, inner, "volume is published elsewhere"))
		st, _ := status.FromError(out)
		if st.Code() != codes.FailedPrecondition {
			t.Fatalf("code = %s, want FailedPrecondition (the outermost kind)", st.Code())
		}
		if want := "volume is published elsewhere: rpc error: code = NotFound desc = no such image"; st.Message() != want {
			t.Fatalf("message %q, want %q", st.Message(), want)
		}
	})

	t.Run("plain error is internal", func(t *testing.T) {
		st, _ := status.FromError(toStatus(errors.New("boom")))
		if st.Code() != codes.Internal || st.Message() != "boom" {
			t.Fatalf("status = %v, want Internal boom", st)
		}
	})
}
