package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/payments/paymentsvc"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store/postgres"
)

// run measures cfg.Scenarios for cfg.Rounds rounds at each of cfg.RTTs,
// and returns a report per round-trip time. Progress goes to log.
func run(ctx context.Context, cfg config, log io.Writer) ([]*report, error) {
	if cfg.Clients < 1 || cfg.Rounds < 1 || cfg.Duration <= 0 || cfg.StormDuplicates < 1 || cfg.PoolSize < 1 {
		return nil, errors.New("-clients, -pool, -rounds, -storm-duplicates and -duration must be positive")
	}
	if len(cfg.RTTs) == 0 {
		cfg.RTTs = []time.Duration{0}
	}
	delayed := slices.ContainsFunc(cfg.RTTs, func(d time.Duration) bool { return d > 0 })
	if delayed && cfg.Target != "" {
		return nil, errors.New("-pg-rtt delays the scenarios' own connections to PostgreSQL; a -target server has its own")
	}
	h, err := lookupHandler(cfg.Handler)
	if err != nil {
		return nil, err
	}
	if cfg.Target != "" && h != handlers[0] {
		return nil, fmt.Errorf("-handler %s: a -target server runs paymentsvc's handler, %s", h.name, handlers[0].name)
	}
	var list []*scenario
	for _, name := range cfg.Scenarios {
		s, err := lookupScenario(name)
		if err != nil {
			return nil, err
		}
		if cfg.Target != "" && !s.remote {
			fmt.Fprintf(log, "skipping %s: it cannot run against -target\n", name)
			continue
		}
		list = append(list, s)
	}
	if len(list) == 0 {
		return nil, errors.New("no scenario to run")
	}
	if cfg.ProfileDir != "" {
		if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
			return nil, err
		}
	}

	var pg *pgtest.Server
	if cfg.Target == "" {
		if cfg.DatabaseURL != "" {
			if err := os.Setenv("DATABASE_URL", cfg.DatabaseURL); err != nil {
				return nil, err
			}
		}
		var err error
		if pg, err = pgtest.Start(ctx); err != nil {
			return nil, err
		}
		defer pg.Close()
	}
	var pgAddr string
	if delayed {
		var err error
		if pgAddr, err = pgTCPAddr(ctx, pg.ConnString(), cfg.PGAddr); err != nil {
			return nil, err
		}
	}
	m := describeMachine(ctx, pg)

	var reps []*report
	for _, rtt := range cfg.RTTs {
		prefix := ""
		if len(cfg.RTTs) > 1 {
			prefix = rttLabel(rtt) + ": "
		}
		rep, err := runAt(ctx, cfg, h, pg, list, rtt, pgAddr, m, log, prefix)
		if err != nil {
			return nil, err
		}
		reps = append(reps, rep)
	}
	return reps, nil
}

// runAt runs every round at round-trip time rtt: through a delay proxy to
// pgAddr when rtt > 0.
func runAt(ctx context.Context, cfg config, h *handler, pg *pgtest.Server, list []*scenario, rtt time.Duration, pgAddr string, m machine, log io.Writer, prefix string) (*report, error) {
	rep := &report{Config: cfg.forReport(), Machine: m}
	rep.Config.PGRTT = rtt.String()
	var proxy *delayProxy
	if rtt > 0 {
		var err error
		if proxy, err = newDelayProxy(pgAddr, rtt); err != nil {
			return nil, err
		}
		defer func() { _ = proxy.Close() }()
		rep.Config.PGAddr = pgAddr
	}
	if pg != nil {
		cc, err := pgx.ParseConfig(pg.ConnString())
		if err != nil {
			return nil, err
		}
		if proxy != nil {
			throughProxy(&cc.Config, proxy.addr())
		}
		ping, err := pingP50(ctx, cc)
		if err != nil {
			return nil, fmt.Errorf("ping PostgreSQL at round-trip time %v: %w", rtt, err)
		}
		rep.PingP50ms = ptr(ms(ping))
		fmt.Fprintf(log, "%san empty query takes %.3f ms (p50)\n", prefix, ms(ping))
	}

	var results []*roundResult
	for round := range cfg.Rounds {
		for i := range list {
			s := list[(i+round)%len(list)]
			fmt.Fprintf(log, "%sround %d/%d: %s ", prefix, round+1, cfg.Rounds, s.name)
			r, err := runOnce(ctx, cfg, h, pg, proxy, rtt, s, round)
			if err != nil {
				fmt.Fprintln(log)
				return nil, fmt.Errorf("%s: %w", s.name, err)
			}
			fmt.Fprintf(log, "%.0f req/s, %d errors\n", r.throughput(), r.Errors)
			results = append(results, r)
		}
	}
	rep.summarize(list, results)
	return rep, nil
}

