package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/cliflag"
	"github.com/idemgate/idemgate/internal/httplimits"
)

// Every flag reads a variable by cliflag's rule, prefix IDEMGATE_MCP_
// (IDEMGATE_MCP_LISTEN was not read before); -token keeps its documented
// IDEMGATE_MCP_TARGET_TOKEN.
func TestParseFlagsReadsTheEnvironment(t *testing.T) {
	env := map[string]string{
		"IDEMGATE_MCP_TARGET": "127.0.0.1:50052", "IDEMGATE_MCP_TARGET_TOKEN": "s3cret",
		"IDEMGATE_MCP_LISTEN": "127.0.0.1:8080", "IDEMGATE_MCP_PLAINTEXT": "true", "IDEMGATE_MCP_CALL_TIMEOUT": "5s",
		"IDEMGATE_MCP_DESCRIPTOR_SET": "p.binpb", "IDEMGATE_MCP_SERVICES": "a.S", "IDEMGATE_MCP_TLS_CA": "ca.pem",
		"IDEMGATE_MCP_TLS_SERVER_NAME": "tool", "IDEMGATE_MCP_KEY_ARGUMENT": "idempotency_key", "IDEMGATE_MCP_KEY_ARGUMENT_TOOLS": "a.S.M",
	}
	f, err := parseFlags([]string{"-services", "b.S"}, cliflag.Map(env), io.Discard)
	want := flags{target: "127.0.0.1:50052", token: "s3cret", listen: "127.0.0.1:8080", plaintext: true, callTimeout: 5 * time.Second,
		descriptorSet: "p.binpb", services: "b.S", caFile: "ca.pem", serverName: "tool", keyArgument: "idempotency_key", keyArgumentTools: "a.S.M",
		maxBodyBytes: 4 << 20, maxBufferedBytes: 256 << 20, maxBufferedBytesPerIP: 32 << 20, maxAnswerBytes: 256 << 20, maxAnswerBytesPerIP: 32 << 20,
		http: httplimits.Limits{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxConnections: 512, MaxConnectionsPerIP: 64}}
	if err != nil || f != want {
		t.Errorf("parseFlags = %+v, %v; want %+v", f, err, want)
	}
	if f, err := parseFlags(nil, cliflag.Map(nil), io.Discard); err != nil || f.callTimeout != time.Minute || f.listen != "" {
		t.Errorf("defaults: %+v, %v; want a 1m call timeout and stdio", f, err)
	}
}

// A variable that does not parse is an error naming it, its value and its
// flag, unless the flag is given.
func TestParseFlagsReportsABadVariable(t *testing.T) {
	bad := map[string]string{"IDEMGATE_MCP_CALL_TIMEOUT": "soon", "IDEMGATE_MCP_PLAINTEXT": "maybe"}
	_, err := parseFlags(nil, cliflag.Map(bad), io.Discard)
	for _, want := range []string{`IDEMGATE_MCP_CALL_TIMEOUT="soon" (-call-timeout): `, `IDEMGATE_MCP_PLAINTEXT="maybe" (-plaintext): `} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("two bad variables: %v, want both reported, %s among them", err, want)
		}
	}
	if f, err := parseFlags([]string{"-call-timeout", "2s", "-plaintext"}, cliflag.Map(bad), io.Discard); err != nil || f.callTimeout != 2*time.Second {
		t.Errorf("the flags given: %+v, %v; want them to win", f, err)
	}
	var usage strings.Builder
	if _, err := parseFlags([]string{"-h"}, cliflag.Map(nil), &usage); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"(env IDEMGATE_MCP_TARGET)", "(env IDEMGATE_MCP_TARGET_TOKEN)", "(env IDEMGATE_MCP_LISTEN)", "(env IDEMGATE_MCP_CALL_TIMEOUT)"} {
		if strings.Count(usage.String(), want) != 1 {
			t.Errorf("usage:\n%s\nwant %s once", usage.String(), want)
		}
	}
}

// The limits refuse a negative value, and the listener's TLS files go
// together and with -listen.
func TestParseFlagsChecksTheListener(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-listen", "127.0.0.1:1", "-max-body-bytes", "-1"}, "-max-body-bytes must be positive"},
		{[]string{"-listen", "127.0.0.1:1", "-read-timeout", "-1s"}, "-read-timeout must be positive"},
		{[]string{"-listen", "127.0.0.1:1", "-max-connections", "-1"}, "-max-connections must be positive"},
		{[]string{"-listen", "127.0.0.1:1", "-max-buffered-bytes-per-ip", "-1"}, "-max-buffered-bytes-per-ip must be positive"},
		{[]string{"-listen", "127.0.0.1:1", "-max-buffered-bytes-per-ip", "1048576"}, "-max-buffered-bytes-per-ip (1048576) must be at least twice -max-body-bytes (4194304)"},
		{[]string{"-listen", "127.0.0.1:1", "-max-answer-bytes", "-1"}, "-max-answer-bytes must be positive"},
		{[]string{"-listen", "127.0.0.1:1", "-max-answer-bytes-per-ip", "-1"}, "-max-answer-bytes-per-ip must be positive"},
		{[]string{"-listen", "127.0.0.1:1", "-listen-tls-cert", "c.pem"}, "-listen-tls-cert and -listen-tls-key go together"},
		{[]string{"-caller-token-file", "t"}, "need -listen"},
	} {
		if _, err := parseFlags(tc.args, cliflag.Map(nil), io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
	for _, listen := range []string{"127.0.0.1:8080", "localhost:8080", "[::1]:8080"} {
		if _, err := parseFlags([]string{"-listen", listen}, cliflag.Map(nil), io.Discard); err != nil {
			t.Errorf("-listen %s: %v, want a loopback address accepted", listen, err)
		}
	}
}

// The client certificate reads IDEMGATE_MCP_TLS_CERT and
// IDEMGATE_MCP_TLS_KEY; its files go together, and not with -plaintext.
func TestParseFlagsChecksTheClientCertificate(t *testing.T) {
	env := map[string]string{"IDEMGATE_MCP_TARGET": "127.0.0.1:50052", "IDEMGATE_MCP_TLS_CERT": "bridge.crt", "IDEMGATE_MCP_TLS_KEY": "bridge.key"}
	if f, err := parseFlags(nil, cliflag.Map(env), io.Discard); err != nil || f.certFile != "bridge.crt" || f.keyFile != "bridge.key" {
		t.Errorf("from the environment: %+v, %v; want bridge.crt and bridge.key", f, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-tls-cert", "c.pem"}, "-tls-cert and -tls-key go together"},
		{[]string{"-tls-key", "k.pem"}, "-tls-cert and -tls-key go together"},
		{[]string{"-plaintext", "-tls-cert", "c.pem", "-tls-key", "k.pem"}, "not with -plaintext"},
		{[]string{"-plaintext", "-tls-key", "k.pem"}, "not with -plaintext"},
	} {
		if _, err := parseFlags(tc.args, cliflag.Map(nil), io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}
