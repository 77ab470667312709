package errdefs

import (
	"errors"
	"fmt"
	"testing"
)

func TestKindOfTakesOutermost(t *testing.T) {
	inner := NotFound("image %q", "a")
	outer := Wrap(ErrPrecondition, inner, "cannot stage")
	wrapped := fmt.Errorf("stage: %w", outer)

	if got := KindOf(wrapped); got != ErrPrecondition {
		t.Fatalf("KindOf = %v, want %v", got, ErrPrecondition)
	}
	if !errors.Is(wrapped, ErrNotFound) || !errors.Is(wrapped, ErrPrecondition) {
		t.Fatal("errors.Is must see both kinds in the chain")
	}
	if got, want := wrapped.Error(), `stage: cannot stage: image "a"`; got != want {
		t.Fatalf("message = %q, want %q", got, want)
	}
	if KindOf(errors.New("plain")) != nil {
		t.Fatal("a plain error has no kind")
	}
}

// An error built the ordinary Go way around a sentinel has that kind too.
func TestKindOfPlainWrappedSentinel(t *testing.T) {
	err := fmt.Errorf("look up image: %w", ErrNotFound)
	if KindOf(err) != ErrNotFound {
		t.Fatalf("KindOf(%v) = %v, want ErrNotFound", err, KindOf(err))
	}
	if KindOf(errors.New("plain")) != nil {
		t.Fatal("a plain error has no kind")
	}
}
