package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/payments/paymentsvc"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
)

// scenario is one row of the report. To add one, add an entry to
// [scenarios]: a server to call (or none, for the SQL-only yardsticks) and
// the call each client repeats.
type scenario struct {
	name  string
	about string
	// reference is the scenario this one's throughput is divided by.
	reference string
	// server builds the gRPC server the clients call, whose CreatePayment
	// writes with h; nil for a scenario that talks to PostgreSQL directly.
	server func(pool *pgxpool.Pool, h *handler) (*grpc.Server, error)
	// remote scenarios can run against -target.
	remote bool
	// prepare runs once before the warm-up, e.g. to record the keys that
	// replay asks for.
	prepare func(ctx context.Context, e *env) error
	// call is what each client repeats.
	call func(ctx context.Context, e *env) (outcome, error)
}

type outcome string

const (
	executed outcome = "executed"
	replayed outcome = "replayed"
)

// scenarios is the scenario table, in report order.
var scenarios = []*scenario{
	{
		name:      "baseline",
		about:     "CreatePayment without idem: BEGIN, the handler's statements, COMMIT",
		reference: "baseline",
		server:    func(pool *pgxpool.Pool, h *handler) (*grpc.Server, error) { return newPlainServer(pool, h, nil), nil },
		call:      func(ctx context.Context, e *env) (outcome, error) { return e.create(ctx, e.freshKey(), e.seq.Add(1)) },
	},
	{
		name:      "atomic",
		about:     "the handler under idem, fresh keys: claim, the handler's statements and record in one transaction",
		reference: "baseline",
		server:    newAtomicServer,
		remote:    true,
		call:      func(ctx context.Context, e *env) (outcome, error) { return e.create(ctx, e.freshKey(), e.seq.Add(1)) },
	},
	{
		name:      "replay",
		about:     "the handler under idem, keys already recorded: the stored response comes back",
		reference: "baseline",
		server:    newAtomicServer,
		remote:    true,
		prepare:   recordReplayKeys,
		call:      replay,
	},
	{
		name:      "replay-uncounted",
		about:     "replay with the replays' counts off (idem.WithReplayCounts(false)): replay ÷ replay-uncounted is what counting them costs",
		reference: "baseline",
		server: func(pool *pgxpool.Pool, h *handler) (*grpc.Server, error) {
			return newIdemServer(pool, h, idem.WithReplayCounts(false))
		},
		prepare: recordReplayKeys,
		call:    replay,
	},
	{
		name:      "leased",
		about:     "the handler under idem in leased mode, fresh keys: the claim commits, the handler's own BEGIN, statements, COMMIT, the record commits",
		reference: "baseline",
		server:    newLeasedServer,
		call:      func(ctx context.Context, e *env) (outcome, error) { return e.create(ctx, e.freshKey(), e.seq.Add(1)) },
	},
	{
		name:      "storm",
		about:     "the handler under idem, -storm-duplicates concurrent requests per key",
		reference: "baseline",
		server:    newAtomicServer,
		remote:    true,
		call:      storm,
	},
	{
		name:      "optimistic",
		about:     "the handler under idem in optimistic mode, fresh keys: BEGIN, the handler's statements, the record with COMMIT; nothing read first",
		reference: "baseline",
		server:    newOptimisticServer,
		call:      func(ctx context.Context, e *env) (outcome, error) { return e.create(ctx, e.freshKey(), e.seq.Add(1)) },
	},
	{
		name:      "optimistic-replay",
		about:     "optimistic mode, keys already recorded: the handler runs and rolls back, then the stored response comes back",
		reference: "baseline",
		server:    newOptimisticServer,
		prepare:   recordReplayKeys,
		call:      replay,
	},
	{
		name:      "optimistic-storm",
		about:     "optimistic mode, -storm-duplicates concurrent requests per key",
		reference: "baseline",
		server:    newOptimisticServer,
		call:      storm,
	},
	{
		name:      "auto",
		about:     "the handler under idem in auto mode, fresh keys marked as first attempts: claimed as in optimistic mode",
		reference: "baseline",
		server:    newAutoServer,
		call:      func(ctx context.Context, e *env) (outcome, error) { return e.create(ctx, e.freshKey(), e.seq.Add(1)) },
	},
	{
		name:      "auto-replay",
		about:     "auto mode, keys already recorded, marked as retries: claimed as in atomic mode, the stored response comes back",
		reference: "baseline",
		server:    newAutoServer,
		prepare:   recordReplayKeys,
		call:      replay,
	},
	{
		name:      "auto-storm",
		about:     "auto mode, -storm-duplicates concurrent requests per key, every one marked as a first attempt",
		reference: "baseline",
		server:    newAutoServer,
		call:      storm,
	},
	{
		name:      "naive",
		about:     "a textbook interceptor: BEGIN; SET LOCAL lock_timeout; INSERT claim; the handler's statements; UPDATE; COMMIT, one round trip each",
		reference: "baseline",
		server: func(pool *pgxpool.Pool, h *handler) (*grpc.Server, error) {
			return newPlainServer(pool, h, newNaive(pool).intercept), nil
		},
		call: func(ctx context.Context, e *env) (outcome, error) { return e.create(ctx, e.freshKey(), e.seq.Add(1)) },
	},
	{
		name:      "sql-baseline",
		about:     "no gRPC: BEGIN, the handler's statements, COMMIT on a pgx pool",
		reference: "sql-baseline",
		call: func(ctx context.Context, e *env) (outcome, error) {
			i := e.seq.Add(1)
			req := request(i)
			err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
				return e.write(ctx, tx, req, e.freshKey())
			})
			return executed, err
		},
	},
	{
		name:      "sql-atomic",
		about:     "no gRPC: idem's store (claim batch, the handler's statements, record with COMMIT) on a pgx pool",
		reference: "sql-baseline",
		call:      sqlClaim(false),
	},
	{
		name:      "sql-optimistic",
		about:     "no gRPC: idem's store with optimistic claims (BEGIN, the handler's statements, record with COMMIT) on a pgx pool",
		reference: "sql-baseline",
		call:      sqlClaim(true),
	},
	{
		name:      "sql-floor",
		about:     "no gRPC: BEGIN, the handler's statements, then one INSERT of a recorded key row with COMMIT: what the key row alone costs, no claim",
		reference: "sql-baseline",
		call: func(ctx context.Context, e *env) (outcome, error) {
			i := e.seq.Add(1)
			req := request(i)
			key := e.freshKey()
			var id pgtype.UUID
			rand.Read(id.Bytes[:]) // never fails
			id.Valid = true
			// On a connection of its own, not pool.Begin's transaction:
			// the batch's COMMIT ends the transaction without pgx's Tx
			// knowing, and a deferred Rollback of it would send a ROLLBACK
			// round trip that sql-atomic does not pay. As the store's
			// abandon does, roll back only what the connection says is
			// still open.
			conn, err := e.pool.Acquire(ctx)
			if err != nil {
				return "", err
			}
			defer conn.Release()
			tx, err := conn.Begin(ctx)
			if err != nil {
				return "", err
			}
			defer func() {
				if conn.Conn().PgConn().TxStatus() != 'I' {
					_ = tx.Rollback(context.WithoutCancel(ctx))
				}
			}()
			if err := e.write(ctx, tx, req, key); err != nil {
				return "", err
			}
			b := &pgx.Batch{}
			b.Queue(insertKeyRow, id, tenant, createPayment, key, e.fingerprint, e.response)
			b.Queue("COMMIT")
			return executed, tx.SendBatch(ctx, b).Close()
		},
	},
}

