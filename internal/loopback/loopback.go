// Package loopback tells whether a listen or dial address reaches only this
// machine: the commands refuse plaintext or unauthenticated service on any
// other.
package loopback

import "net"

// Address reports whether addr (host:port) names this machine only:
// localhost or a loopback IP. An address without a port, an empty host
// (":8080", every interface) and any other name are not loopback.
func Address(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
