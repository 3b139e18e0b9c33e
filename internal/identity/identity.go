// Package identity names the caller of a gRPC call from what the transport
// verified: the SPIFFE ID in the client certificate's URI SANs where there is
// one, else the certificate's subject. Never from metadata the caller can
// write.
package identity

import (
	"context"
	"crypto/x509"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// FromPeer returns the identity of the call's verified client certificate,
// or "" when the connection has none (plaintext, or TLS without a verified
// client certificate).
func FromPeer(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return ""
	}
	return OfCertificate(info.State.VerifiedChains[0][0])
}

// OfCertificate returns a certificate's SPIFFE ID, else its subject.
func OfCertificate(cert *x509.Certificate) string {
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" {
			return u.String()
		}
	}
	return cert.Subject.String()
}