// roundResult is one scenario's measurement in one round.
type roundResult struct {
	Scenario   string           `json:"scenario"`
	Round      int              `json:"round"`
	Requests   int64            `json:"requests"`
	Errors     int64            `json:"errors"`
	FirstError string           `json:"first_error,omitempty"`
	Seconds    float64          `json:"seconds"`
	Outcomes   map[string]int64 `json:"outcomes"`
	Counts     *counts          `json:"counts,omitempty"`
	Waits      map[string]int64 `json:"pg_waits,omitempty"`
	CPU        *cpuUse          `json:"cpu_seconds,omitempty"`
	// Tables covers the whole run of the database, warm-up included.
	Tables map[string]tableStat `json:"tables,omitempty"`

	latencies []time.Duration
}

// cpuUse is the CPU time a measurement took: in this process (gRPC clients
// and server, pgx, idem) and on the whole machine (that plus PostgreSQL plus
// anything else running).
type cpuUse struct {
	Process float64 `json:"process"`
	Machine float64 `json:"machine"`
}

func (r *roundResult) throughput() float64 { return float64(r.Requests) / r.Seconds }

func randomPrefix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// runOnce runs s once with handler h: a fresh database and pool, a
// server, preparation, warm-up, and the measurement. The pool connects
// through proxy, when there is one, which delays round trips by rtt.
func runOnce(ctx context.Context, cfg config, h *handler, pg *pgtest.Server, proxy *delayProxy, rtt time.Duration, s *scenario, round int) (*roundResult, error) {
	return runOn(ctx, cfg, h, pg, "", proxy, rtt, s, round)
}

// runOn is runOnce on the database dsn, which already holds the schemas,
// rather than a fresh one: for -growth, whose database keeps its key rows
// from one scenario to the next. An empty dsn is a fresh database.
func runOn(ctx context.Context, cfg config, h *handler, pg *pgtest.Server, dsn string, proxy *delayProxy, rtt time.Duration, s *scenario, round int) (*roundResult, error) {
	e, closeEnv, err := openEnv(ctx, cfg, h, pg, dsn, proxy, s)
	if err != nil {
		return nil, err
	}
	defer closeEnv()
	ctrs := e.counters

	if s.prepare != nil {
		if err := s.prepare(ctx, e); err != nil {
			return nil, err
		}
	}
	if cfg.Warmup > 0 {
		if _, err := load(ctx, cfg, s, e, cfg.Warmup); err != nil {
			return nil, err
		}
	}

	var sampler *waitSampler
	if cfg.SampleWaits && pg != nil {
		var err error
		if sampler, err = startWaitSampler(ctx, e.pool.Config().ConnConfig.Copy(), e.dbName); err != nil {
			return nil, err
		}
	}
	if cfg.ProfileDir != "" && round == 0 {
		name := s.name + ".cpu.pprof"
		if rtt > 0 {
			name = s.name + ".rtt-" + strings.ReplaceAll(rtt.String(), "µ", "u") + ".cpu.pprof"
		}
		f, err := os.Create(filepath.Join(cfg.ProfileDir, name))
		if err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
			return nil, err
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}
	if ctrs != nil {
		quiesce(e.pool)
		ctrs.reset()
	}
	cpu0 := sampleCPU()
	r, err := load(ctx, cfg, s, e, cfg.Duration)
	if err != nil {
		return nil, err
	}
	if cpu1 := sampleCPU(); cpu0.ok && cpu1.ok {
		r.CPU = &cpuUse{
			Process: (cpu1.self - cpu0.self).Seconds(),
			Machine: (cpu1.machine - cpu0.machine).Seconds(),
		}
	}
	if ctrs != nil {
		quiesce(e.pool)
		c := ctrs.snapshot()
		r.Counts = &c
	}
	if sampler != nil {
		r.Waits = sampler.stop()
	}
	r.Round = round
	if r.Requests == 0 {
		return nil, fmt.Errorf("no request succeeded: %s", r.FirstError)
	}
	if e.pool != nil {
		// Backends report their table statistics when they exit.
		e.pool.Close()
		r.Tables = tableStats(ctx, e.dsn)
	}
	return r, nil
}

