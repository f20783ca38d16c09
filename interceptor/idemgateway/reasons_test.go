package idemgateway

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// idemReasons returns the ErrorInfo reasons package idem declares, by name,
// read from its source: the constants named Reason… of the files that
// declare them.
func idemReasons(t *testing.T) map[string]string {
	t.Helper()
	reasons := map[string]string{}
	fset := token.NewFileSet()
	for _, name := range []string{"../../status.go", "../../finisher.go"} {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if !strings.HasPrefix(n.Name, "Reason") {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						t.Fatalf("%s: %s is not a string literal", fset.Position(n.Pos()), n.Name)
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					reasons[n.Name] = v
				}
			}
		}
	}
	if len(reasons) == 0 {
		t.Fatal("no Reason constants found in package idem's source")
	}
	return reasons
}

// Every reason idem may put on an error has its problem, whose type names
// its constant: a reason added to package idem without one here fails.
func TestEveryReasonHasAProblem(t *testing.T) {
	for name, reason := range idemReasons(t) {
		p := reasonProblem(reason, status.New(codes.FailedPrecondition, "idem: "+reason), nil)
		if p == nil {
			t.Errorf("%s (%s) has no problem details: add it to reasonProblem and to the package documentation's table", name, reason)
			continue
		}
		if p.Reason != reason || !strings.HasSuffix(p.Type, "#"+name) || p.Title == "" || p.Detail == "" ||
			p.Status < http.StatusBadRequest {
			t.Errorf("%s: problem %+v; want reason %s, a type naming %s, a title, a detail and a 4xx or 5xx status",
				name, p, reason, name)
		}
	}
}
