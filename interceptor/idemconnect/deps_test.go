package idemconnect_test

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// A Connect-only program, with idem's engine, its Connect adapter,
// store/postgres and the admin service, builds no package of grpc-go.
func TestConnectOnlyProgramBuildsNoGRPC(t *testing.T) {
	const program = "github.com/idemkit/idem/interceptor/idemconnect/internal/connectonly"
	out, err := exec.Command("go", "list", "-deps", program).Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps %s: %v\n%s", program, err, stderr)
	}
	deps := strings.Fields(string(out))
	// The program is what it says it is.
	for _, want := range []string{
		"github.com/idemkit/idem",
		"github.com/idemkit/idem/interceptor/idemconnect",
		"github.com/idemkit/idem/store/postgres",
		"github.com/idemkit/idem/admin",
		"github.com/idemkit/idem/gen/idem/admin/v1/adminv1connect",
		"connectrpc.com/connect",
	} {
		if !slices.Contains(deps, want) {
			t.Errorf("the program does not build %s", want)
		}
	}
	for _, p := range deps {
		if strings.HasPrefix(p, "google.golang.org/grpc") {
			t.Errorf("a Connect-only program builds %s (go list -deps -f '{{.ImportPath}} {{.Imports}}' %s shows which import brings it)", p, program)
		}
	}
}
