package httpgate

import (
	"errors"
	"net/http"
	"strings"

	"github.com/idemgate/idemgate/internal/keys"
)

// ParseKey reads the key of an Idempotency-Key field value. The draft
// defines the field as a Structured Field Item whose value is an sf-string
// (RFC 8941 3.3.3): `"8e03978e-40d5-43e8-bc93-6894a57f9324"`. The rule:
//
//   - a value that starts with a double quote is parsed strictly as an
//     sf-string: printable ASCII, `\"` and `\\` the only escapes, nothing but
//     spaces after the closing quote (the draft defines no parameters, so
//     `"k";p=1` is refused rather than read as "k");
//   - any other value is taken as the key itself, as written (the bare
//     form many clients send, as Stripe's API reads it): `abc` and `"abc"`
//     name the same key, abc; a bare key may not hold a comma, which is
//     what two fields joined by a proxy look like (`a, b`): quote it;
//
// and then the key must pass the validation every idemgate gate applies: 1
// to 255 bytes of printable ASCII without leading or trailing spaces.
func ParseKey(value string) (string, error) {
	v := strings.Trim(value, " \t")
	if !strings.HasPrefix(v, `"`) {
		if strings.Contains(v, ",") {
			// Two header lines a proxy joined ("a, b"), never one key.
			return "", errors.New("the key holds a comma: two Idempotency-Key fields joined, or a bare key with a comma (quote it)")
		}
		if err := keys.Validate(v); err != nil {
			return "", errors.New("the key " + err.Error())
		}
		return v, nil
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", errors.New(`the sf-string has an escape other than \" or \\`)
			}
			b.WriteByte(v[i])
		case c == '"':
			if rest := strings.TrimRight(v[i+1:], " \t"); rest != "" {
				return "", errors.New("the field has more than one sf-string, or parameters, after the key; send exactly one quoted key and nothing else")
			}
			key := b.String()
			if err := keys.Validate(key); err != nil {
				return "", errors.New("the key " + err.Error())
			}
			return key, nil
		case c < 0x20 || c > 0x7e:
			return "", errors.New("the sf-string holds a byte that is not printable ASCII")
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("the sf-string has no closing double quote")
}

// keyOf returns the request's key, or ok false when it sent none, or the
// reason the field is unusable.
func keyOf(h http.Header) (key string, ok bool, err error) {
	values := h.Values(KeyHeader)
	switch len(values) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", true, errors.New("the request has more than one Idempotency-Key field; send exactly one")
	}
	key, err = ParseKey(values[0])
	return key, true, err
}