// recordReplayKeys records the keys that replay asks for.
func recordReplayKeys(ctx context.Context, e *env) error {
	for i := range replayKeys {
		if _, err := e.create(ctx, e.replayKey(int64(i)), int64(i)); err != nil {
			return fmt.Errorf("recording replay key %d: %w", i, err)
		}
	}
	return nil
}

// replay sends a key recordReplayKeys recorded, as a retry.
func replay(ctx context.Context, e *env) (outcome, error) {
	i := e.seq.Add(1) % replayKeys
	return e.send(ctx, e.replayKey(i), i, retryAttempt)
}

// mixed returns the call of a workload where percent of the calls are
// retries of a key recordReplayKeys recorded, spread evenly (the nth call
// is a retry when n×percent/100 passes a whole number), and the others
// first attempts with fresh keys.
func mixed(percent int64) func(context.Context, *env) (outcome, error) {
	return func(ctx context.Context, e *env) (outcome, error) {
		if n := e.calls.Add(1); n*percent/100 != (n-1)*percent/100 {
			i := e.seq.Add(1) % replayKeys
			return e.send(ctx, e.replayKey(i), i, retryAttempt)
		}
		return e.create(ctx, e.freshKey(), e.seq.Add(1))
	}
}

// retryShares are the shares of retries, in percent, of the mixed-*
// scenarios.
var retryShares = []int64{10, 25, 50}

