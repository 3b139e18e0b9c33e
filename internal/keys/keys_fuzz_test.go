package keys

import "testing"

// FuzzValidate checks Validate against the rule it promises: 1 to 255 bytes,
// each 0x20 to 0x7E, the first and last not a space.
func FuzzValidate(f *testing.F) {
	for _, seed := range []string{"", "order-8842", "tab\there", "caf\u00e9", "\x7f", " ", "~", " order-1", "order-1 ", "   ", "order 1"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, key string) {
		want := len(key) >= 1 && len(key) <= MaxBytes && key[0] != ' ' && key[len(key)-1] != ' '
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				want = false
			}
		}
		if err := Validate(key); (err == nil) != want {
			t.Fatalf("Validate(%q) = %v, want valid=%v", key, err, want)
		}
	})
}
