package identity

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"net/url"
	"testing"
)

func TestOfCertificate(t *testing.T) {
	spiffe, _ := url.Parse("spiffe://example.org/payments")
	web, _ := url.Parse("https://example.org/")
	tests := []struct {
		cert *x509.Certificate
		want string
	}{
		{&x509.Certificate{Subject: pkix.Name{CommonName: "payments"}, URIs: []*url.URL{web, spiffe}}, "spiffe://example.org/payments"},
		{&x509.Certificate{Subject: pkix.Name{CommonName: "payments", Organization: []string{"Acme"}}, URIs: []*url.URL{web}}, "CN=payments,O=Acme"},
	}
	for _, tt := range tests {
		if got := OfCertificate(tt.cert); got != tt.want {
			t.Errorf("OfCertificate = %q, want %q", got, tt.want)
		}
	}
}
