package interceptor

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Every reason the interceptor declares labels its refusals in
// idemgate_interceptor_calls_total; one missing from interceptorReasons
// would be counted as "refused".
func TestEveryReasonHasItsOwnLabel(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "reasons.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
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
		if got := reasonLabel(reason); got == "refused" {
			t.Errorf("%s is labelled %q: add it to interceptorReasons", reason, got)
		}
		return true
	})
	if seen < 10 {
		t.Fatalf("found %d reasons in reasons.go; the test no longer reads them", seen)
	}
}