// openEnv opens what one run of s with handler h needs: unless pg is nil
// (-target), a fresh database with paymentsvc's schema, naive's and h's
// (or, when dsn is not empty, that database, whose schemas are made
// already), and a pool of cfg.PoolSize connections, all open, that counts
// into e.counters and connects through proxy when there is one; and, when
// s calls a server, that server on 127.0.0.1:0 (or cfg.Target) and a
// client of it. closeEnv undoes it all.
func openEnv(ctx context.Context, cfg config, h *handler, pg *pgtest.Server, dsn string, proxy *delayProxy, s *scenario) (e *env, closeEnv func(), err error) {
	e = newEnv(cfg, h, randomPrefix())
	var closers []func()
	closeEnv = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			closeEnv()
		}
	}()

	if pg != nil {
		fresh := dsn == ""
		if fresh {
			var drop func(context.Context) error
			if dsn, drop, err = pg.CreateDatabase(ctx); err != nil {
				return nil, nil, err
			}
			closers = append(closers, func() { _ = drop(context.WithoutCancel(ctx)) })
		}
		pcfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return nil, nil, err
		}
		e.dsn, e.dbName = dsn, pcfg.ConnConfig.Database
		if proxy != nil {
			throughProxy(&pcfg.ConnConfig.Config, proxy.addr())
		}
		pcfg.MaxConns = int32(cfg.PoolSize)
		pcfg.MinConns = int32(cfg.PoolSize)
		e.counters = &counters{}
		e.counters.instrument(pcfg)
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, pool.Close)
		if fresh {
			if err := makeSchemas(ctx, pool, h); err != nil {
				return nil, nil, err
			}
		}
		if err := openAll(ctx, pool, cfg.PoolSize); err != nil {
			return nil, nil, err
		}
		e.pool = pool
		e.store = postgres.New(pool)
	}

	if s.server != nil {
		target := cfg.Target
		if target == "" {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return nil, nil, err
			}
			srv, err := s.server(e.pool, h)
			if err != nil {
				_ = lis.Close()
				return nil, nil, err
			}
			go func() { _ = srv.Serve(lis) }()
			closers = append(closers, srv.Stop)
			target = lis.Addr().String()
		}
		conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, func() { _ = conn.Close() })
		e.client = paymentsv1.NewPaymentServiceClient(conn)
	}
	return e, closeEnv, nil
}

// makeSchemas creates in pool's database what the scenarios need besides
// idem's table: paymentsvc's schema, naive's and h's.
func makeSchemas(ctx context.Context, pool *pgxpool.Pool, h *handler) error {
	if err := paymentsvc.Migrate(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, naiveSchema); err != nil {
		return err
	}
	if h.schema != "" {
		if _, err := pool.Exec(ctx, h.schema); err != nil {
			return fmt.Errorf("the %s handler's schema: %w", h.name, err)
		}
	}
	return nil
}

