// Command burst measures how a freshly started Dedupe service answers its
// first burst of Begins: it waits until the service's health says SERVING,
// then sends -n Begins at once (distinct keys) and prints their latencies
// (issue 31: a fresh service whose pool opened on demand took over 500ms).
// It only talks to the address it is given; use it against 127.0.0.1.
package main

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "Dedupe service `address`")
	n := flag.Int("n", 48, "Begins sent at once")
	wait := flag.Duration("wait", time.Minute, "how long to wait for SERVING")
	flag.Parse()
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *wait)
	defer cancel()
	health := healthpb.NewHealthClient(conn)
	for {
		r, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: idemgatev1.DedupeService_ServiceDesc.ServiceName})
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "no SERVING:", err)
			os.Exit(1)
		}
		time.Sleep(10 * time.Millisecond)
	}
	dedupe := idemgatev1.NewDedupeServiceClient(conn)
	took := make([]time.Duration, *n)
	failed := make([]error, *n)
	stamp := time.Now().UnixNano()
	fingerprint := sha256.Sum256([]byte("burst"))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range *n {
		wg.Go(func() {
			<-start
			sent := time.Now()
			_, failed[i] = dedupe.Begin(ctx, &idemgatev1.BeginRequest{Scope: "burst", Key: fmt.Sprintf("k-%d-%d", stamp, i),
				Fingerprint: fingerprint[:], AttemptToken: fmt.Sprintf("t-%d-%d", stamp, i),
				Lease: durationpb.New(10 * time.Second), Retention: durationpb.New(time.Hour)})
			took[i] = time.Since(sent)
		})
	}
	close(start)
	wg.Wait()
	errs := 0
	for _, err := range failed {
		if err != nil {
			if errs == 0 {
				fmt.Fprintln(os.Stderr, "Begin:", err)
			}
			errs++
		}
	}
	slices.Sort(took)
	fmt.Printf("n=%d errors=%d p50=%v p90=%v max=%v\n", *n, errs, took[len(took)/2].Round(time.Millisecond),
		took[len(took)*9/10].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
}
