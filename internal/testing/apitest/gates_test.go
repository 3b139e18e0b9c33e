package apitest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// api is what a package exports: top-level names, and each type's fields
// and methods.
type api struct {
	top     map[string]bool
	options map[string]bool // exported func With...(...) Option
	members map[string]map[string]bool
}

func (a api) has(name string) bool {
	return a.top[name] || a.members["Gate"][name]
}

// exported parses the package in dir (its non-test files) and returns its
// exported API.
func exported(t *testing.T, dir string) api {
	t.Helper()
	a := api{top: map[string]bool{}, options: map[string]bool{}, members: map[string]map[string]bool{}}
	member := func(typ, name string) {
		if a.members[typ] == nil {
			a.members[typ] = map[string]bool{}
		}
		a.members[typ][name] = true
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					a.top[d.Name.Name] = true
					if strings.HasPrefix(d.Name.Name, "With") && d.Type.Results != nil && len(d.Type.Results.List) == 1 {
						if id, ok := d.Type.Results.List[0].Type.(*ast.Ident); ok && id.Name == "Option" {
							a.options[d.Name.Name] = true
						}
					}
					continue
				}
				recv := d.Recv.List[0].Type
				if star, ok := recv.(*ast.StarExpr); ok {
					recv = star.X
				}
				if id, ok := recv.(*ast.Ident); ok {
					member(id.Name, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch spec := spec.(type) {
					case *ast.TypeSpec:
						if !spec.Name.IsExported() {
							continue
						}
						a.top[spec.Name.Name] = true
						if st, ok := spec.Type.(*ast.StructType); ok {
							for _, field := range st.Fields.List {
								for _, n := range field.Names {
									if n.IsExported() {
										member(spec.Name.Name, n.Name)
									}
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range spec.Names {
							if n.IsExported() {
								a.top[n.Name] = true
							}
						}
					}
				}
			}
		}
	}
	return a
}

var (
	backticked = regexp.MustCompile("`([^`]+)`")
	goName     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Z][A-Za-z0-9_]*)?$`)
)

// names are the exported Go names among a cell's backticked words: X, or
// idemgate.X, or Type.Member; anything else (a flag, a media type, a type of
// another module) is prose.
func names(cell string) []string {
	var out []string
	for _, m := range backticked.FindAllStringSubmatch(cell, -1) {
		w := m[1]
		if !goName.MatchString(w) {
			continue
		}
		first, _, _ := strings.Cut(w, ".")
		if first == "idemgate" || (first[0] >= 'A' && first[0] <= 'Z') {
			out = append(out, w)
		}
	}
	return out
}

// block returns the lines after the marker up to the first blank line.
func block(t *testing.T, doc, marker string) []string {
	t.Helper()
	_, after, ok := strings.Cut(doc, marker+"\n")
	if !ok {
		t.Fatalf("docs/gating.md has no %s", marker)
	}
	before, _, _ := strings.Cut(after, "\n\n")
	return strings.Split(before, "\n")
}

// The table describes the four gates: each name it shows exists in its
// column's package (or, as idemgate.X, in the root package), each option a
// gate exports is shown in its column or in the shared list, and each shared
// name exists in every gate.
func TestGateTableMatchesTheAPIs(t *testing.T) {
	raw, err := os.ReadFile("../../../docs/gating.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	root := exported(t, "../../..")

	rows := block(t, doc, "<!-- gate-table -->")
	if len(rows) < 3 {
		t.Fatalf("the gate table has %d lines", len(rows))
	}
	cells := func(row string) []string {
		c := strings.Split(strings.Trim(row, "|"), "|")
		for i := range c {
			c[i] = strings.TrimSpace(c[i])
		}
		return c
	}
	var pkgs []string
	for _, h := range cells(rows[0])[1:] {
		m := backticked.FindStringSubmatch(h)
		if m == nil {
			t.Fatalf("header cell %q names no package", h)
		}
		pkgs = append(pkgs, m[1])
	}
	if want := []string{"interceptor", "connectgate", "httpgate", "mcpgate"}; !slices.Equal(pkgs, want) {
		t.Fatalf("the table's columns are %v, want %v", pkgs, want)
	}
	apis := map[string]api{}
	for _, p := range pkgs {
		apis[p] = exported(t, filepath.Join("../../..", p))
	}

	shown := map[string]map[string]bool{}
	for _, p := range pkgs {
		shown[p] = map[string]bool{}
	}
	for _, row := range rows[2:] {
		c := cells(row)
		if len(c) != len(pkgs)+1 {
			t.Errorf("row %q has %d cells, want %d", c[0], len(c), len(pkgs)+1)
			continue
		}
		for i, p := range pkgs {
			for _, n := range names(c[i+1]) {
				shown[p][n] = true
				a := apis[p]
				typ, member, qualified := strings.Cut(n, ".")
				switch {
				case qualified && typ == "idemgate":
					if !root.has(member) {
						t.Errorf("row %q, %s: idemgate exports no %s", c[0], p, member)
					}
				case qualified:
					if !a.members[typ][member] {
						t.Errorf("row %q, %s: %s.%s has no %s", c[0], p, p, typ, member)
					}
				case !a.has(n):
					t.Errorf("row %q: %s exports no %s (nor a Gate method of that name)", c[0], p, n)
				}
			}
		}
	}

	shared := names(strings.Join(block(t, doc, "<!-- gate-shared -->"), " "))
	if len(shared) < 10 {
		t.Fatalf("the shared list names %d: %v", len(shared), shared)
	}
	for _, n := range shared {
		for _, p := range pkgs {
			if !apis[p].has(n) {
				t.Errorf("every gate has %s, says docs/gating.md; %s has not", n, p)
			}
			shown[p][n] = true
		}
	}
	for _, p := range pkgs {
		for o := range apis[p].options {
			if !shown[p][o] {
				t.Errorf("%s.%s is in no row of docs/gating.md's gate table nor in its shared list", p, o)
			}
		}
	}
}

// A gate does not export again, under its own name, what package idemgate
// exports: a handler or caller written against the vocabulary works behind
// every gate, and two names for one thing are one too many. The names a
// gate shares with the root package are its own transport's (httpgate's
// header names spelled for HTTP; each gate's Reconciler and Resolution
// carry its transport's request and answer).
func TestGatesDoNotRepeatTheVocabulary(t *testing.T) {
	root := exported(t, "../../..")
	own := map[string]map[string]string{
		"httpgate": {
			"KeyHeader": "HTTP's spelling", "ReplayedHeader": "HTTP's spelling", "KeyDerivedHeader": "HTTP's spelling",
			"ExpiresAtHeader": "HTTP's spelling", "OriginalTimeHeader": "HTTP's spelling",
			"Reconciler": "an HTTP request and body", "Resolution": "an HTTP response",
			"ResolvedNotRun": "httpgate.Resolution", "StillUnknown": "httpgate.Resolution", "ResolvedResponse": "httpgate.Resolution",
		},
		"mcpgate": {
			"Reconciler": "a tool's arguments", "Resolution": "a tool result",
			"ResolvedNotRun": "mcpgate.Resolution", "StillUnknown": "mcpgate.Resolution",
		},
	}
	for _, p := range []string{"interceptor", "connectgate", "httpgate", "mcpgate"} {
		for n := range exported(t, filepath.Join("../../..", p)).top {
			if root.top[n] && own[p][n] == "" {
				t.Errorf("%s.%s repeats idemgate.%s: use the root package's", p, n, n)
			}
		}
	}
}
