// Package netfault puts a fault-injecting TCP proxy between a test's client
// and a server on loopback, in the test process: Shopify's toxiproxy used as
// a library, with no toxiproxy server or HTTP API.
//
// A test points its client at Proxy.Addr instead of the server's address and
// then switches named faults on and off while traffic flows:
//
//	p := netfault.NewProxy(t, serverAddr)
//	conn, _ := grpc.NewClient(p.Addr(), ...)
//	p.Blackhole() // calls now run into their deadlines
//	p.Heal()      // and succeed again once the client has reconnected
//
// Each fault replaces the one before it. Faults that lose bytes (Blackhole,
// Timeout, Reset, DropReplies) leave the connections they touched with gaps
// no real TCP connection has, so Heal, or the next fault, cuts those
// connections and clients reconnect; a gRPC client does so by itself (call
// with WaitForReady to ride its reconnect backoff, and retry UNAVAILABLE: a
// call that races the cut fails so). Latency loses nothing and cuts nothing.
package netfault
