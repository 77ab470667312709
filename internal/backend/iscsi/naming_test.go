package iscsi

import (
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/testutil"
)

func TestTargetIQN(t *testing.T) {
	tests := []struct{ image, want string }{
		{"pvc-6f1c0a", "iqn.2026-01.dev.spindle:san.pvc-6f1c0a"},
		// An underscore is no IQN character: hashed, deterministically.
		{"my_volume", "iqn.2026-01.dev.spindle:san.h-"},
		{strings.Repeat("a", 250), "iqn.2026-01.dev.spindle:san.h-"},
	}
	for _, tt := range tests {
		got := TargetIQN("iqn.2026-01.dev.spindle", "san", tt.image)
		if !strings.HasPrefix(got, tt.want) || len(got) > maxIQN || !iqnSafeRe.MatchString(strings.SplitN(got, ":", 2)[1]) {
			t.Errorf("TargetIQN(%q) = %q, want prefix %q, at most %d characters, IQN characters only", tt.image, got, tt.want, maxIQN)
		}
		if again := TargetIQN("iqn.2026-01.dev.spindle", "san", tt.image); again != got {
			t.Errorf("TargetIQN(%q) is not deterministic: %q, then %q", tt.image, got, again)
		}
	}
	if TargetIQN("iqn.2026-01.x", "a", "my_volume") == TargetIQN("iqn.2026-01.x", "a", "my_volumf") {
		t.Error("two images share a target")
	}
	if TargetIQN("iqn.2026-01.x", "a", "pvc-1") == TargetIQN("iqn.2026-01.x", "b", "pvc-1") {
		t.Error("two instances share a target")
	}
}

func TestInitiatorIQN(t *testing.T) {
	got, err := InitiatorIQN("iqn.2026-01.dev.spindle.node", "worker-1.example.com")
	if err != nil || got != "iqn.2026-01.dev.spindle.node:worker-1.example.com" {
		t.Fatalf("InitiatorIQN = %q, %v", got, err)
	}
	for _, bad := range []string{"", "Worker-1", "node a", "node_a", "-node", strings.Repeat("n", 220)} {
		_, err := InitiatorIQN("iqn.2026-01.dev.spindle.node", bad)
		testutil.WantKind(t, err, errdefs.ErrInvalidArgument, "node ID")
	}
}

func TestSerialFitsTgtAndDiffers(t *testing.T) {
	a, b := Serial("san", "pvc-1"), Serial("san", "pvc-2")
	if len(a) > 36 || a == b || a != Serial("san", "pvc-1") || Serial("other", "pvc-1") == a {
		t.Fatalf("serials %q, %q: want at most 36 characters, distinct per instance and image, deterministic", a, b)
	}
}

func TestCHAPFrom(t *testing.T) {
	tests := []struct {
		name    string
		secrets map[string]string
		want    *CHAP
		errWith string
	}{
		{"none", nil, nil, ""},
		{"unrelated keys only", map[string]string{"other": "x"}, nil, ""},
		{"one way", map[string]string{SecretUser: "u", SecretPassword: "p"}, &CHAP{User: "u", Password: "p"}, ""},
		{"mutual", map[string]string{SecretUser: "u", SecretPassword: "p", SecretMutualUser: "m", SecretMutualPassword: "q"},
			&CHAP{User: "u", Password: "p", MutualUser: "m", MutualPassword: "q"}, ""},
		{"user without password", map[string]string{SecretUser: "u"}, nil, SecretPassword},
		{"mutual password without user", map[string]string{SecretUser: "u", SecretPassword: "p", SecretMutualPassword: "q"}, nil, SecretMutualUser},
		{"mutual without one-way", map[string]string{SecretMutualUser: "m", SecretMutualPassword: "q"}, nil, SecretUser},
		{"blank in user", map[string]string{SecretUser: "u v", SecretPassword: "p"}, nil, "user name"},
		{"newline in password", map[string]string{SecretUser: "u", SecretPassword: "p\nq"}, nil, "password"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := chapFrom(backend.Secrets(tt.secrets))
			if tt.errWith != "" {
				testutil.WantKind(t, err, errdefs.ErrInvalidArgument, tt.errWith)
				for _, v := range tt.secrets {
					if len(v) > 1 && strings.Contains(err.Error(), v) {
						t.Fatalf("the error shows a secret value: %v", err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
				t.Fatalf("chapFrom = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestMutableParameters(t *testing.T) {
	if err := validateMutable(map[string]string{MutableParamDirectIO: "true"}); err != nil {
		t.Fatal(err)
	}
	testutil.WantKind(t, validateMutable(map[string]string{MutableParamDirectIO: "yes"}), errdefs.ErrInvalidArgument, "yes")
	testutil.WantKind(t, validateMutable(map[string]string{"cache": "on"}), errdefs.ErrInvalidArgument, "cache", MutableParamDirectIO)
}

func TestNewRejectsBadConfig(t *testing.T) {
	_, err := New("x", Config{PoolDir: "rel", TargetPrefix: "iqn.2026-01.a"}, nil)
	testutil.WantKind(t, err, errdefs.ErrInvalidArgument, "poolDir", "portals", "initiatorPrefix")
}
