package interceptor_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/store/memory"
)

// serveChain starts a gRPC server on a loopback port with the unary
// interceptors chain in front of svc, and returns a client of it dialled
// with opts.
func serveChain(t *testing.T, svc testv1.TestServiceServer, chain []grpc.UnaryServerInterceptor, opts ...grpc.DialOption) testv1.TestServiceClient {
	t.Helper()
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(chain...))
	testv1.RegisterTestServiceServer(srv, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return dial(t, lis.Addr().String(), opts...)
}

// lineLogger is a go-grpc-middleware logging.Logger that keeps each line
// it is given, with its fields.
type lineLogger struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLogger) Log(_ context.Context, _ logging.Level, msg string, fields ...any) {
	var b strings.Builder
	b.WriteString(msg)
	for i := 0; i+1 < len(fields); i += 2 {
		fmt.Fprintf(&b, " %v=%v", fields[i], fields[i+1])
	}
	l.mu.Lock()
	l.lines = append(l.lines, b.String())
	l.mu.Unlock()
}

// finished returns the "finished call" lines logged so far, and forgets
// every line.
func (l *lineLogger) finished() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if strings.HasPrefix(line, "finished call") {
			out = append(out, line)
		}
	}
	l.lines = nil
	return out
}

// TestOutcomeOnTheFinishedCallLine: go-grpc-middleware's logging
// interceptor, placed before idem in the chain, prints idem's outcome on
// the line it logs when a call finishes.
func TestOutcomeOnTheFinishedCallLine(t *testing.T) {
	log := &lineLogger{}
	client := serveChain(t, &testService{}, []grpc.UnaryServerInterceptor{
		logging.UnaryServerInterceptor(log, logging.WithLogOnEvents(logging.FinishCall)),
		interceptor.UnaryServerInterceptor(idemtest.NewEngine(t, memory.New())),
	})
	for _, c := range []struct {
		name string
		call func() error
		want []string
	}{
		{"first call", func() error { _, err := client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}); return err },
			[]string{"idem.result=executed", "idem.replayed=false"}},
		{"retry", func() error { _, err := client.Do(withKey("k"), &testv1.DoRequest{Value: "v"}); return err },
			[]string{"idem.result=replayed", "idem.replayed=true"}},
		{"other request", func() error { _, err := client.Do(withKey("k"), &testv1.DoRequest{Value: "w"}); return err },
			[]string{"idem.result=reused", "grpc.code=FailedPrecondition"}},
		{"no side effects", func() error { _, err := client.Read(withKey("r"), &testv1.ReadRequest{Value: "v"}); return err },
			[]string{"idem.result=passthrough"}},
	} {
		_ = c.call()
		lines := log.finished()
		if len(lines) != 1 {
			t.Fatalf("%s: %d finished-call lines, want 1: %q", c.name, len(lines), lines)
		}
		for _, w := range c.want {
			if !strings.Contains(lines[0], w) {
				t.Errorf("%s: finished-call line lacks %s: %s", c.name, w, lines[0])
			}
		}
		if strings.Count(lines[0], "idem.result=") != 1 {
			t.Errorf("%s: want one idem.result field: %s", c.name, lines[0])
		}
	}
}

// TestServiceConfigRetryWaitsForThePushback: a duplicate that finds its key
// in use is answered ABORTED with the grpc-retry-pushback-ms trailer, so
// grpc-go's own retry policy waits the server's delay (100 ms) instead of
// its configured backoff (an hour, longer than the test's deadline), and its
// retry gets the first call's recorded response.
func TestServiceConfigRetryWaitsForThePushback(t *testing.T) {
	const delay = 100 * time.Millisecond
	svc := &testService{}
	release := make(chan struct{})
	svc.setHook(func(ctx context.Context, _ string) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	inUse := make(chan struct{})
	var once sync.Once
	rec := &hookRecorder{}
	hook := func(ctx context.Context, o idem.Report) {
		rec.hook(ctx, o)
		if o.Result == idem.ResultInUse {
			once.Do(func() { close(inUse) })
		}
	}
	var trailers trailerRecorder
	client := serveChain(t, svc, []grpc.UnaryServerInterceptor{
		trailers.unary,
		interceptor.UnaryServerInterceptor(idemtest.NewEngine(t, memory.New(memory.WithLockTimeout(50*time.Millisecond)),
			idem.WithRetryDelay(delay), idem.WithReportHook(hook))),
	}, grpc.WithDefaultServiceConfig(`{"methodConfig": [{
		"name": [{"service": "idem.test.v1.TestService"}],
		"retryPolicy": {
			"maxAttempts": 5,
			"initialBackoff": "3600s",
			"maxBackoff": "3600s",
			"backoffMultiplier": 1,
			"retryableStatusCodes": ["ABORTED"]
		}
	}]}`))

	first := make(chan error, 1)
	go func() {
		_, err := client.Do(withKeyCtx(deadline(t, 30*time.Second), "k"), &testv1.DoRequest{Value: "v"})
		first <- err
	}()
	// Once the first call holds the key, a duplicate finds it in use.
	idemtest.WaitFor(t, 10*time.Second, func() bool { return svc.count() == 1 })
	second := make(chan error, 1)
	var resp *testv1.DoResponse
	go func() {
		var err error
		resp, err = client.Do(withKeyCtx(deadline(t, 10*time.Second), "k"), &testv1.DoRequest{Value: "v"})
		second <- err
	}()
	<-inUse
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first call: %v", err)
	}
	if err := <-second; err != nil {
		t.Fatalf("duplicate retried by the service config: %v", err)
	}
	if resp.GetExecution() != 1 || svc.count() != 1 {
		t.Errorf("duplicate got execution %d, handler ran %d times; want the first execution replayed", resp.GetExecution(), svc.count())
	}
	var results []idem.Result
	for _, o := range rec.take() {
		results = append(results, o.Result)
	}
	if n := len(results); n < 3 || results[n-1] != idem.ResultReplayed {
		t.Errorf("the server saw %v; want the first call, an in_use attempt or more, then a replay", results)
	}
	want := fmt.Sprint(delay.Milliseconds())
	for _, md := range trailers.aborted() {
		if got := md.Get("grpc-retry-pushback-ms"); len(got) != 1 || got[0] != want {
			t.Errorf("ABORTED answer's %s = %q, want %q", "grpc-retry-pushback-ms", got, want)
		}
	}
}

// trailerRecorder is a server interceptor placed outside idem that keeps
// the trailer of every ABORTED answer.
type trailerRecorder struct {
	mu  sync.Mutex
	mds []metadata.MD
}

func (r *trailerRecorder) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	stream := &trailerStream{ServerTransportStream: grpc.ServerTransportStreamFromContext(ctx)}
	resp, err := handler(grpc.NewContextWithServerTransportStream(ctx, stream), req)
	if status.Code(err) == codes.Aborted {
		r.mu.Lock()
		r.mds = append(r.mds, stream.trailer)
		r.mu.Unlock()
	}
	return resp, err
}

func (r *trailerRecorder) aborted() []metadata.MD {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mds
}

type trailerStream struct {
	grpc.ServerTransportStream
	trailer metadata.MD
}

func (s *trailerStream) SetTrailer(md metadata.MD) error {
	s.trailer = metadata.Join(s.trailer, md)
	return s.ServerTransportStream.SetTrailer(md)
}

// withKeyCtx returns ctx with key in its outgoing metadata.
func withKeyCtx(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, idem.KeyHeader, key)
}
