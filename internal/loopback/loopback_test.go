package loopback_test

import (
	"testing"

	"github.com/idemgate/idemgate/internal/loopback"
)

func TestAddress(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:50051": true,
		"127.0.0.2:1":     true,
		"[::1]:8080":      true,
		"localhost:8080":  true,
		":8080":           false,
		"0.0.0.0:8080":    false,
		"10.0.0.1:8080":   false,
		"example.com:80":  false,
		"127.0.0.1":       false,
		"":                false,
	} {
		if got := loopback.Address(addr); got != want {
			t.Errorf("Address(%q) = %v, want %v", addr, got, want)
		}
	}
}
