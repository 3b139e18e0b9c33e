//go:build faults

package main_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc/auth"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// stranger opens a raw HTTP/2 connection from ip (any of 127/8 on Linux)
// and, when path is not empty, one stream on it: a gRPC message header
// announcing length bytes and the first part of them (one frame: under
// 16 KiB), never the rest.
func stranger(t *testing.T, ip, addr, path string, length, part int) *http2.Framer {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	if path == "" {
		return fr
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path},
		{":authority", "dedupe"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 5+part)
	binary.BigEndian.PutUint32(msg[1:5], uint32(length))
	if err := fr.WriteData(1, length == part, msg); err != nil {
		t.Fatal(err)
	}
	return fr
}

// The real binary, with a token file, holds strangers to their bounds
// before they authenticate: a call without credentials is answered from its
// headers while its megabyte is still on the way, and strangers' Health.Watch
// and idle connections, twice -max-connections of them, leave a tool
// server's new connection room. -unauthenticated-timeout is long, so only
// the caps can make room.
func TestBinaryBoundsStrangersBeforeAuthentication(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	const secret = "tools-secret-0123456789abc"
	if err := os.WriteFile(tokens, []byte("tools client "+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := stacktest.FreeAddr(t)
	const maxConns = 8
	proctest.Start(t, proctest.Build(t, dedupesvcPkg),
		[]string{"-listen", addr, "-data-dir", filepath.Join(dir, "data"), "-metrics-listen", "", "-token-file", tokens,
			"-max-connections", "8", "-unauthenticated-timeout", "1h"},
		[]string{"DATABASE_URL="})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(auth.BearerToken(secret, true)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	begin := func(key string) error {
		// Generous: the binary starts inside this deadline on a loaded machine.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, err := idemgatev1.NewDedupeServiceClient(conn).Begin(ctx, &idemgatev1.BeginRequest{Scope: "/x.S/M", Key: key,
			Fingerprint: make([]byte, 32), AttemptToken: "a", Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)}, grpc.WaitForReady(true))
		return err
	}
	if err := begin("ready"); err != nil {
		t.Fatal(err)
	}

	fr := stranger(t, "127.0.0.2", addr, idemgatev1.DedupeService_Begin_FullMethodName, 1<<20, 8<<10)
	dec := hpack.NewDecoder(4096, nil)
	for answered := false; !answered; {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no answer to an unauthenticated Begin whose message is incomplete: %v (the service is reading it)", err)
		}
		if h, ok := f.(*http2.HeadersFrame); ok {
			fields, _ := dec.DecodeFull(h.HeaderBlockFragment())
			for _, field := range fields {
				if field.Name == "grpc-status" {
					if field.Value != "16" {
						t.Fatalf("unauthenticated Begin: grpc-status %s, want 16 (UNAUTHENTICATED)", field.Value)
					}
					answered = true
				}
			}
		}
	}

	conn.Close()
	conn, err = grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(auth.BearerToken(secret, true)))
	if err != nil {
		t.Fatal(err)
	}
	for range maxConns {
		stranger(t, "127.0.0.3", addr, "/grpc.health.v1.Health/Watch", 0, 0)
		stranger(t, "127.0.0.4", addr, "", 0, 0)
	}
	if err := begin("tool"); err != nil {
		t.Fatalf("a tool server's new connection, with %d strangers' connections against -max-connections %d: %v", 2*maxConns, maxConns, err)
	}
}
