package backend

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func TestSecretsNeverPrintValues(t *testing.T) {
	s := Secrets{"password": "hunter2", "userid": "admin-key-AQD"}
	outputs := map[string]string{
		"%v":  fmt.Sprintf("%v", s),
		"%s":  fmt.Sprintf("%s", s),
		"%+v": fmt.Sprintf("%+v", s),
		"%#v": fmt.Sprintf("%#v", s),
	}
	js, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	outputs["json"] = string(js)
	for verb, out := range outputs {
		if strings.Contains(out, "hunter2") || strings.Contains(out, "admin-key-AQD") {
			t.Errorf("%s printed a secret value: %s", verb, out)
		}
		if !strings.Contains(out, "password") || !strings.Contains(out, "userid") {
			t.Errorf("%s should still name the keys: %s", verb, out)
		}
	}
	if got, want := string(js), `{"password":"REDACTED","userid":"REDACTED"}`; got != want {
		t.Errorf("json = %s, want %s", got, want)
	}
}

func TestSecretsTravelInContext(t *testing.T) {
	ctx := context.Background()
	if got := SecretsFrom(ctx); got != nil {
		t.Fatalf("no secrets expected, got %v", got)
	}
	if WithSecrets(ctx, nil) != ctx {
		t.Error("empty secrets should leave the context as it is")
	}
	in := map[string]string{"node.session.auth.password": "x"}
	got := SecretsFrom(WithSecrets(ctx, in))
	if got["node.session.auth.password"] != "x" {
		t.Fatalf("secrets lost: %v", got)
	}
	in["node.session.auth.password"] = "changed"
	if got["node.session.auth.password"] != "x" {
		t.Error("the context must hold a copy, not the caller's map")
	}
}
