package httpgate_test

import (
	"strings"
	"testing"

	"github.com/idemgate/idemgate/httpgate"
)

func TestParseKey(t *testing.T) {
	for _, c := range []struct {
		value, key string
		ok         bool
	}{
		{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{`8e03978e-40d5-43e8-bc93-6894a57f9324`, "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{` "padded" `, "padded", true},
		{`"with \"quote\" and \\"`, `with "quote" and \`, true},
		{`"a b"`, "a b", true},
		{`bare"quote`, `bare"quote`, true},
		{`""`, "", false},
		{`" edge"`, "", false},
		{`"abc`, "", false},
		{`"a\nb"`, "", false},
		{`"abc";p=1`, "", false},
		{`"a", "b"`, "", false},
		{`a, b`, "", false},
		{`"a,b"`, "a,b", true},
		{"\"caf\xc3\xa9\"", "", false},
		{"bare\x7f", "", false},
		{`"` + strings.Repeat("k", 256) + `"`, "", false},
		{``, "", false},
	} {
		key, err := httpgate.ParseKey(c.value)
		if (err == nil) != c.ok || key != c.key {
			t.Errorf("ParseKey(%q) = %q, %v; want %q, ok %v", c.value, key, err, c.key, c.ok)
		}
	}
}
