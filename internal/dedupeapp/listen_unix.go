//go:build unix

package dedupeapp

import (
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"
)

// canBindAlone: a unix socket may be bound and closed without listening.
const canBindAlone = true

// bindAlone binds the socket fd, made for network (tcp4 or tcp6) by a
// listen on address (the resolved host:port), as that listen would bind
// it. An address it does not know how to bind (a zone) binds nothing and
// is left to the listen.
func bindAlone(fd uintptr, network, address string) error {
	sa, ok := sockaddr(network, address)
	if !ok {
		return nil
	}
	if err := syscall.Bind(int(fd), sa); err != nil {
		return os.NewSyscallError("bind", err)
	}
	return nil
}

// sockaddr is the socket address a listen on address binds on a socket of
// network: the empty host and 0.0.0.0 are every address, of both families
// on an IPv6 (dual-stack) socket, as package net binds them.
func sockaddr(network, address string) (syscall.Sockaddr, bool) {
	host, portText, err := net.SplitHostPort(address)
	if err != nil {
		return nil, false
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return nil, false
	}
	ip := netip.IPv4Unspecified()
	if host != "" {
		if ip, err = netip.ParseAddr(host); err != nil || ip.Zone() != "" {
			return nil, false
		}
	}
	switch network {
	case "tcp4":
		if ip = ip.Unmap(); !ip.Is4() {
			return nil, false
		}
		return &syscall.SockaddrInet4{Port: port, Addr: ip.As4()}, true
	case "tcp6":
		if ip == netip.IPv4Unspecified() {
			ip = netip.IPv6Unspecified()
		}
		return &syscall.SockaddrInet6{Port: port, Addr: ip.As16()}, true
	}
	return nil, false
}
