package chaos

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/idemkit/idem"
)

// chaosModes are the modes the crash and fault tests run the payments
// server in: CreatePayment's own (atomic) and auto, whose calls marked as
// first attempts claim their keys without reading them first.
var chaosModes = []idem.Mode{idem.ModeAtomic, idem.ModeAuto}

// forEachMode runs f as a subtest for each of chaosModes, with the server
// flags that select it.
func forEachMode(t *testing.T, f func(t *testing.T, flags []string)) {
	for _, m := range chaosModes {
		t.Run(string(m), func(t *testing.T) { f(t, []string{"-mode", string(m)}) })
	}
}

// startTimeout bounds a server start, until it answers health checks. The
// machine may be busy with other tests.
const startTimeout = 60 * time.Second

// serverProc is a payments server running as a child process on a fixed
// loopback address, so that clients reconnect to it after a restart.
type serverProc struct {
	t    *testing.T
	bin  string
	addr string
	dsn  string
	args []string // more of bin's flags

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
	state  *os.ProcessState
	output lockedBuffer // stderr and stdout of every run
	starts int
}

// startServer starts bin on a free loopback port with the database dsn and
// args, more of its flags, and waits until it is serving. The process is
// killed when t ends.
func startServer(t *testing.T, bin, dsn string, args ...string) *serverProc {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	p := &serverProc{t: t, bin: bin, addr: addr, dsn: dsn, args: args}
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("server output:\n%s", p.output.String())
		}
	})
	p.start()
	return p
}

// start starts the process and waits until it answers a health check.
func (p *serverProc) start() {
	p.t.Helper()
	cmd := exec.Command(p.bin, append([]string{"-listen", p.addr, "-database-url", p.dsn}, p.args...)...)
	cmd.Stdout = &p.output
	cmd.Stderr = &p.output
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	exited := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.exited, p.state = cmd, exited, nil
	p.starts++
	p.mu.Unlock()
	go func() {
		cmd.Wait()
		p.mu.Lock()
		p.state = cmd.ProcessState
		p.mu.Unlock()
		close(exited)
	}()

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	conn := dial(p.t, p.addr)
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	for {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		select {
		case <-exited:
			p.t.Fatalf("server exited during start (%v):\n%s", p.exitState(), p.output.String())
		case <-ctx.Done():
			p.t.Fatalf("server not serving after %v: %v\n%s", startTimeout, err, p.output.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// kill kills the process with SIGKILL, as a crash would, and waits for it.
// It does nothing when no process runs.
func (p *serverProc) kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// restart kills the process and starts a new one on the same address.
func (p *serverProc) restart() {
	p.t.Helper()
	p.kill()
	p.start()
}

// pid returns the process id of the running server.
func (p *serverProc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// running reports whether the process started last is still running.
func (p *serverProc) running() bool {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// exitState describes how the process started last ended.
func (p *serverProc) exitState() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == nil {
		return "running"
	}
	return p.state.String()
}

// killedBySIGKILL reports whether the process started last died of SIGKILL.
func (p *serverProc) killedBySIGKILL() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == nil {
		return false
	}
	ws, ok := p.state.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// waitExit waits up to d for the process started last to exit.
func (p *serverProc) waitExit(d time.Duration) error {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	select {
	case <-exited:
		return nil
	case <-time.After(d):
		return fmt.Errorf("server still running after %v", d)
	}
}

// dial returns a client connection to addr that reconnects quickly after
// the server comes back, instead of gRPC's default backoff of up to two
// minutes.
func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  10 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   100 * time.Millisecond,
			},
			MinConnectTimeout: 5 * time.Second,
		}),
	}, opts...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// lockedBuffer is a bytes.Buffer safe for concurrent writers.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// contains reports whether the output so far contains s.
func (b *lockedBuffer) contains(s string) bool {
	return strings.Contains(b.String(), s)
}
