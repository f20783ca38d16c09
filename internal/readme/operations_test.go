package readme

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/pgtest"
)

func TestMain(m *testing.M) {
	os.Exit(pgtest.Run(m))
}

// opsMark precedes a shell block of the walkthrough in docs/operations.md.
var opsMark = regexp.MustCompile(`^<!-- ops: ([a-z-]+) -->$`)

// opsBlocks returns the shell blocks of md marked "<!-- ops: NAME -->", by
// name, and their names in md's order.
func opsBlocks(md string) (map[string]string, []string) {
	blocks := map[string]string{}
	var order []string
	lines := strings.Split(md, "\n")
	for i := 0; i < len(lines); i++ {
		m := opsMark.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		j := i + 1
		for j < len(lines) && strings.TrimSpace(lines[j]) == "" {
			j++
		}
		if j == len(lines) || !strings.HasPrefix(lines[j], "```") {
			continue
		}
		var body []string
		for j++; j < len(lines) && !strings.HasPrefix(lines[j], "```"); j++ {
			body = append(body, lines[j])
		}
		blocks[m[1]] = strings.Join(body, "\n")
		order = append(order, m[1])
		i = j
	}
	return blocks, order
}

// walkthrough is a bash that runs the walkthrough's blocks one at a time,
// as a reader types them into one interactive shell: job control on (so that
// "kill %%" stops a job's whole process group, go run's child included),
// every job's process group stopped, and waited for, when it exits.
type walkthrough struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // bash's standard output: one "@@ok NAME" per block, "@@exit RC" at the end
	outDir string
	exited bool
}

func startWalkthrough(t *testing.T, dir string, env []string) *walkthrough {
	w := &walkthrough{t: t, lines: make(chan string, 16), outDir: t.TempDir()}
	w.cmd = exec.Command("bash", "--noprofile", "--norc")
	w.cmd.Dir = dir
	w.cmd.Env = env
	var stderr strings.Builder
	w.cmd.Stderr = &stderr
	var err error
	if w.stdin, err = w.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			w.lines <- s.Text()
		}
		close(w.lines)
	}()
	t.Cleanup(func() {
		w.stdin.Close()
		done := make(chan error, 1)
		go func() { done <- w.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("the walkthrough's shell: %v; stderr:\n%s", err, stderr.String())
			}
		case <-time.After(time.Minute):
			_ = w.cmd.Process.Kill()
			t.Errorf("the walkthrough's shell did not stop its jobs within a minute; stderr:\n%s", stderr.String())
		}
	})
	// groups lists the process group of every job a block started, so
	// that the shell stops, and waits for, the ones still running when it
	// exits: go run's child outlives go run, and the checkout demo drops
	// its databases on its way out.
	w.send(`set -m -euo pipefail
groups=
trap 'rc=$?
for p in $groups; do kill -- -$p 2>/dev/null || true; done
for p in $groups; do while kill -0 -- -$p 2>/dev/null; do sleep 0.1; done; done
echo "@@exit $rc"' EXIT
`)
	return w
}

func (w *walkthrough) send(s string) {
	if _, err := io.WriteString(w.stdin, s); err != nil {
		w.t.Fatalf("writing to the walkthrough's shell: %v", err)
	}
}

// log returns what block name printed so far, its jobs' output included.
func (w *walkthrough) log(name string) string {
	b, _ := os.ReadFile(filepath.Join(w.outDir, name+".log"))
	return string(b)
}

// run runs the walkthrough's block name and returns what it printed,
// failing the test if a command of it fails.
func (w *walkthrough) run(name, script string) string {
	w.t.Helper()
	w.t.Logf("+ %s", script)
	w.send(fmt.Sprintf("{\n%s\n} >%q 2>&1 </dev/null\ngroups=\"$groups $(jobs -p | tr '\\n' ' ')\"\necho '@@ok %s'\n",
		script, filepath.Join(w.outDir, name+".log"), name))
	timeout := time.After(5 * time.Minute)
	for {
		select {
		case line, ok := <-w.lines:
			switch {
			case !ok:
				w.t.Fatalf("the shell ended in block %s; it printed:\n%s", name, w.log(name))
			case line == "@@ok "+name:
				out := w.log(name)
				w.t.Logf("%s", out)
				return out
			case strings.HasPrefix(line, "@@exit "):
				w.t.Fatalf("block %s failed (%s); it printed:\n%s", name, line, w.log(name))
			}
		case <-timeout:
			w.t.Fatalf("block %s still runs after 5 minutes; it printed:\n%s", name, w.log(name))
		}
	}
}

