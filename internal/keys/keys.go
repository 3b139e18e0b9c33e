// Package keys validates idempotency keys, the same way in the interceptor
// and in the Dedupe service.
package keys

import (
	"errors"
	"fmt"
)

// MaxBytes is the longest idempotency key accepted.
const MaxBytes = 255

// Validate reports why key is not a usable idempotency key: it must be 1 to
// MaxBytes bytes of printable ASCII (0x20 to 0x7E), neither starting nor
// ending with a space. HTTP/2 forbids header values with edge spaces and
// proxies may trim them, so " order-1" and "order-1" must not be two keys.
// The error text completes the sentence "key ...".
func Validate(key string) error {
	switch {
	case key == "":
		return errors.New("is empty")
	case len(key) > MaxBytes:
		return fmt.Errorf("is %d bytes long, over the limit of %d", len(key), MaxBytes)
	case !Printable(key):
		return errors.New("must be printable ASCII (0x20 to 0x7E)")
	case key[0] == ' ' || key[len(key)-1] == ' ':
		return errors.New("must not start or end with a space")
	}
	return nil
}

// Printable reports whether s is printable ASCII only.
func Printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
