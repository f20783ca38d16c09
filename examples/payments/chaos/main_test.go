package chaos

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/store/postgres/pgtest"
)

// binDir holds the server binaries the tests build, once per test run.
var binDir string

// idemLog keeps what the idem interceptors of the servers in this process
// log; it goes to standard error too.
var idemLog = &logCapture{}

// idemLogger is the logger of those interceptors.
var idemLogger = slog.New(slog.NewTextHandler(io.MultiWriter(os.Stderr, idemLog), nil))

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idem-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := pgtest.Run(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// Packages of the server binaries.
const (
	serverPkg      = "github.com/idemkit/idem/examples/payments/server"
	crashServerPkg = "github.com/idemkit/idem/examples/payments/chaos/internal/crashserver"
)

var builds sync.Map // package path -> *build

type build struct {
	once sync.Once
	path string
	err  error
}

// binary builds the main package pkg, once per test run, with the race
// detector when this test binary has it, and returns the executable's path.
func binary(t *testing.T, pkg string) string {
	t.Helper()
	v, _ := builds.LoadOrStore(pkg, new(build))
	b := v.(*build)
	b.once.Do(func() {
		b.path = filepath.Join(binDir, filepath.Base(pkg))
		args := []string{"build", "-o", b.path}
		if raceEnabled {
			args = append(args, "-race")
		}
		// go test puts its own go command first in PATH.
		cmd := exec.Command("go", append(args, pkg)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// logCapture keeps log output to search it.
type logCapture struct{ lockedBuffer }

// count returns how many lines logged so far contain s.
func (c *logCapture) count(s string) int {
	n := 0
	for _, line := range strings.Split(c.String(), "\n") {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}
