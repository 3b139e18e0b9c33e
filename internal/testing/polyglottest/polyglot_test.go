package polyglottest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate/internal/protoset"
	"github.com/idemgate/idemgate/internal/testing/proctest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// python is Debian's interpreter, the one python3-grpcio installs for (a
// python3 earlier on PATH, such as pyenv's, does not see it).
const python = "/usr/bin/python3"

// need skips the test when a dependency of the examples is missing, and
// fails it under CI=true, where .ci/run must have installed it.
func need(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is missing (CI=true, so this fails; .ci/run installs it): %v", what, err)
	}
	t.Skipf("%s is missing: %v", what, err)
}

// stack is a dedupesvc on the embedded store and a payments-server gated by
// it, both real binaries on loopback.
type stack struct {
	dedupe   *proctest.Process
	payments string // the payments server's address
}

func startStack(t *testing.T) stack {
	t.Helper()
	dedupeAddr, paymentsAddr := stacktest.FreeAddr(t), stacktest.FreeAddr(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	dedupe := proctest.Start(t, proctest.Build(t, "github.com/idemgate/idemgate/cmd/dedupesvc"),
		[]string{"-database-url", "", "-data-dir", dataDir, "-listen", dedupeAddr, "-metrics-listen", ""}, []string{"DATABASE_URL=", "IDEMGATE_TOKEN_FILE="})
	dedupe.WaitTCP(t, dedupeAddr, time.Minute)
	payments := proctest.Start(t, proctest.Build(t, "github.com/idemgate/idemgate/cmd/payments-server"),
		[]string{"-listen", paymentsAddr, "-dedupe", dedupeAddr, "-reflection"}, []string{"IDEMGATE_DEDUPE_TOKEN="})
	payments.WaitTCP(t, paymentsAddr, time.Minute)
	return stack{dedupe: dedupe, payments: paymentsAddr}
}

// descriptorSet writes what make protos-export writes as
// idemgate-callers.binpb and returns its path.
func descriptorSet(t *testing.T) string {
	t.Helper()
	set, err := protoset.Callers()
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "idemgate-callers.binpb")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// step is one JSON line an example prints.
type step struct {
	Step        string    `json:"step"`
	Key         *string   `json:"key"`
	Code        string    `json:"code"`
	Reason      string    `json:"reason"`
	Escalate    bool      `json:"escalate"`
	RetryDelay  *float64  `json:"retry_delay"`
	Replayed    bool      `json:"replayed"`
	ResponseHex string    `json:"response_hex"`
	ChargeID    string    `json:"charge_id"`
	AttemptKeys []*string `json:"attempt_keys"`
}

// run runs an example's command and returns its steps by name.
func run(t *testing.T, cmd *exec.Cmd) map[string]step {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", cmd, err, out, stderr.Bytes())
	}
	steps := map[string]step{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var s step
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("%s printed a line that is not a step: %q: %v", cmd, sc.Text(), err)
		}
		steps[s.Step] = s
	}
	t.Logf("%s:\n%s", filepath.Base(cmd.Args[len(cmd.Args)-1]), out)
	return steps
}

// example runs one language's example against the payments tool at target
// in a scenario ("main" or "store-down").
type example func(t *testing.T, target, scenario string) map[string]step

func TestPython(t *testing.T) {
	t.Parallel()
	need(t, "python3-grpcio and python3-protobuf for "+python+" (apt-get install python3-grpcio python3-protobuf)", exec.Command(python, "-c", "import grpc, google.protobuf").Run())
	script, err := filepath.Abs("../../../examples/python/payments_caller.py")
	if err != nil {
		t.Fatal(err)
	}
	set := descriptorSet(t)
	// The retry decisions (IN_FLIGHT, backoff, escalation) against scripted
	// answers: a live stack cannot be made to answer IN_FLIGHT on cue.
	unit := exec.Command(python, "-m", "unittest", "discover", "-s", filepath.Dir(script))
	unit.Env = append(os.Environ(), "IDEMGATE_DESCRIPTOR_SET="+set, "PYTHONDONTWRITEBYTECODE=1")
	if out, err := unit.CombinedOutput(); err != nil {
		t.Errorf("the Python example's unit tests: %v\n%s", err, out)
	}
	testExample(t, func(t *testing.T, target, scenario string) map[string]step {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, python, script, "--target", target, "--descriptor-set", set, "--scenario", scenario)
		cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
		return run(t, cmd)
	})
}

