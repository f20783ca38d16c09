package chaos

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/payments/paymentsvc"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store/postgres"
)

// countingService is PaymentService behind a downstream stub's ledger: it
// counts every execution of CreatePayment, including those whose writes
// roll back, and holds each for a while, as a call to a slow dependency
// would, so that duplicates arrive while it runs.
type countingService struct {
	*paymentsvc.Service

	mu         sync.Mutex
	executions map[string]int // by idempotency key
	hold       func(key string)
}

func (s *countingService) CreatePayment(ctx context.Context, req *paymentsv1.CreatePaymentRequest) (*paymentsv1.CreatePaymentResponse, error) {
	key, _ := idem.KeyFromContext(ctx)
	s.mu.Lock()
	s.executions[key]++
	hold := s.hold
	s.mu.Unlock()
	if hold != nil {
		hold(key)
	}
	return s.Service.CreatePayment(ctx, req)
}

// setHold sets what runs before each execution's writes.
func (s *countingService) setHold(hold func(key string)) {
	s.mu.Lock()
	s.hold = hold
	s.mu.Unlock()
}

// executionsOf returns how often key was executed.
func (s *countingService) executionsOf(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.executions[key]
}

// inProcess is a payments server in this process, on a loopback port.
type inProcess struct {
	addr string
	pool *pgxpool.Pool
	svc  *countingService
}

// startInProcess serves PaymentService as paymentsvc.NewServer does, with
// the counting stub, on a fresh database whose pool has poolSize
// connections.
func startInProcess(t *testing.T, poolSize int32, storeOpts ...postgres.Option) *inProcess {
	t.Helper()
	return startInProcessOn(t, pgtest.NewDatabase(t), poolSize, storeOpts...)
}

// startInProcessOn is startInProcess on the database dsn.
func startInProcessOn(t *testing.T, dsn string, poolSize int32, storeOpts ...postgres.Option) *inProcess {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = poolSize
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := paymentsvc.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	svc := &countingService{Service: paymentsvc.New(pool), executions: make(map[string]int)}
	engine, err := idem.New(postgres.New(pool, storeOpts...), idem.WithTenant(paymentsvc.TenantOf))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		recovery.UnaryServerInterceptor(recovery.WithRecoveryHandler(func(any) error {
			return status.Error(codes.Internal, "internal error")
		})),
		interceptor.UnaryServerInterceptor(engine),
	))
	paymentsv1.RegisterPaymentServiceServer(srv, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return &inProcess{addr: lis.Addr().String(), pool: pool, svc: svc}
}

// TestDuplicateStorm sends 20 rounds of 500 concurrent identical
// CreatePayment calls, each round under a key of its own, to a server whose
// pool has 4 connections and whose lock timeout is 500 ms. Each round
// executes once. Every other call gets the replay, or ABORTED with
// RetryInfo while the execution runs, or UNAVAILABLE when no connection
// came free in time; none waits much longer than the lock timeout.
//
// The execution holds the key for 50 ms in half the rounds, so duplicates
// wait for it and replay; for twice the lock timeout in a quarter, so the
// first duplicates give up; and in the other quarter it is stuck until every
// duplicate has been answered, as a call to a hung dependency would be:
// duplicates must not queue for the pool's connections behind it, and a
// call under another key must not either.
func TestDuplicateStorm(t *testing.T) {
	s := startInProcess(t, stormPoolSize, postgres.WithLockTimeout(stormLockTimeout))
	duplicateStorm(t, s, 20)
}

// The pool size and lock timeout of the storm's server.
const (
	stormPoolSize    = 4
	stormLockTimeout = 500 * time.Millisecond
)

