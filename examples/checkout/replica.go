package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemkit/idem/examples/checkout/checkoutsvc"
	checkoutv1 "github.com/idemkit/idem/examples/gen/checkout/v1"
	providerv1 "github.com/idemkit/idem/examples/gen/provider/v1"
)

// The environment of a replica: this program serves CheckoutService instead
// of playing the demo when replicaDatabase is set.
const (
	replicaDatabase = "CHECKOUT_DATABASE_URL"  // the checkout database
	replicaProvider = "CHECKOUT_PROVIDER_ADDR" // the provider's address
	replicaCrashAt  = "CHECKOUT_CRASH_AT"      // a point at which to die, if any
)

// isReplica reports whether this process was started as a replica.
func isReplica() bool { return os.Getenv(replicaDatabase) != "" }

// serveReplica serves CheckoutService on a loopback port until standard
// input closes. It writes "listening ADDR" to standard output, then one
// line "POINT DETAIL" for each point Checkout reaches; at the point named
// by replicaCrashAt, right after writing its line, the process kills itself.
func serveReplica() error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(replicaDatabase))
	if err != nil {
		return err
	}
	defer pool.Close()
	conn, err := grpc.NewClient(os.Getenv(replicaProvider),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(checkoutsvc.ClientInterceptors()...))
	if err != nil {
		return err
	}
	defer conn.Close()

	crashAt := os.Getenv(replicaCrashAt)
	var mu sync.Mutex
	hook := func(point, detail string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf("%s %s\n", point, detail)
		if point == crashAt {
			crash()
		}
	}
	srv := checkoutsvc.NewServer(checkoutsvc.New(pool, providerv1.NewProviderServiceClient(conn), checkoutsvc.WithHook(hook)))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Printf("listening %s\n", lis.Addr())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		srv.Stop()
	}()
	return srv.Serve(lis)
}

// crash ends the process at once, as a power cut or the OOM killer would:
// no deferred function runs, so the key's lease is neither released nor
// extended and stays until it runs out. (os.Process.Kill sends SIGKILL on
// Unix.)
func crash() {
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Kill()
	}
	select {}
}

// event is a line a replica wrote: a point Checkout reached.
type event struct{ point, detail string }

// replica is a checkout server in a child process: this program, run again
// with the replica environment.
type replica struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	client checkoutv1.CheckoutServiceClient
	conn   *grpc.ClientConn
	exited chan struct{} // closed when the process has exited
	err    error         // how it ended, once exited is closed

	mu  sync.Mutex
	log []event
}

// startReplica starts a replica on the checkout database dsn that charges
// through the provider at providerAddr and, if crashAt is not empty, dies
// at that point. Its standard error goes to logs.
func startReplica(ctx context.Context, name, dsn, providerAddr, crashAt string, logs io.Writer) (*replica, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), replicaDatabase+"="+dsn, replicaProvider+"="+providerAddr, replicaCrashAt+"="+crashAt)
	cmd.Stderr = logs
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	r := &replica{name: name, cmd: cmd, stdin: stdin, exited: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		defer close(r.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			point, detail, _ := strings.Cut(sc.Text(), " ")
			if point == "listening" {
				addr <- detail
				continue
			}
			r.mu.Lock()
			r.log = append(r.log, event{point, detail})
			r.mu.Unlock()
		}
		// Wait closes standard output, so it comes after the last line.
		r.err = cmd.Wait()
	}()
	select {
	case a := <-addr:
		r.conn, err = grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			r.stop()
			return nil, err
		}
		r.client = checkoutv1.NewCheckoutServiceClient(r.conn)
		return r, nil
	case <-r.exited:
		err = fmt.Errorf("exited before listening: %v", r.err)
	case <-ctx.Done():
		err = ctx.Err()
	case <-time.After(time.Minute):
		err = errors.New("not listening after a minute")
	}
	r.stop()
	return nil, fmt.Errorf("replica %s: %w", name, err)
}

// stop closes the replica's standard input, which makes it stop serving,
// and waits for it to exit, killing it after a while. It returns how the
// process ended.
func (r *replica) stop() error {
	if r.conn != nil {
		_ = r.conn.Close()
	}
	_ = r.stdin.Close()
	select {
	case <-r.exited:
	case <-time.After(30 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.exited
	}
	return r.err
}

// wait waits for the replica to exit on its own and returns how it ended.
func (r *replica) wait() error {
	<-r.exited
	return r.err
}

// events returns the points the replica reported so far.
func (r *replica) events() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]event(nil), r.log...)
}
