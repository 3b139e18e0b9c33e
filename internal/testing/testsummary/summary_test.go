package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// A stream as go test -json writes it: a package that passes with one test
// skipped for a missing tool, one whose test fails, one with a test that
// panicked (no result event of its own), and a package without tests.
const stream = `{"Action":"start","Package":"ex/deploy"}
{"Action":"run","Package":"ex/deploy","Test":"TestAlertRules"}
{"Action":"output","Package":"ex/deploy","Test":"TestAlertRules","Output":"=== RUN   TestAlertRules\n"}
{"Action":"output","Package":"ex/deploy","Test":"TestAlertRules","Output":"    deploy_test.go:54: promtool is missing (apt-get install prometheus): exec: \"promtool\": executable file not found in $PATH\n"}
{"Action":"output","Package":"ex/deploy","Test":"TestAlertRules","Output":"--- SKIP: TestAlertRules (0.00s)\n"}
{"Action":"skip","Package":"ex/deploy","Test":"TestAlertRules","Elapsed":0}
{"Action":"run","Package":"ex/deploy","Test":"TestOK"}
{"Action":"output","Package":"ex/deploy","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"ex/deploy","Test":"TestOK","Output":"    ok_test.go:9: chatter nobody needs to see\n"}
{"Action":"output","Package":"ex/deploy","Test":"TestOK","Output":"--- PASS: TestOK (0.00s)\n"}
{"Action":"pass","Package":"ex/deploy","Test":"TestOK","Elapsed":0}
{"Action":"output","Package":"ex/deploy","Output":"PASS\n"}
{"Action":"output","Package":"ex/deploy","Output":"ok  \tex/deploy\t0.01s\n"}
{"Action":"pass","Package":"ex/deploy","Elapsed":0.01}
{"Action":"run","Package":"ex/poly","Test":"TestPython"}
{"Action":"output","Package":"ex/poly","Test":"TestPython","Output":"=== RUN   TestPython\n"}
{"Action":"run","Package":"ex/poly","Test":"TestPython/charge"}
{"Action":"output","Package":"ex/poly","Test":"TestPython/charge","Output":"=== RUN   TestPython/charge\n"}
{"Action":"output","Package":"ex/poly","Test":"TestPython/charge","Output":"    polyglot_test.go:38: python3's grpc is missing (apt-get install python3-grpcio python3-protobuf): No module named 'grpc'\n"}
{"Action":"output","Package":"ex/poly","Test":"TestPython/charge","Output":"--- SKIP: TestPython/charge (0.00s)\n"}
{"Action":"skip","Package":"ex/poly","Test":"TestPython/charge","Elapsed":0}
{"Action":"run","Package":"ex/poly","Test":"TestPython/refund"}
{"Action":"output","Package":"ex/poly","Test":"TestPython/refund","Output":"    polyglot_test.go:38: python3's grpc is missing (apt-get install python3-grpcio python3-protobuf): No module named 'grpc'\n"}
{"Action":"skip","Package":"ex/poly","Test":"TestPython/refund","Elapsed":0}
{"Action":"output","Package":"ex/poly","Test":"TestPython","Output":"--- PASS: TestPython (0.00s)\n"}
{"Action":"pass","Package":"ex/poly","Test":"TestPython","Elapsed":0}
{"Action":"run","Package":"ex/poly","Test":"TestBroken"}
{"Action":"output","Package":"ex/poly","Test":"TestBroken","Output":"=== RUN   TestBroken\n"}
{"Action":"output","Package":"ex/poly","Test":"TestBroken","Output":"    broken_test.go:12: got 2 charges, want 1\n"}
{"Action":"output","Package":"ex/poly","Test":"TestBroken","Output":"--- FAIL: TestBroken (0.00s)\n"}
{"Action":"fail","Package":"ex/poly","Test":"TestBroken","Elapsed":0}
{"Action":"output","Package":"ex/poly","Output":"FAIL\n"}
{"Action":"output","Package":"ex/poly","Output":"FAIL\tex/poly\t0.02s\n"}
{"Action":"fail","Package":"ex/poly","Elapsed":0.02}
{"Action":"run","Package":"ex/crash","Test":"TestPanics"}
{"Action":"output","Package":"ex/crash","Test":"TestPanics","Output":"=== RUN   TestPanics\n"}
{"Action":"output","Package":"ex/crash","Test":"TestPanics","Output":"panic: runtime error: index out of range [1] with length 0\n"}
{"Action":"output","Package":"ex/crash","Output":"FAIL\tex/crash\t0.03s\n"}
{"Action":"fail","Package":"ex/crash","Elapsed":0.03}
{"Action":"output","Package":"ex/none","Output":"?   \tex/none\t[no test files]\n"}
{"Action":"skip","Package":"ex/none","Elapsed":0}
`

