package chaos

import (
	"net"
	"strconv"
	"testing"
)

// TestListenAddrOutsideEphemeralRange holds the suite's listen addresses
// below the kernel's ephemeral range, which every outgoing connection on the
// machine draws from: a port picked by listening on :0 and closing was taken
// by another connection before the chaos tool bound it ("address already in
// use", SEED=3 of the HTTP and Connect variants), and distinct within a run.
func TestListenAddrOutsideEphemeralRange(t *testing.T) {
	t.Parallel()
	lo := ephemeralLow()
	seen := map[string]bool{}
	for range 50 {
		addr := listenAddr(t)
		if seen[addr] {
			t.Fatalf("listenAddr returned %s twice", addr)
		}
		seen[addr] = true
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if port <= 0 || port >= lo {
			t.Fatalf("listenAddr returned %s, in the ephemeral range from %d", addr, lo)
		}
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listen on %s: %v", addr, err)
		}
		_ = lis.Close()
	}
}
