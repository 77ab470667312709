package ceph

import "testing"

func TestKeyCipher(t *testing.T) {
	for _, tc := range []struct {
		name, key, want string
		wantErr         bool
	}{
		// ceph-authtool --gen-print-key of Ceph 20.2.4 (Debian sid).
		{name: "Tentacle's default", key: "AgD6+gtrjaxUACAAy3CPtLFs3JLKE+5pqd2fx7SndvqcafFOLya+dNc97LE=", want: CipherAES256K},
		// ceph-authtool --gen-print-key --key-type aes of the same: the
		// cipher of every key made before Tentacle.
		{name: "an older release's", key: "AQCK+wtrx3djDRAAvFH2jtQvuI0Yl5FO9Wt1tg==", want: CipherAES},
		{name: "surrounding space", key: " AQCK+wtrx3djDRAAvFH2jtQvuI0Yl5FO9Wt1tg==\n", want: CipherAES},
		{name: "an unknown type", key: "CQA=", want: "type 9"},
		{name: "not base64", key: "not a key!", wantErr: true},
		{name: "too short", key: "AQ==", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := KeyCipher(tc.key)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("KeyCipher(%q) = %q, %v; want %q (error: %v)", tc.key, got, err, tc.want, tc.wantErr)
			}
		})
	}
}