func TestSummarize(t *testing.T) {
	var out bytes.Buffer
	r, err := summarize(strings.NewReader(stream), &out)
	if err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if !r.failed {
		t.Error("failed = false for a stream with a failed test")
	}
	if len(r.skips) != 3 {
		t.Errorf("%d skips, want 3: %+v", len(r.skips), r.skips)
	}
	for _, want := range []string{
		"ok  \tex/deploy\t0.01s\n",
		"    broken_test.go:12: got 2 charges, want 1\n--- FAIL: TestBroken (0.00s)\n",
		"FAIL\tex/poly\t0.02s\n",
		"panic: runtime error: index out of range", // a test without a result still shows its output
		"?   \tex/none\t[no test files]\n",
		"3 tests skipped:",
		"ex/deploy TestAlertRules: promtool is missing (apt-get install prometheus)",
		"ex/poly TestPython/charge, TestPython/refund: python3's grpc is missing",
		"install for nothing to skip: apt-get install prometheus python3-grpcio python3-protobuf",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"=== RUN", "chatter nobody needs", "--- PASS", "--- SKIP", "PASS\n"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("output has %q, which go test without -v does not print:\n%s", unwanted, got)
		}
	}
}

// Skips that name npm ci in a directory come to one make npm-ci, which
// installs them all; a skip that names another target (an opt-in suite's)
// is no install.
func TestSummarizeNpmRemedy(t *testing.T) {
	var out bytes.Buffer
	in := `{"Action":"output","Package":"ex/mcp","Test":"TestA","Output":"    a_test.go:3: the npm packages are not installed: run npm ci in internal/x/node\n"}
{"Action":"skip","Package":"ex/mcp","Test":"TestA"}
{"Action":"output","Package":"ex/mcp","Test":"TestB","Output":"    b_test.go:3: the Inspector is not installed: run npm ci in internal/x/inspector (make npm-ci)\n"}
{"Action":"skip","Package":"ex/mcp","Test":"TestB"}
{"Action":"output","Package":"ex/chaos","Test":"TestChaos","Output":"    suite_test.go:73: the chaos suite runs with -chaos or any -chaos.* flag: make chaos\n"}
{"Action":"skip","Package":"ex/chaos","Test":"TestChaos"}
`
	if _, err := summarize(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	if want := "install for nothing to skip: make npm-ci\n"; !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, out.String())
	}
}

func TestSummarizeNothingSkipped(t *testing.T) {
	var out bytes.Buffer
	in := `{"Action":"output","Package":"ex/a","Output":"ok  \tex/a\t0.01s\n"}
{"Action":"pass","Package":"ex/a","Elapsed":0.01}
`
	r, err := summarize(strings.NewReader(in), &out)
	if err != nil || r.failed || len(r.skips) != 0 {
		t.Fatalf("summarize = %+v, %v", r, err)
	}
	if !strings.Contains(out.String(), "no test skipped") {
		t.Errorf("output %q does not say that nothing was skipped", out.String())
	}
}

// Lines that are not JSON (a build error printed by go vet before the
// events, say) are passed through, not dropped.
func TestSummarizePassesOtherLines(t *testing.T) {
	var out bytes.Buffer
	if _, err := summarize(strings.NewReader("# ex/a\nvet: x.go:1: bad\n"), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "vet: x.go:1: bad\n") {
		t.Errorf("output %q lost a non-JSON line", out.String())
	}
}

// The program exits as the command it ran did: non-zero when go test
// failed, even when the events said nothing about it.
func TestExitCodeIsTheCommands(t *testing.T) {
	if os.Getenv("TESTSUMMARY_CHILD") == "1" {
		os.Args = []string{"testsummary", "sh", "-c", os.Getenv("TESTSUMMARY_CMD")}
		main()
		return
	}
	for _, tc := range []struct {
		cmd  string
		want int
	}{
		{`echo '{"Action":"pass","Package":"ex/a"}'`, 0},
		{`echo '{"Action":"pass","Package":"ex/a"}'; exit 3`, 3},
		{`echo '{"Action":"fail","Package":"ex/a"}'`, 1},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestExitCodeIsTheCommands$")
		cmd.Env = append(os.Environ(), "TESTSUMMARY_CHILD=1", "TESTSUMMARY_CMD="+tc.cmd)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.want {
			t.Errorf("%s: exit code %d, want %d\n%s", tc.cmd, code, tc.want, out)
		}
	}
}
