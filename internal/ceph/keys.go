package ceph

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strings"
)

// The ciphers of cephx keys, by the type number a key begins with
// (CryptoKey::encode: a little-endian 16-bit type, the creation time, the
// secret's length and the secret).
const (
	CipherAES     = "aes"     // type 1: every release's keys before Tentacle
	CipherAES256K = "aes256k" // type 2: Tentacle's default (CVE-2025-30156)
)

// KeyCipher says which cipher a cephx key (base64, as keyrings and CSI
// secrets hold it) is of. A key that is not base64 or too short to name
// one is an error; a type this package does not know is named by number.
func KeyCipher(key string) (string, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(key))
	if err != nil || len(b) < 2 {
		return "", fmt.Errorf("not a cephx key (base64 of a typed secret)")
	}
	switch t := binary.LittleEndian.Uint16(b); t {
	case 1:
		return CipherAES, nil
	case 2:
		return CipherAES256K, nil
	default:
		return fmt.Sprintf("type %d", t), nil
	}
}