// The mixed-* scenarios: each claim mode at each share of retries.
func init() {
	servers := []struct {
		mode   string
		server func(pool *pgxpool.Pool, h *handler) (*grpc.Server, error)
	}{
		{"atomic", newAtomicServer},
		{"optimistic", newOptimisticServer},
		{"auto", newAutoServer},
	}
	for _, s := range servers {
		for _, p := range retryShares {
			scenarios = append(scenarios, &scenario{
				name:      fmt.Sprintf("mixed-%s-%d", s.mode, p),
				about:     fmt.Sprintf("CreatePayment in %s mode, %d %% of the calls retries of recorded keys (marked as retries), the others first attempts with fresh keys", s.mode, p),
				reference: "baseline",
				server:    s.server,
				prepare:   recordReplayKeys,
				call:      mixed(p),
			})
		}
	}
}

// storm sends each key -storm-duplicates times, from as many clients at
// once.
func storm(ctx context.Context, e *env) (outcome, error) {
	i := e.seq.Add(1) / int64(e.cfg.StormDuplicates)
	return e.create(ctx, fmt.Sprintf("%s-storm-%d", e.prefix, i), i)
}

// insertKeyRow is the sql-floor scenario's write of a key row, in the
// shape idem's record gives it.
const insertKeyRow = `INSERT INTO idempotency_keys
    (id, tenant, method, key, request_hash, status, response_code, response, expires_at)
VALUES ($1, $2, $3, $4, $5, 'recorded', 0, $6, now() + interval '24 hours')`

// replayKeys is how many recorded keys the replay scenario cycles through.
const replayKeys = 1024

const (
	tenant        = "acme"
	createPayment = "/payments.v1.PaymentService/CreatePayment"
)

func defaultScenarios() []string {
	var names []string
	for _, s := range scenarios {
		names = append(names, s.name)
	}
	return names
}

func lookupScenario(name string) (*scenario, error) {
	for _, s := range scenarios {
		if s.name == name {
			return s, nil
		}
	}
	return nil, fmt.Errorf("unknown scenario %q (have %v)", name, defaultScenarios())
}

// env is what a scenario's clients share during one run.
type env struct {
	cfg     config
	handler *handler
	pool    *pgxpool.Pool // nil with -target
	client  paymentsv1.PaymentServiceClient
	store   *postgres.Store
	prefix  string // makes keys unique to this run
	seq     atomic.Int64
	calls   atomic.Int64 // counts the mixed scenarios' calls

	// counters count what pool sends; dsn and dbName are its database's.
	counters *counters
	dsn      string
	dbName   string

	// For sql-atomic: the fingerprint and recorded body idem would compute.
	fingerprint []byte
	response    []byte
}

