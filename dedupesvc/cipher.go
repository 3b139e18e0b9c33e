package dedupesvc

import (
	"bufio"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
)

// OutcomeKeyBytes is the length of an outcome key-encryption key: AES-256.
const OutcomeKeyBytes = 32

// MaxOutcomeKeyIDBytes is the longest outcome key id accepted; the id is
// stored with every sealed record.
const MaxOutcomeKeyIDBytes = 64

// OutcomeKey is one key-encryption key of an OutcomeCipher.
type OutcomeKey struct {
	// ID names the key; it is stored with each outcome the key sealed
	// (outcome_key_id), so it must never be reused for another key.
	// Printable ASCII without spaces, at most MaxOutcomeKeyIDBytes.
	ID string
	// Key is the key itself, OutcomeKeyBytes long.
	Key []byte
}

// OutcomeCipher seals stored outcomes with envelope encryption: each
// outcome's value is encrypted with AES-256-GCM under its own data key, and
// the data key is wrapped with AES-256-GCM under the active key-encryption
// key (the last of its keys). The other keys only open what they sealed
// before, so rotating is adding a key. Both layers take the record's
// identity as additional data (see Seal), so a sealed value copied to
// another record does not open. Safe for concurrent use; SetKeys swaps the
// keys while it is in use.
//
// The data key and nonces are derived from the active key, the additional
// data and the value (a synthetic-IV construction, HMAC-SHA256) instead of
// drawn at random: a retried Resolve of one record with one outcome must
// store the same bytes, or the store would take the retry for a conflicting
// resolution. Two records never share a data key (their additional data
// differ); one record sealing the same value twice shows that it did so,
// which its row says anyway.
type OutcomeCipher struct {
	ring atomic.Pointer[keyRing]
}

type keyRing struct {
	active string
	keys   map[string]*kek
}

// kek is one key-encryption key, ready to use.
type kek struct {
	wrap cipher.AEAD
	// derive keys the HMAC that derives data keys and nonces; it is derived
	// from the key, so wrapping and deriving never use one key for two jobs.
	derive []byte
}

// sealedVersion is the first byte of a sealed value: its layout, so another
// one can follow.
const sealedVersion = 1

// Layout of a sealed value: version, wrap nonce, wrapped data key (key and
// GCM tag), value nonce, then the value's ciphertext and tag.
const (
	nonceBytes      = 12
	tagBytes        = 16
	wrappedKeyBytes = OutcomeKeyBytes + tagBytes
	sealedOverhead  = 1 + nonceBytes + wrappedKeyBytes + nonceBytes + tagBytes
)

// SealedOverhead is how many bytes sealing adds to an outcome's value.
const SealedOverhead = sealedOverhead

// NewOutcomeCipher returns a cipher over keys, the last of which seals new
// outcomes. It refuses no keys, an empty, overlong or repeated id, and a
// key not OutcomeKeyBytes long.
func NewOutcomeCipher(keys []OutcomeKey) (*OutcomeCipher, error) {
	c := &OutcomeCipher{}
	if err := c.SetKeys(keys); err != nil {
		return nil, err
	}
	return c, nil
}

// SetKeys replaces the cipher's keys, with NewOutcomeCipher's checks; on an
// error the keys in force stay.
func (c *OutcomeCipher) SetKeys(keys []OutcomeKey) error {
	if len(keys) == 0 {
		return errors.New("dedupesvc: no outcome key")
	}
	ring := &keyRing{keys: make(map[string]*kek, len(keys))}
	for _, k := range keys {
		if err := checkKeyID(k.ID); err != nil {
			return fmt.Errorf("dedupesvc: outcome key id %q %w", k.ID, err)
		}
		if _, dup := ring.keys[k.ID]; dup {
			return fmt.Errorf("dedupesvc: outcome key id %q appears twice", k.ID)
		}
		if len(k.Key) != OutcomeKeyBytes {
			return fmt.Errorf("dedupesvc: outcome key %q is %d bytes, want %d", k.ID, len(k.Key), OutcomeKeyBytes)
		}
		wrap, err := gcm(k.Key)
		if err != nil {
			return err
		}
		ring.keys[k.ID] = &kek{wrap: wrap, derive: mac(k.Key, []byte("idemgate outcome derivation key v1"))}
		ring.active = k.ID
	}
	c.ring.Store(ring)
	return nil
}

func checkKeyID(id string) error {
	switch {
	case id == "":
		return errors.New("is empty")
	case len(id) > MaxOutcomeKeyIDBytes:
		return fmt.Errorf("is longer than %d bytes", MaxOutcomeKeyIDBytes)
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return errors.New("must be printable ASCII without spaces")
		}
	}
	return nil
}

// ActiveKeyID returns the id of the key that seals new outcomes.
func (c *OutcomeCipher) ActiveKeyID() string { return c.ring.Load().active }

