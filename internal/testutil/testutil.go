// Package testutil holds the few helpers Spindle's tests share across
// packages: skipping, with the reason, when the machine lacks what a test
// needs, and checking the kind and message of an error.
package testutil

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// RequireRoot skips t unless it runs as root; why says what needs root.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root to %s (run `sudo make test`)", why)
	}
}

// RequireCommands skips t, naming what is missing, unless every program is
// on PATH. hack/install-deps.sh installs them all.
func RequireCommands(t testing.TB, names ...string) {
	t.Helper()
	var missing []string
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		t.Skipf("missing %s: run hack/install-deps.sh", strings.Join(missing, ", "))
	}
}

// WantKind fails t unless err is of kind (an errdefs sentinel), as the
// outermost kind, and its message mentions every string in mentions.
func WantKind(t testing.TB, err, kind error, mentions ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got success, want a %q error", kind)
	}
	if errdefs.KindOf(err) != kind || !errors.Is(err, kind) {
		t.Fatalf("error = %v (kind %v), want kind %q", err, errdefs.KindOf(err), kind)
	}
	for _, m := range mentions {
		if !strings.Contains(err.Error(), m) {
			t.Fatalf("error %q does not name %q", err, m)
		}
	}
}