func newEnv(cfg config, h *handler, prefix string) *env {
	resp := &paymentsv1.CreatePaymentResponse{Payment: &paymentsv1.Payment{
		Id:          "0b7ba2a5-5b6e-4a8f-9d1c-3f1a2b4c5d6e",
		CustomerId:  "cus_000000000001",
		AmountCents: 1001,
		Currency:    "EUR",
		CreateTime:  timestamppb.New(time.Unix(1767225600, 0)),
	}}
	body, _ := proto.MarshalOptions{Deterministic: true}.Marshal(resp)
	sum := sha256.Sum256(body)
	return &env{
		cfg:         cfg,
		handler:     h,
		prefix:      prefix,
		fingerprint: append([]byte{1}, sum[:]...),
		response:    body,
	}
}

func (e *env) freshKey() string { return fmt.Sprintf("%s-%d", e.prefix, e.seq.Add(1)) }

func (e *env) replayKey(i int64) string { return fmt.Sprintf("%s-replay-%d", e.prefix, i) }

// sqlClaim calls idem's store without gRPC: it claims a fresh key, in
// optimistic mode or atomic, runs the handler's statements in the claim's
// transaction and records the response.
func sqlClaim(optimistic bool) func(context.Context, *env) (outcome, error) {
	return func(ctx context.Context, e *env) (outcome, error) {
		req := request(e.seq.Add(1))
		key := e.freshKey()
		claim, err := e.store.Claim(ctx, store.Scope{Tenant: tenant, Method: createPayment, Key: key}, store.ClaimRequest{Fingerprint: e.fingerprint, Optimistic: optimistic})
		if err != nil {
			return "", err
		}
		if claim.Txn == nil {
			return "", fmt.Errorf("fresh key %s was taken", key)
		}
		defer func() { _ = claim.Txn.Release(ctx) }()
		tx, _ := postgres.TxFromContext(claim.Txn.Context(ctx))
		if err := e.write(ctx, tx, req, key); err != nil {
			return "", err
		}
		return executed, claim.Txn.Record(ctx, store.Outcome{Body: e.response})
	}
}

// request returns the request sent with key number i: the same i, the same
// request, so that retries of a key match its fingerprint.
func request(i int64) *paymentsv1.CreatePaymentRequest {
	return &paymentsv1.CreatePaymentRequest{
		CustomerId:  fmt.Sprintf("cus_%012d", i%customers),
		AmountCents: 1000 + i%1000,
		Currency:    "EUR",
		Note:        "order " + fmt.Sprint(i),
		TraceId:     "4bf92f3577b34da6a3ce929d0e0e4736",
	}
}

// create calls CreatePayment with key and request(i), as a first attempt.
func (e *env) create(ctx context.Context, key string, i int64) (outcome, error) {
	return e.send(ctx, key, i, firstAttempt)
}

// The attempt numbers the clients send in idem's attempt header
// (idem.AttemptHeader), as idem's own clients do: a fresh key is a first
// attempt, a recorded key's call a retry. Every scenario sends it, so that
// every request carries the same bytes; only MODE_AUTO reads it.
const (
	firstAttempt = "1"
	retryAttempt = "2"
)

// send calls CreatePayment with key and request(i), marked as the attempt
// given.
func (e *env) send(ctx context.Context, key string, i int64, attempt string) (outcome, error) {
	ctx = metadata.AppendToOutgoingContext(ctx,
		paymentsvc.TenantHeader, tenant,
		idem.KeyHeader, key,
		idem.AttemptHeader, attempt)
	var header metadata.MD
	if _, err := e.client.CreatePayment(ctx, request(i), grpc.Header(&header)); err != nil {
		return "", err
	}
	if v := header.Get(idem.ReplayedHeader); len(v) == 1 && v[0] == "true" {
		return replayed, nil
	}
	return executed, nil
}

// write runs the handler's statements on tx, for the SQL-only scenarios.
func (e *env) write(ctx context.Context, tx pgx.Tx, req *paymentsv1.CreatePaymentRequest, key string) error {
	_, _, err := e.handler.write(ctx, tx, tenant, key, req)
	return err
}

// percentile returns the p-th percentile of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p / 100 * float64(len(sorted)))
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return sorted[i]
}

func sortDurations(d []time.Duration) {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
}