// quiesce waits, for at most a few seconds, until no connection of pool is
// in use: a replay answers before its transaction is rolled back, and the
// rollback of a request counted in one window must not be counted in the
// next, nor missed.
func quiesce(pool *pgxpool.Pool) {
	for deadline := time.Now().Add(5 * time.Second); pool.Stat().AcquiredConns() > 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}

// tableStat is what pg_stat_user_tables says about one table after a
// scenario: in particular how many updates were HOT (no new index entries).
type tableStat struct {
	Inserts    int64 `json:"inserts"`
	Updates    int64 `json:"updates"`
	HOTUpdates int64 `json:"hot_updates"`
	Bytes      int64 `json:"bytes"`
}

func tableStats(ctx context.Context, dsn string) map[string]tableStat {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	for range 50 {
		var others int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&others)
		if err != nil || others == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	rows, err := conn.Query(ctx, `SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, pg_total_relation_size(relid)
FROM pg_stat_user_tables WHERE n_tup_ins > 0`)
	if err != nil {
		return nil
	}
	out := map[string]tableStat{}
	for rows.Next() {
		var name string
		var t tableStat
		if rows.Scan(&name, &t.Inserts, &t.Updates, &t.HOTUpdates, &t.Bytes) == nil {
			out[name] = t
		}
	}
	return out
}

// openAll opens the pool's n connections, so that none is opened while the
// scenario is measured.
func openAll(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

// load runs cfg.Clients clients that repeat s.call for d, and waits for
// every call to end, so that the database counters cover whole calls only.
func load(ctx context.Context, cfg config, s *scenario, e *env, d time.Duration) (*roundResult, error) {
	r := &roundResult{Scenario: s.name, Outcomes: map[string]int64{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for range cfg.Clients {
		wg.Go(func() {
			lat := make([]time.Duration, 0, 4096)
			outcomes := map[string]int64{}
			var errs int64
			var firstErr error
			for ctx.Err() == nil {
				t0 := time.Now()
				if !t0.Before(deadline) {
					break
				}
				o, err := s.call(ctx, e)
				if err != nil {
					if ctx.Err() != nil {
						break
					}
					errs++
					if firstErr == nil {
						firstErr = err
					}
					continue
				}
				lat = append(lat, time.Since(t0))
				outcomes[string(o)]++
			}
			mu.Lock()
			defer mu.Unlock()
			r.latencies = append(r.latencies, lat...)
			r.Requests += int64(len(lat))
			r.Errors += errs
			if firstErr != nil && r.FirstError == "" {
				r.FirstError = firstErr.Error()
			}
			for k, v := range outcomes {
				r.Outcomes[k] += v
			}
		})
	}
	wg.Wait()
	r.Seconds = time.Since(start).Seconds()
	return r, ctx.Err()
}

// waitSampler samples pg_stat_activity for one database: how many of its
// client backends were in which state and wait event.
type waitSampler struct {
	cancel context.CancelFunc
	done   chan map[string]int64
}

func startWaitSampler(ctx context.Context, cc *pgx.ConnConfig, db string) (*waitSampler, error) {
	cc.Tracer = nil
	cc.AfterNetConnect = nil
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &waitSampler{cancel: cancel, done: make(chan map[string]int64, 1)}
	go func() {
		defer func() { _ = conn.Close(context.Background()) }()
		hist := map[string]int64{}
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				w.done <- hist
				return
			case <-t.C:
			}
			rows, err := conn.Query(ctx, `SELECT state || ' / ' || coalesce(wait_event_type || ':' || wait_event, 'CPU')
FROM pg_stat_activity
WHERE datname = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()`, db)
			if err != nil {
				continue
			}
			for rows.Next() {
				var k string
				if rows.Scan(&k) == nil {
					hist[k]++
				}
			}
			rows.Close()
		}
	}()
	return w, nil
}

func (w *waitSampler) stop() map[string]int64 {
	w.cancel()
	return <-w.done
}