func TestTypeScript(t *testing.T) {
	t.Parallel()
	dir, err := filepath.Abs("../../../examples/typescript")
	if err != nil {
		t.Fatal(err)
	}
	_, err = exec.LookPath("node")
	need(t, "node (apt-get install nodejs)", err)
	tsc := filepath.Join(dir, "node_modules", ".bin", "tsc")
	_, err = os.Stat(tsc)
	need(t, "examples/typescript's dependencies (make npm-ci)", err)
	// Compiled out of the tree, so a test never leaves dist/ behind; the
	// compiled file finds its dependencies through NODE_PATH.
	out := t.TempDir()
	if b, err := exec.Command(tsc, "-p", dir, "--outDir", out).CombinedOutput(); err != nil {
		t.Fatalf("tsc: %v\n%s", err, b)
	}
	set := descriptorSet(t)
	unit := exec.Command("node", "--test", filepath.Join(out, "payments_caller.test.js"))
	unit.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(dir, "node_modules"), "IDEMGATE_DESCRIPTOR_SET="+set)
	if b, err := unit.CombinedOutput(); err != nil {
		t.Errorf("the TypeScript example's unit tests: %v\n%s", err, b)
	}
	testExample(t, func(t *testing.T, target, scenario string) map[string]step {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "node", filepath.Join(out, "payments_caller.js"), "--target", target, "--descriptor-set", set, "--scenario", scenario)
		cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(dir, "node_modules"))
		return run(t, cmd)
	})
}

// testExample runs an example's two scenarios against a fresh stack and
// checks what it saw and decoded.
func testExample(t *testing.T, ex example) {
	s := startStack(t)
	steps := ex(t, s.payments, "main")
	get := func(name string) step {
		t.Helper()
		st, ok := steps[name]
		if !ok {
			t.Fatalf("the example printed no %q step", name)
		}
		return st
	}

	charge, retry, next := get("charge"), get("retry"), get("new_action")
	if charge.Code != "OK" || charge.Replayed || charge.ResponseHex == "" {
		t.Errorf("first charge: %+v, want it executed", charge)
	}
	if retry.Code != "OK" || !retry.Replayed {
		t.Errorf("retry with the same key: %+v, want a replay (idempotency-replayed: true)", retry)
	}
	if retry.ResponseHex != charge.ResponseHex || *retry.Key != *charge.Key {
		t.Errorf("the replay's bytes %s differ from the first response's %s", retry.ResponseHex, charge.ResponseHex)
	}
	if next.Code != "OK" || next.Replayed || next.ChargeID == charge.ChargeID || *next.Key == *charge.Key {
		t.Errorf("a new action with a new key: %+v, want a second charge (the first was %s)", next, charge.ChargeID)
	}

	keyless := get("keyless")
	if keyless.Code != "INVALID_ARGUMENT" || keyless.Reason != "IDEMPOTENCY_KEY_MISSING" || keyless.Escalate || len(keyless.AttemptKeys) != 1 {
		t.Errorf("keyless call: %+v, want INVALID_ARGUMENT IDEMPOTENCY_KEY_MISSING decoded, one attempt", keyless)
	}
	reused := get("reused")
	if reused.Code != "FAILED_PRECONDITION" || reused.Reason != "IDEMPOTENCY_KEY_REUSED" || !reused.Escalate || len(reused.AttemptKeys) != 1 {
		t.Errorf("key reused with other arguments: %+v, want FAILED_PRECONDITION IDEMPOTENCY_KEY_REUSED decoded and escalated, not retried", reused)
	}

	// With the Dedupe service gone the gate fails closed with UNAVAILABLE and
	// a RetryInfo; the caller retries with the same key after its delay.
	s.dedupe.Kill()
	down := ex(t, s.payments, "store-down")["store_down"]
	if down.Code != "UNAVAILABLE" || down.Reason != "IDEMPOTENCY_STORE_UNAVAILABLE" || down.Escalate {
		t.Errorf("call with the Dedupe service down: %+v, want UNAVAILABLE IDEMPOTENCY_STORE_UNAVAILABLE", down)
	}
	if down.RetryDelay == nil || *down.RetryDelay != 1 {
		t.Errorf("RetryInfo.retry_delay decoded as %v, want 1 (seconds, the interceptor's default)", down.RetryDelay)
	}
	if len(down.AttemptKeys) != 3 {
		t.Errorf("%d attempts, want 3 (retried on UNAVAILABLE until the attempts ran out)", len(down.AttemptKeys))
	}
	for i, k := range down.AttemptKeys {
		if k == nil || down.Key == nil || *k != *down.Key {
			t.Errorf("attempt %d sent key %v, want the action's key %v on every attempt", i+1, k, down.Key)
		}
	}
}

// With -reflection the payments server answers for its service and for the
// google.rpc error details, so grpcurl can decode a refusal's reason.
func TestReflection(t *testing.T) {
	t.Parallel()
	s := startStack(t)
	conn, err := grpc.NewClient(s.payments, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, symbol := range []string{"examples.payments.v1.PaymentsService", "google.rpc.ErrorInfo", "google.rpc.RetryInfo", "google.rpc.Status"} {
		if err := stream.Send(&reflectionpb.ServerReflectionRequest{
			MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: symbol},
		}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
			t.Errorf("reflection has no file for %s: %v", symbol, resp.GetErrorResponse())
		}
	}
}