// Seal encrypts value under the active key, bound to aad (the record's
// identity), and returns the key's id, to store with the record, and the
// sealed value, SealedOverhead bytes longer than value.
func (c *OutcomeCipher) Seal(aad, value []byte) (keyID string, sealed []byte, err error) {
	ring := c.ring.Load()
	k := ring.keys[ring.active]
	// The data key is a PRF of the record and the value: unique per record
	// and value, so its single value nonce never repeats under it.
	dataKey := mac(k.derive, []byte{1}, lengthPrefixed(aad), value)
	wrapNonce := mac(k.derive, []byte{2}, dataKey)[:nonceBytes]
	valueNonce := mac(k.derive, []byte{3}, dataKey)[:nonceBytes]
	inner, err := gcm(dataKey)
	if err != nil {
		return "", nil, err
	}
	sealed = make([]byte, 0, sealedOverhead+len(value))
	sealed = append(sealed, sealedVersion)
	sealed = append(sealed, wrapNonce...)
	sealed = k.wrap.Seal(sealed, wrapNonce, dataKey, wrapAAD(ring.active, aad))
	sealed = append(sealed, valueNonce...)
	sealed = inner.Seal(sealed, valueNonce, value, aad)
	return ring.active, sealed, nil
}

// Open decrypts a value Seal returned with keyID for the same aad. It fails
// for a key id the cipher does not hold, a value sealed for another aad, and
// a damaged value.
func (c *OutcomeCipher) Open(keyID string, aad, sealed []byte) ([]byte, error) {
	k, ok := c.ring.Load().keys[keyID]
	if !ok {
		return nil, fmt.Errorf("dedupesvc: outcome key %q is not in the keys file", keyID)
	}
	if len(sealed) < sealedOverhead || sealed[0] != sealedVersion {
		return nil, errors.New("dedupesvc: sealed outcome is malformed")
	}
	rest := sealed[1:]
	wrapNonce, rest := rest[:nonceBytes], rest[nonceBytes:]
	wrapped, rest := rest[:wrappedKeyBytes], rest[wrappedKeyBytes:]
	valueNonce, ciphertext := rest[:nonceBytes], rest[nonceBytes:]
	dataKey, err := k.wrap.Open(nil, wrapNonce, wrapped, wrapAAD(keyID, aad))
	if err != nil {
		return nil, fmt.Errorf("dedupesvc: outcome data key does not open under key %q (another record's, or damaged)", keyID)
	}
	inner, err := gcm(dataKey)
	if err != nil {
		return nil, err
	}
	value, err := inner.Open(make([]byte, 0, len(ciphertext)-tagBytes), valueNonce, ciphertext, aad)
	if err != nil {
		return nil, errors.New("dedupesvc: outcome does not open (another record's, or damaged)")
	}
	return value, nil
}

// OutcomeAAD is the additional data an outcome is sealed with: the record's
// namespace, scope and key and the outcome's type URL, each length-prefixed
// so no two records share it.
func OutcomeAAD(id RecordID, typeURL string) []byte {
	b := []byte("idemgate outcome v1")
	for _, s := range []string{id.Namespace, id.Scope, id.Key, typeURL} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

// wrapAAD binds the wrapped data key to its key id and record.
func wrapAAD(keyID string, aad []byte) []byte {
	return append(lengthPrefixed([]byte(keyID)), aad...)
}

func lengthPrefixed(b []byte) []byte {
	return append(binary.AppendUvarint(nil, uint64(len(b))), b...)
}

func mac(key []byte, parts ...[]byte) []byte {
	h := hmac.New(sha256.New, key)
	for _, p := range parts {
		h.Write(p)
	}
	return h.Sum(nil)
}

func gcm(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("dedupesvc: %w", err)
	}
	return cipher.NewGCM(block)
}

// ReadOutcomeKeys parses an outcome keys file: one key a line, "id
// base64-key" (standard encoding, OutcomeKeyBytes once decoded), the last
// line's key sealing new outcomes; blank lines and lines starting with # are
// skipped. Errors name the line.
func ReadOutcomeKeys(r io.Reader) ([]OutcomeKey, error) {
	var (
		keys []OutcomeKey
		seen = map[string]int{}
		line int
	)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		fields := strings.Fields(text)
		if len(fields) != 2 {
			return nil, fmt.Errorf("line %d: want \"id base64-key\"", line)
		}
		if err := checkKeyID(fields[0]); err != nil {
			return nil, fmt.Errorf("line %d: key id %w", line, err)
		}
		if first, dup := seen[fields[0]]; dup {
			return nil, fmt.Errorf("line %d: key id %q is already on line %d", line, fields[0], first)
		}
		key, err := base64.StdEncoding.DecodeString(fields[1])
		if err != nil {
			return nil, fmt.Errorf("line %d: key is not standard base64", line)
		}
		if len(key) != OutcomeKeyBytes {
			return nil, fmt.Errorf("line %d: key is %d bytes, want %d (head -c 32 /dev/urandom | base64)", line, len(key), OutcomeKeyBytes)
		}
		seen[fields[0]] = line
		keys = append(keys, OutcomeKey{ID: fields[0], Key: key})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, errors.New("no key: want one \"id base64-key\" line at least")
	}
	return keys, nil
}