// duplicateStorm sends the storm's rounds to s, a server with a pool of
// stormPoolSize connections and a lock timeout of stormLockTimeout; the
// kinds of round take turns, so any multiple of four rounds has as many of
// each.
func duplicateStorm(t *testing.T, s *inProcess, rounds int) {
	const (
		perRound    = 500
		lockTimeout = stormLockTimeout
		// margin covers scheduling on a busy machine and the queue for
		// the pool's connections while replays drain it.
		margin = 8 * time.Second
		// stuckLimit releases a stuck execution whose duplicates are not
		// all answered by then, so that a failing run still ends.
		stuckLimit = lockTimeout + margin + 5*time.Second
	)
	conns := clients(t, s.addr, 8)

	var slowest time.Duration
	for round := range rounds {
		kind := []string{"quick", "slow", "quick", "stuck"}[round%4]
		key := fmt.Sprintf("storm-%d", round)
		var returned atomic.Int64
		entered, release := make(chan struct{}), make(chan struct{})
		switch kind {
		case "quick":
			s.svc.setHold(func(string) { time.Sleep(50 * time.Millisecond) })
		case "slow":
			s.svc.setHold(func(string) { time.Sleep(2 * lockTimeout) })
		case "stuck":
			s.svc.setHold(func(k string) {
				if k == key {
					close(entered)
					<-release
				}
			})
			go func() {
				deadline := time.After(stuckLimit)
				for returned.Load() < perRound-1 {
					select {
					case <-deadline:
						close(release)
						return
					case <-time.After(10 * time.Millisecond):
					}
				}
				close(release)
			}()
		}
		req := &paymentsv1.CreatePaymentRequest{CustomerId: "cus_storm", AmountCents: int64(1000 + round), Currency: "EUR"}

		results := make([]stormResult, perRound)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range perRound {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				results[i] = stormCall(conns[i%len(conns)], "acme", key, req)
				returned.Add(1)
			}()
		}
		close(start)
		if kind == "stuck" {
			// A call under another key, while the stuck execution and its
			// duplicates hold the pool.
			<-entered
			other := stormCall(conns[0], "acme", key+"-other", req)
			if !other.acceptable() || other.took > lockTimeout+margin {
				t.Errorf("round %d: a call under another key during the storm: %v after %v", round, other.err, other.took)
			}
		}
		wg.Wait()

		var ids []string
		fresh, replays, aborted, unavailable := 0, 0, 0, 0
		var roundSlowest time.Duration
		for _, r := range results {
			roundSlowest = max(roundSlowest, r.took)
			switch {
			case r.code == codes.OK && !r.replayed:
				fresh++
				ids = append(ids, r.id)
			case r.code == codes.OK:
				replays++
				ids = append(ids, r.id)
			case r.acceptable() && r.code == codes.Aborted:
				aborted++
			case r.acceptable() && r.code == codes.Unavailable:
				unavailable++
			default:
				t.Fatalf("round %d: answer %v; want the payment, its replay, ABORTED with RetryInfo or UNAVAILABLE", round, r.err)
			}
		}
		slices.Sort(ids)
		if ids = slices.Compact(ids); len(ids) > 1 || fresh > 1 {
			t.Fatalf("round %d: %d fresh answers and payments %v; want one payment", round, fresh, ids)
		}
		// The execution itself takes as long as it holds the key; every
		// other call must be answered within the bound.
		var dupSlowest time.Duration
		for _, r := range results {
			if r.code != codes.OK || r.replayed {
				dupSlowest = max(dupSlowest, r.took)
			}
		}
		bound := lockTimeout + margin
		if kind != "stuck" {
			bound += 2 * lockTimeout // replays wait for the execution's COMMIT
		}
		if dupSlowest > bound {
			t.Errorf("round %d (%s): a duplicate took %v; lock timeout %v", round, kind, dupSlowest, lockTimeout)
		}
		slowest = max(slowest, dupSlowest)
		if kind == "stuck" && fresh == 0 {
			// The execution was released after its duplicates; it
			// commits, and a retry gets its payment.
			r := stormCall(conns[0], "acme", key, req)
			if r.code != codes.OK || !r.replayed {
				t.Fatalf("round %d: retry after the stuck execution: %v (replayed %v)", round, r.err, r.replayed)
			}
		}
		// A replay answers before its transaction is rolled back, which
		// returns the connection to the pool right after.
		if n := acquiredAfter(s.pool, time.Second); n != 0 {
			t.Errorf("round %d: %d connections still acquired a second after every call returned", round, n)
		}
		if n := s.svc.executionsOf(key); n != 1 {
			t.Errorf("round %d: %d executions, want 1", round, n)
		}
		t.Logf("round %d (%s): %d fresh, %d replays, %d aborted, %d unavailable; slowest duplicate %v",
			round, kind, fresh, replays, aborted, unavailable, dupSlowest.Round(time.Millisecond))
	}

	var payments, keys int
	err := s.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM payments WHERE request_key LIKE 'storm-%' AND request_key NOT LIKE '%-other'),
		(SELECT count(*) FROM idempotency_keys WHERE key LIKE 'storm-%' AND key NOT LIKE '%-other' AND status = 'recorded' AND response_code = 0)`).Scan(&payments, &keys)
	if err != nil {
		t.Fatal(err)
	}
	if payments != rounds || keys != rounds {
		t.Errorf("%d payments and %d completed keys, want %d of each", payments, keys, rounds)
	}
	t.Logf("slowest duplicate of all: %v", slowest.Round(time.Millisecond))
}

// stormResult is one call's answer.
type stormResult struct {
	code     codes.Code
	id       string
	replayed bool
	// retry reports ABORTED with RetryInfo and the reason
	// IDEMPOTENCY_KEY_IN_USE.
	retry bool
	took  time.Duration
	err   error
}

// acceptable reports whether the answer is one a duplicate may get.
func (r stormResult) acceptable() bool {
	switch r.code {
	case codes.OK, codes.Unavailable:
		return true
	case codes.Aborted:
		return r.retry
	}
	return false
}

func stormCall(conn *grpc.ClientConn, tenant, key string, req *paymentsv1.CreatePaymentRequest) stormResult {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, idem.KeyHeader, key, paymentsvc.TenantHeader, tenant)
	var header metadata.MD
	began := time.Now()
	resp, err := paymentsv1.NewPaymentServiceClient(conn).CreatePayment(ctx, req, grpc.Header(&header))
	st := status.Convert(err)
	return stormResult{
		code:     st.Code(),
		id:       resp.GetPayment().GetId(),
		replayed: slices.Contains(header.Get(idem.ReplayedHeader), "true"),
		retry:    retryDelay(st) > 0 && hasKeyInUse(st),
		took:     time.Since(began),
		err:      err,
	}
}

// hasKeyInUse reports whether st says the key is held by a call in flight.
func hasKeyInUse(st *status.Status) bool {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason() == idem.ReasonKeyInUse && info.GetDomain() == idem.Domain
		}
	}
	return false
}

// acquiredAfter returns how many connections of pool are acquired, waiting
// up to d for them to be released.
func acquiredAfter(pool *pgxpool.Pool, d time.Duration) int32 {
	deadline := time.Now().Add(d)
	for {
		n := pool.Stat().AcquiredConns()
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}
