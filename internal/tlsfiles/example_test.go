package tlsfiles_test

import (
	"crypto/tls"
	"log"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/idemgate/idemgate/internal/tlsfiles"
)

// A gRPC server whose certificate and client CAs rotate on disk.
func ExampleServerConfig() {
	pair, err := tlsfiles.NewKeyPair("-tls-cert/-tls-key", "/etc/idemgate/tls/server.crt", "/etc/idemgate/tls/server.key")
	if err != nil {
		log.Fatal(err)
	}
	clientCAs, err := tlsfiles.NewCAPool("-tls-client-ca", "/etc/idemgate/tls/client-ca.crt")
	if err != nil {
		log.Fatal(err)
	}
	base := &tls.Config{ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}
	_ = grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsfiles.ServerConfig(base, pair, clientCAs))))
}

// A client that presents a client certificate renewed on disk and verifies
// its server against a CA bundle that rotates.
func ExampleClientCredentials() {
	pair, err := tlsfiles.NewKeyPair("-tls-cert/-tls-key", "tool.crt", "tool.key")
	if err != nil {
		log.Fatal(err)
	}
	roots, err := tlsfiles.NewCAPool("-tls-ca", "ca.crt")
	if err != nil {
		log.Fatal(err)
	}
	creds := tlsfiles.ClientCredentials(&tls.Config{GetClientCertificate: pair.GetClientCertificate, MinVersion: tls.VersionTLS12}, roots)
	conn, err := grpc.NewClient("dns:///dedupe.internal:50051", grpc.WithTransportCredentials(creds))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
}
