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
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/checkout/checkoutsvc"
	checkoutv1 "github.com/idemkit/idem/examples/gen/checkout/v1"
	providerv1 "github.com/idemkit/idem/examples/gen/provider/v1"
)

// The environment of a replica: this program serves CheckoutService instead
// of playing the demo when replicaDatabase is set.
const (
	replicaDatabase = "CHECKOUT_DATABASE_URL"  // the checkout database
	replicaProvider = "CHECKOUT_PROVIDER_ADDR" // the provider's address
	replicaCrashAt  = "CHECKOUT_CRASH_AT"      // points at which to die, comma-separated
	replicaGrace    = "CHECKOUT_FINISH_GRACE"  // the finisher's grace, a Go duration
	replicaPause    = "CHECKOUT_CONFIRM_PAUSE" // a pause inside the confirm step, a Go duration
)

// Who runs Checkout in a replica: a client's call, or the finisher.
const (
	runnerCall     = "call"
	runnerFinisher = "finisher"
)

// pointOutcome is the point a replica reports when idem has settled a
// call's outcome; the detail is the idem.Result.
const pointOutcome = "outcome"

// finishInterval is how often a replica's finisher looks for abandoned
// checkouts: often, so that the demo does not wait. A production service
// keeps the default (10 s).
const finishInterval = 100 * time.Millisecond

// isReplica reports whether this process was started as a replica.
func isReplica() bool { return os.Getenv(replicaDatabase) != "" }

// serveReplica serves CheckoutService on a loopback port, and runs a
// finisher of abandoned checkouts, until standard input closes. It writes
// "listening ADDR" to standard output, then one line "RUNNER KEY POINT
// DETAIL" for each point Checkout reaches and for each outcome idem settles
// (POINT "outcome"), RUNNER telling a client's call from the finisher's
// run. At a point named by replicaCrashAt, alone or prefixed by the runner
// ("finisher:charge_answered"), right after writing its line, the process
// kills itself.
func serveReplica() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
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
	grace, err := time.ParseDuration(os.Getenv(replicaGrace))
	if err != nil {
		return fmt.Errorf("%s: %w", replicaGrace, err)
	}
	var pause time.Duration
	if v := os.Getenv(replicaPause); v != "" {
		if pause, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("%s: %w", replicaPause, err)
		}
	}

	crashAt := map[string]bool{}
	for _, p := range strings.Split(os.Getenv(replicaCrashAt), ",") {
		crashAt[p] = p != ""
	}
	var mu sync.Mutex
	report := func(runner, key, point, detail string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf("%s %s %s %s\n", runner, key, point, detail)
		if crashAt[point] || crashAt[runner+":"+point] {
			crash()
		}
	}
	hook := func(runner string) checkoutsvc.Option {
		return checkoutsvc.WithHook(func(ctx context.Context, point, detail string) {
			key, _ := idem.KeyFromContext(ctx)
			report(runner, key, point, detail)
			if point == checkoutsvc.PointOrderMade {
				time.Sleep(pause)
			}
		})
	}
	// The server and the finisher run Checkout with the same options.
	opts := []idem.Option{idem.WithReportHook(func(ctx context.Context, o idem.Report) {
		runner, key := runnerCall, "-"
		if o.Finishing {
			runner = runnerFinisher
		}
		if v := metadata.ValueFromIncomingContext(ctx, idem.KeyHeader); len(v) == 1 {
			key = v[0]
		}
		report(runner, key, pointOutcome, string(o.Result))
	})}
	provider := providerv1.NewProviderServiceClient(conn)
	srv, err := checkoutsvc.NewServer(checkoutsvc.New(pool, provider, hook(runnerCall)), opts...)
	if err != nil {
		return err
	}
	finisher, err := checkoutsvc.NewFinisher(checkoutsvc.New(pool, provider, hook(runnerFinisher)), opts,
		idem.WithGrace(grace), idem.WithInterval(finishInterval))
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Printf("listening %s\n", lis.Addr())
	completed := make(chan struct{})
	go func() {
		defer close(completed)
		_ = finisher.Run(ctx)
	}()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
		<-completed
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

// event is a line a replica wrote: a point Checkout reached, or an
// outcome, in a call or in a finisher's run.
type event struct{ runner, key, point, detail string }

// replicaConfig is how a replica behaves.
type replicaConfig struct {
	crashAt string        // points at which it dies (see replicaCrashAt)
	grace   time.Duration // its finisher's grace
	pause   time.Duration // a pause inside the confirm step, after the order is made
}

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

	mu   sync.Mutex
	log  []event
	grew chan struct{} // closed, and replaced, when log grows
}

// startReplica starts a replica configured by cfg on the checkout database
// dsn that charges through the provider at providerAddr. Its standard
// error goes to logs.
func startReplica(ctx context.Context, name, dsn, providerAddr string, cfg replicaConfig, logs io.Writer) (*replica, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), replicaDatabase+"="+dsn, replicaProvider+"="+providerAddr,
		replicaCrashAt+"="+cfg.crashAt, replicaGrace+"="+cfg.grace.String(), replicaPause+"="+cfg.pause.String())
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
	r := &replica{name: name, cmd: cmd, stdin: stdin, exited: make(chan struct{}), grew: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		defer close(r.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				addr <- a
				continue
			}
			f := strings.SplitN(sc.Text(), " ", 4)
			if len(f) < 4 {
				continue
			}
			r.mu.Lock()
			r.log = append(r.log, event{f[0], f[1], f[2], f[3]})
			close(r.grew)
			r.grew = make(chan struct{})
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

// stop closes the replica's standard input, which makes it stop its
// finisher and stop serving, and waits for it to exit, killing it after a
// while. It returns how the process ended.
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

// awaitBound bounds how long the demo and the tests wait for a replica to
// do something: far longer than any lease and grace they use.
const awaitBound = 30 * time.Second

// wait waits for the replica to exit on its own, at most awaitBound or
// until ctx ends, and returns how it ended.
func (r *replica) wait(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, awaitBound)
	defer cancel()
	select {
	case <-r.exited:
		return r.err
	case <-ctx.Done():
		return fmt.Errorf("replica %s still runs: %w", r.name, ctx.Err())
	}
}

// events returns the events the replica reported so far about key, or all
// of them for key "".
func (r *replica) events(key string) []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []event
	for _, e := range r.log {
		if key == "" || e.key == key {
			out = append(out, e)
		}
	}
	return out
}

// waitFor waits until the replica reports an event that match accepts and
// returns it. It fails when the replica exits without one, after
// awaitBound, or when ctx ends.
func (r *replica) waitFor(ctx context.Context, match func(event) bool) (event, error) {
	ctx, cancel := context.WithTimeout(ctx, awaitBound)
	defer cancel()
	for exited := false; ; {
		r.mu.Lock()
		grew := r.grew
		for _, e := range r.log {
			if match(e) {
				r.mu.Unlock()
				return e, nil
			}
		}
		r.mu.Unlock()
		if exited {
			return event{}, fmt.Errorf("replica %s exited (%v) without the awaited event", r.name, r.err)
		}
		select {
		case <-grew:
		case <-r.exited:
			exited = true
		case <-ctx.Done():
			return event{}, fmt.Errorf("replica %s: %w", r.name, ctx.Err())
		}
	}
}

// outcome returns a matcher of the outcome result of key in a run by
// runner.
func outcome(runner, key string, result idem.Result) func(event) bool {
	return func(e event) bool {
		return e.runner == runner && e.key == key && e.point == pointOutcome && e.detail == string(result)
	}
}
