package mcpbridge

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
)

// Every reason the gate declares tells an MCP caller what to do: a reason
// added to the root package's reasons.go without advice here would reach
// agents as an error with none.
func TestEveryReasonHasAdvice(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "..", "reasons.go"), nil, 0)
	if err != nil {
		t.Fatalf("%v (the gate's reasons moved? point this test at them)", err)
	}
	seen := 0
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		reason, _ := strconv.Unquote(lit.Value)
		if !strings.HasPrefix(reason, "IDEMPOTENCY_") {
			return true
		}
		seen++
		if Advice(reason, codes.Unknown) == "" {
			t.Errorf("%s has no advice: add it to Advice and to the advice table in docs/mcp.md (Agent runtimes)", reason)
		}
		return true
	})
	if seen < 10 {
		t.Fatalf("found %d reasons in reasons.go; the test no longer reads them", seen)
	}
	if a := Advice(ReasonArgumentsInvalid, codes.InvalidArgument); a != AdviceFixRequest {
		t.Errorf("%s: advice %q", ReasonArgumentsInvalid, a)
	}
	if a := Advice("", codes.Internal); a != "" {
		t.Errorf("a tool's own INTERNAL error: advice %q, want none", a)
	}
}

func TestCodeName(t *testing.T) {
	for c, want := range map[codes.Code]string{
		codes.FailedPrecondition: "FAILED_PRECONDITION",
		codes.OK:                 "OK",
		codes.DeadlineExceeded:   "DEADLINE_EXCEEDED",
		codes.Unavailable:        "UNAVAILABLE",
		codes.Canceled:           "CANCELLED",
	} {
		if got := codeName(c); got != want {
			t.Errorf("codeName(%v) = %q, want %q", c, got, want)
		}
	}
}