// await polls ready until it holds, while the shell runs, for at most
// limit.
func (w *walkthrough) await(what string, limit time.Duration, ready func() bool, name string) {
	w.t.Helper()
	deadline := time.After(limit)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !ready() {
		select {
		case line, ok := <-w.lines:
			if !ok || strings.HasPrefix(line, "@@exit ") {
				w.t.Fatalf("the shell ended waiting for %s; block %s printed:\n%s", what, name, w.log(name))
			}
		case <-deadline:
			w.t.Fatalf("no %s after %v; block %s printed:\n%s", what, limit, name, w.log(name))
		case <-tick.C:
		}
	}
}

// listening reports whether every address accepts a connection.
func listening(addrs ...string) func() bool {
	return func() bool {
		for _, a := range addrs {
			c, err := net.DialTimeout("tcp", a, time.Second)
			if err != nil {
				return false
			}
			c.Close()
		}
		return true
	}
}

// TestOperationsWalkthrough runs the shell blocks of the walkthrough in
// docs/operations.md as written, in one bash, on a fresh database:
// it installs the idem command into a directory of its own, starts the
// payments server in the background, pays and retries, finds the key and
// reads it, then starts the checkout demo, counts the stuck keys, finds
// the checkout it left abandoned, makes a dry run of finishing every
// abandoned key, finishes it and reads its audit trail. It waits for each server by polling its
// listener (or, for the demo, its output), and checks what each step
// printed and that one payment was made.
func TestOperationsWalkthrough(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, order := opsBlocks(string(md))
	want := []string{"setup", "payments-server", "payments-retry", "payments-keys", "checkout-demo", "checkout-keys"}
	if strings.Join(order, " ") != strings.Join(want, " ") {
		t.Fatalf("docs/operations.md's <!-- ops: NAME --> blocks are %v, want %v", order, want)
	}
	for _, tool := range []string{"bash", "curl", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the walkthrough needs %s on PATH: %v", tool, err)
		}
	}
	// docs/operations.md's commands name their addresses.
	for _, a := range []string{"127.0.0.1:50051", "127.0.0.1:8080", "127.0.0.1:9464", "127.0.0.1:9091", "127.0.0.1:9092"} {
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("docs/operations.md's walkthrough listens on %s, which is taken (%v): stop what listens there", a, err)
		}
		l.Close()
	}
	dsn := pgtest.NewDatabase(t)
	bin := t.TempDir()
	var env []string
	for _, kv := range os.Environ() {
		switch name, _, _ := strings.Cut(kv, "="); name {
		case "DATABASE_URL", "GOBIN", "PATH", "IDEM_ADMIN_TOKEN", "IDEM_ADMIN_ADDR":
		default:
			env = append(env, kv)
		}
	}
	env = append(env, "DATABASE_URL="+dsn, "GOBIN="+bin, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	w := startWalkthrough(t, root, env)

	w.run("setup", blocks["setup"])
	if _, err := os.Stat(filepath.Join(bin, "idem")); err != nil {
		t.Fatalf("go install ./cmd/idem installed no idem: %v", err)
	}

	// "I was charged twice."
	w.run("payments-server", blocks["payments-server"])
	w.await("payments server", 3*time.Minute, listening("127.0.0.1:8080", "127.0.0.1:9464", "127.0.0.1:9091"), "payments-server")
	out := w.run("payments-retry", blocks["payments-retry"])
	if n := strings.Count(out, "HTTP/1.1 200 OK"); n != 2 {
		t.Errorf("the payment and its retry: %d answers 200 OK, want 2", n)
	}
	if n := len(regexp.MustCompile(`(?mi)^Idempotent-Replayed: true\r?$`).FindAllString(out, -1)); n != 1 {
		t.Errorf("%d answers marked Idempotent-Replayed, want 1 (the retry)", n)
	}
	ids := regexp.MustCompile(`"id":"([0-9a-f-]{36})"`).FindAllStringSubmatch(out, -1)
	if len(ids) != 2 || ids[0][1] != ids[1][1] {
		t.Fatalf("the payment and its retry name payments %v, want one payment twice", ids)
	}
	payment := ids[0][1]
	out = w.run("payments-keys", blocks["payments-keys"])
	if n := len(regexp.MustCompile(`(?m)^order-1001 +acme +/payments\.v1\.PaymentService/CreatePayment +recorded `).FindAllString(out, -1)); n != 1 {
		t.Errorf("idem keys list: %d rows of order-1001, recorded, want 1", n)
	}
	if !regexp.MustCompile(`(?m)^response: +payments\.v1\.CreatePaymentResponse \{"payment":\{"amountCents":"1250",.*"id":"` + payment + `"`).MatchString(out) {
		t.Errorf("idem keys get shows no recorded response naming payment %s", payment)
	}
	for _, result := range []string{"executed", "replayed"} {
		if !regexp.MustCompile(`(?m)^idem_server_requests_total\{.*idem_result="` + result + `".*rpc_method="payments\.v1\.PaymentService/CreatePayment"\} 1$`).MatchString(out) {
			t.Errorf("the metrics count no CreatePayment %s once", result)
		}
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var payments int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&payments); err != nil {
		t.Fatal(err)
	}
	if payments != 1 {
		t.Errorf("%d payments rows after a payment and its retry, want 1", payments)
	}

	// An abandoned checkout.
	w.run("checkout-demo", blocks["checkout-demo"])
	w.await("abandoned checkout", 5*time.Minute, func() bool {
		return strings.Contains(w.log("checkout-demo"), "it waits for an operator")
	}, "checkout-demo")
	out = w.run("checkout-keys", blocks["checkout-keys"])
	// The list and the dry run's sample each show order-1, alone.
	if n := len(regexp.MustCompile(`(?m)^\S+ +\S+ +\S+ +abandoned `).FindAllString(out, -1)); n != 2 ||
		len(regexp.MustCompile(`(?m)^order-1 +- +/checkout\.v1\.CheckoutService/Checkout +abandoned `).FindAllString(out, -1)) != 2 {
		t.Errorf("idem keys list -state abandoned and the dry run's sample: want order-1 alone in each")
	}
	if !regexp.MustCompile(`(?m)^- +/checkout\.v1\.CheckoutService/Checkout +abandoned +1$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^oldest abandoned: order-1 \(tenant -, method /checkout\.v1\.CheckoutService/Checkout\), created `).MatchString(out) {
		t.Errorf("idem keys stats: want order-1 counted abandoned, and named the oldest")
	}
	if !strings.Contains(out, "Dry run: 1 keys match; the first 1, which one call would finish:") {
		t.Errorf("idem bulk finish -dry-run: want a count of 1")
	}
	if !regexp.MustCompile(`(?m)^\S+ +finish +order-1 +- +/checkout\.v1\.CheckoutService/Checkout +\S+ +false +abandoned +recorded +replica crash, INC-42$`).MatchString(out) {
		t.Errorf("idem keys history: want the finish, abandoned to recorded, with its reason")
	}
	// finish and get each print the key, recorded, with its answer.
	if n := len(regexp.MustCompile(`(?m)^state: +recorded$`).FindAllString(out, -1)); n != 2 {
		t.Errorf("finish and get print %d keys recorded, want 2", n)
	}
	if n := len(regexp.MustCompile(`(?m)^steps: +reserve \(\d+ bytes\), charge \(\d+ bytes\), confirm \(\d+ bytes\)$`).FindAllString(out, -1)); n != 2 {
		t.Errorf("finish and get print the steps reserve, charge, confirm %d times, want 2", n)
	}
	answer := regexp.MustCompile(`(?m)^response: +checkout\.v1\.CheckoutResponse \{"amountCents":"2500","chargeId":"ch_[0-9a-f]+","orderId":"[0-9a-f-]{36}","reservationId":"[0-9a-f-]{36}"\}$`)
	if got := answer.FindAllString(out, -1); len(got) != 2 || got[0] != got[1] {
		t.Errorf("finish and get print the answers %q, want one answer naming a charge, an order and a reservation, twice", got)
	}

	w.stdin.Close()
	for line := range w.lines {
		if strings.HasPrefix(line, "@@exit ") && line != "@@exit 0" {
			t.Errorf("the walkthrough's shell ended with %s", line)
		}
	}
}
