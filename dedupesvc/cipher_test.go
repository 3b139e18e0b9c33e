package dedupesvc_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc"
)

func key(id string, b byte) dedupesvc.OutcomeKey {
	return dedupesvc.OutcomeKey{ID: id, Key: bytes.Repeat([]byte{b}, 32)}
}

func TestOutcomeCipherSealOpen(t *testing.T) {
	t.Parallel()
	c, err := dedupesvc.NewOutcomeCipher([]dedupesvc.OutcomeKey{key("k1", 1)})
	if err != nil {
		t.Fatal(err)
	}
	aad, value := []byte("record A"), []byte("ch_123 cus_456")
	id, sealed, err := c.Seal(aad, value)
	if err != nil || id != "k1" {
		t.Fatalf("Seal = %q, %v; want k1", id, err)
	}
	if bytes.Contains(sealed, value) {
		t.Fatal("sealed outcome holds the plaintext")
	}
	got, err := c.Open(id, aad, sealed)
	if err != nil || !bytes.Equal(got, value) {
		t.Fatalf("Open = %q, %v; want %q", got, err, value)
	}
	// A retried Resolve must store the same bytes as the first try, so the
	// store can tell the retry from a conflicting resolution.
	if _, again, _ := c.Seal(aad, value); !bytes.Equal(again, sealed) {
		t.Fatal("sealing the same outcome of the same record twice gave different bytes")
	}
	if _, other, _ := c.Seal([]byte("record B"), value); bytes.Equal(other, sealed) {
		t.Fatal("the same outcome of two records sealed alike")
	}
	if _, err := c.Open(id, []byte("record B"), sealed); err == nil {
		t.Fatal("Open with another record's additional data succeeded")
	}
	tampered := bytes.Clone(sealed)
	tampered[len(tampered)-1] ^= 1
	if _, err := c.Open(id, aad, tampered); err == nil {
		t.Fatal("Open of a tampered outcome succeeded")
	}
	if _, err := c.Open("k9", aad, sealed); err == nil {
		t.Fatal("Open with an unknown key id succeeded")
	}
	if _, empty, _ := c.Seal(aad, []byte{}); empty == nil {
		t.Fatal("an empty outcome sealed to nil")
	}
}

func TestOutcomeCipherRotation(t *testing.T) {
	t.Parallel()
	old, _ := dedupesvc.NewOutcomeCipher([]dedupesvc.OutcomeKey{key("k1", 1)})
	_, sealed, _ := old.Seal([]byte("a"), []byte("v"))
	rotated, err := dedupesvc.NewOutcomeCipher([]dedupesvc.OutcomeKey{key("k1", 1), key("k2", 2)})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := rotated.Open("k1", []byte("a"), sealed); err != nil || string(got) != "v" {
		t.Fatalf("Open of a k1 outcome after rotation = %q, %v", got, err)
	}
	if id, _, _ := rotated.Seal([]byte("a"), []byte("v")); id != "k2" {
		t.Fatalf("new outcomes sealed with %q; want the last key k2", id)
	}
}

func TestNewOutcomeCipherRefuses(t *testing.T) {
	t.Parallel()
	for name, keys := range map[string][]dedupesvc.OutcomeKey{
		"no key":       nil,
		"short key":    {{ID: "k1", Key: make([]byte, 16)}},
		"duplicate id": {key("k1", 1), key("k1", 2)},
		"empty id":     {key("", 1)},
	} {
		if _, err := dedupesvc.NewOutcomeCipher(keys); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestReadOutcomeKeys(t *testing.T) {
	t.Parallel()
	k32 := "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=" // 32 bytes of 1
	keys, err := dedupesvc.ReadOutcomeKeys(strings.NewReader("# comment\n\nk1 " + k32 + "\nk2 " + k32 + "\n"))
	if err != nil || len(keys) != 2 || keys[1].ID != "k2" || len(keys[0].Key) != 32 {
		t.Fatalf("ReadOutcomeKeys = %+v, %v", keys, err)
	}
	for name, tc := range map[string]struct{ file, want string }{
		"one field":  {"k1\n", "line 1"},
		"bad base64": {"k1 " + k32 + "\nk2 !!!\n", "line 2"},
		"16 bytes":   {"k1 AQEBAQEBAQEBAQEBAQEBAQ==\n", "line 1: key is 16 bytes, want 32"},
		"duplicate":  {"k1 " + k32 + "\n#\nk1 " + k32 + "\n", "line 3: key id \"k1\" is already on line 1"},
		"empty":      {"# nothing\n", "no key"},
	} {
		_, err := dedupesvc.ReadOutcomeKeys(strings.NewReader(tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error with %q", name, err, tc.want)
		}
	}
}
