package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemkit/idem"
	paymentsv1 "github.com/idemkit/idem/examples/gen/payments/v1"
	"github.com/idemkit/idem/examples/payments/paymentsvc"
	"github.com/idemkit/idem/interceptor"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store/postgres"
)

// soakConfig is what -soak runs: -clients callers of CreatePayment in
// atomic mode for Duration, with keys kept for TTL and a Sweeper deleting
// them once expired, sampled every Sample.
type soakConfig struct {
	Duration      time.Duration
	TTL           time.Duration
	Sample        time.Duration
	SweepInterval time.Duration
	SweepBatch    int
	SweepPause    time.Duration
	// Replays is the share of calls that resend a key the same client
	// recorded before (with the same request), and so are replayed.
	Replays float64
	// Throwaway starts a cluster of PostgreSQL's default settings for the
	// run, whatever server pgtest would find.
	Throwaway bool
	// SharedBuffers is the throwaway cluster's shared_buffers, when set.
	SharedBuffers string
	// VacuumTruncate, when true, resets the key table's vacuum_truncate
	// storage parameter to PostgreSQL's default (on), which migration
	// 0006 turns off: (auto)vacuum then takes the ACCESS EXCLUSIVE lock
	// that truncating the table's empty end needs.
	VacuumTruncate bool
}

func defaultSoakConfig() soakConfig {
	return soakConfig{
		TTL:           time.Minute,
		Sample:        10 * time.Second,
		SweepInterval: 10 * time.Second,
		SweepBatch:    sweepBatchSize,
		SweepPause:    sweepPause,
		Replays:       0.05,
	}
}

// soakReport is a soak run: its settings, the machine, a sample per
// interval, the same per minute, and the figures drawn from them.
type soakReport struct {
	Config   soakReportConfig  `json:"config"`
	Machine  machine           `json:"machine"`
	Settings map[string]string `json:"autovacuum_settings"`
	Summary  soakSummary       `json:"summary"`
	Minutes  []soakMinute      `json:"minutes"`
	Samples  []*soakSample     `json:"samples"`
}

type soakReportConfig struct {
	Command        string  `json:"command"`
	Duration       string  `json:"duration"`
	Clients        int     `json:"clients"`
	PoolSize       int     `json:"pool_size"`
	TTL            string  `json:"ttl"`
	Sample         string  `json:"sample"`
	SweepInterval  string  `json:"sweep_interval"`
	SweepBatch     int     `json:"sweep_batch_size"`
	SweepPause     string  `json:"sweep_pause"`
	Replays        float64 `json:"replay_share"`
	Throwaway      bool    `json:"throwaway_cluster"`
	SharedBuffers  string  `json:"throwaway_shared_buffers,omitempty"`
	VacuumTruncate bool    `json:"vacuum_truncate"`
}

// soakSample is one interval of a soak: what the clients did during it,
// and the key table as it stood at its end.
type soakSample struct {
	// Elapsed is the end of the interval, in seconds since the start.
	Elapsed  float64 `json:"elapsed_s"`
	Seconds  float64 `json:"seconds"`
	Executed int64   `json:"executed"`
	Replayed int64   `json:"replayed"`
	Errors   int64   `json:"errors"`
	// PerSecond counts executed and replayed calls.
	PerSecond float64 `json:"requests_per_second"`
	P50ms     float64 `json:"p50_ms"`
	P99ms     float64 `json:"p99_ms"`
	MaxMs     float64 `json:"max_ms"`
	// Keys is the number of keys executed since the start.
	Keys int64 `json:"keys_total"`

	table
	// Swept is how many rows the sweeper deleted during the interval, in
	// Passes passes (those that ended in it) that took SweepSeconds.
	Swept        int64   `json:"swept"`
	Passes       int     `json:"sweep_passes"`
	SweepSeconds float64 `json:"sweep_seconds"`

	// The machine during the interval, which others may share: the share
	// of all its CPUs that was busy and the share this process used
	// (clients, server, sweeper; PostgreSQL is the rest of the busy
	// share, with anything else running), and the one-minute load
	// average at its end.
	MachineCPU float64 `json:"machine_cpu_share"`
	ProcessCPU float64 `json:"process_cpu_share"`
	Load1      float64 `json:"load_average_1m"`

	latencies []time.Duration
}

// table is the key table at one moment: rows counted, the statistics
// collector's view, and sizes on disk.
type table struct {
	Rows        int64      `json:"rows"`
	Unexpired   int64      `json:"unexpired_rows"`
	LiveTuples  int64      `json:"n_live_tup"`
	DeadTuples  int64      `json:"n_dead_tup"`
	HeapBytes   int64      `json:"heap_bytes"`
	IndexBytes  int64      `json:"index_bytes"`
	TotalBytes  int64      `json:"total_bytes"`
	Autovacuums int64      `json:"autovacuum_count"`
	Autoanalyze int64      `json:"autoanalyze_count"`
	LastVacuum  *time.Time `json:"last_autovacuum,omitempty"`
	// PaymentsBytes is the business table, which nothing deletes from.
	PaymentsBytes int64 `json:"payments_total_bytes"`
}

const sampleTable = `SELECT s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.autoanalyze_count, s.last_autovacuum,
    pg_relation_size(s.relid), pg_indexes_size(s.relid), pg_total_relation_size(s.relid),
    (SELECT count(*) FROM idempotency_keys),
    (SELECT count(*) FROM idempotency_keys WHERE expires_at > now()),
    pg_total_relation_size('payments')
FROM pg_stat_user_tables s WHERE s.relname = 'idempotency_keys'`

func sampleKeyTable(ctx context.Context, conn *pgx.Conn) (table, error) {
	var t table
	err := conn.QueryRow(ctx, sampleTable).Scan(&t.LiveTuples, &t.DeadTuples, &t.Autovacuums, &t.Autoanalyze, &t.LastVacuum,
		&t.HeapBytes, &t.IndexBytes, &t.TotalBytes, &t.Rows, &t.Unexpired, &t.PaymentsBytes)
	return t, err
}

// window collects the calls of one interval; take hands them over and
// starts the next.
type window struct {
	mu        sync.Mutex
	latencies []time.Duration
	executed  int64
	replayed  int64
	errors    int64
	firstErr  error
}

func (w *window) add(d time.Duration, o outcome) {
	w.mu.Lock()
	w.latencies = append(w.latencies, d)
	if o == replayed {
		w.replayed++
	} else {
		w.executed++
	}
	w.mu.Unlock()
}

func (w *window) fail(err error) {
	w.mu.Lock()
	w.errors++
	if w.firstErr == nil {
		w.firstErr = err
	}
	w.mu.Unlock()
}

// take returns the interval's calls as a sample of seconds' length, and
// empties the window.
func (w *window) take(seconds float64) *soakSample {
	w.mu.Lock()
	lat := w.latencies
	s := &soakSample{Seconds: seconds, Executed: w.executed, Replayed: w.replayed, Errors: w.errors}
	w.latencies = make([]time.Duration, 0, cap(lat))
	w.executed, w.replayed, w.errors = 0, 0, 0
	w.mu.Unlock()
	sortDurations(lat)
	s.latencies = lat
	if seconds > 0 {
		s.PerSecond = float64(len(lat)) / seconds
	}
	s.P50ms = ms(percentile(lat, 50))
	s.P99ms = ms(percentile(lat, 99))
	if len(lat) > 0 {
		s.MaxMs = ms(lat[len(lat)-1])
	}
	return s
}

// sweepStats counts what the sweeper did, pass by pass.
type sweepStats struct {
	mu      sync.Mutex
	deleted int64
	passes  int
	busy    time.Duration
	err     error
}

func (s *sweepStats) pass(n int64, d time.Duration, err error) {
	s.mu.Lock()
	s.deleted += n
	s.passes++
	s.busy += d
	if err != nil && s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

func (s *sweepStats) take() (deleted int64, passes int, busy time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	deleted, passes, busy = s.deleted, s.passes, s.busy
	s.deleted, s.passes, s.busy = 0, 0, 0
	return deleted, passes, busy
}

// soakServer is paymentsvc.NewServer's interceptor chain with the store's
// TTL set: recovery, then idem in atomic mode, then PaymentService.
func soakServer(pool *pgxpool.Pool, ttl time.Duration) (*grpc.Server, error) {
	engine, err := idem.New(postgres.New(pool, postgres.WithTTL(ttl)), idem.WithTenant(paymentsvc.TenantOf))
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		recoveryInterceptor(),
		interceptor.UnaryServerInterceptor(engine),
	))
	paymentsv1.RegisterPaymentServiceServer(srv, paymentsvc.New(pool))
	return srv, nil
}

// soakSettings are the server settings that decide whether autovacuum
// keeps up with the sweeper's deletions.
var soakSettings = []string{"autovacuum", "autovacuum_naptime", "autovacuum_vacuum_threshold", "autovacuum_vacuum_scale_factor",
	"autovacuum_vacuum_insert_threshold", "autovacuum_vacuum_insert_scale_factor", "autovacuum_vacuum_cost_limit",
	"autovacuum_vacuum_cost_delay", "vacuum_cost_limit", "shared_buffers", "fsync", "synchronous_commit"}

// runSoak runs a soak and returns its report. Progress goes to log, a line
// per sample.
func runSoak(ctx context.Context, cfg config, log io.Writer) (*soakReport, error) {
	sc := cfg.Soak
	switch {
	case cfg.Clients < 1 || cfg.PoolSize < 1:
		return nil, errors.New("-clients and -pool must be positive")
	case sc.Duration < sc.Sample || sc.Sample <= 0:
		return nil, errors.New("-soak must be at least one -soak-sample, which must be positive")
	case sc.TTL <= 0 || sc.SweepInterval <= 0 || sc.SweepBatch < 1:
		return nil, errors.New("-ttl, -sweep-interval and -sweep-batch must be positive")
	case sc.Replays < 0 || sc.Replays >= 1:
		return nil, errors.New("-soak-replays is a share, from 0 up to but excluding 1")
	case cfg.Target != "":
		return nil, errors.New("-soak samples the key table, so it runs its own server: it cannot use -target")
	case sc.SharedBuffers != "" && !sc.Throwaway:
		return nil, errors.New("-soak-shared-buffers sets the throwaway cluster's shared_buffers: add -soak-throwaway")
	}
	var (
		pg  *pgtest.Server
		err error
	)
	switch {
	case sc.SharedBuffers != "":
		pg, err = pgtest.StartClusterWith(ctx, "shared_buffers = '"+sc.SharedBuffers+"'")
	case sc.Throwaway:
		pg, err = pgtest.StartCluster(ctx)
	default:
		if cfg.DatabaseURL != "" {
			if err := os.Setenv("DATABASE_URL", cfg.DatabaseURL); err != nil {
				return nil, err
			}
		}
		pg, err = pgtest.Start(ctx)
	}
	if err != nil {
		return nil, err
	}
	defer func() { _ = pg.Close() }()
	rep := &soakReport{Config: cfg.soakForReport(), Machine: describeMachine(ctx, pg), Settings: map[string]string{}}

	dsn, drop, err := pg.CreateDatabase(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = drop(context.WithoutCancel(ctx)) }()
	stats, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer func() { _ = stats.Close(context.WithoutCancel(ctx)) }()
	for _, name := range soakSettings {
		var v string
		if err := stats.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err == nil {
			rep.Settings[name] = v
		}
	}
	if rep.Settings["autovacuum"] == "off" {
		fmt.Fprintln(log, "soak: autovacuum is off on this server; -soak-throwaway runs on a cluster of PostgreSQL's defaults")
	}

	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns, pcfg.MinConns = int32(cfg.PoolSize), int32(cfg.PoolSize)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := paymentsvc.Migrate(ctx, pool); err != nil {
		return nil, err
	}
	if sc.VacuumTruncate {
		if _, err := pool.Exec(ctx, "ALTER TABLE idempotency_keys RESET (vacuum_truncate)"); err != nil {
			return nil, err
		}
	}
	// The sweeper has a pool of its own, as a replica's would among many
	// request connections; here it keeps the clients from delaying it.
	scfg := pcfg.Copy()
	scfg.MaxConns, scfg.MinConns = 1, 1
	sweepPool, err := pgxpool.NewWithConfig(ctx, scfg)
	if err != nil {
		return nil, err
	}
	defer sweepPool.Close()

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv, err := soakServer(pool, sc.TTL)
	if err != nil {
		return nil, err
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	e := newEnv(cfg, handlers[0], randomPrefix())
	e.client = paymentsv1.NewPaymentServiceClient(conn)

	intervals := int((sc.Duration + sc.Sample - 1) / sc.Sample)
	start := time.Now()
	deadline := start.Add(time.Duration(intervals) * sc.Sample)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	sweeper := postgres.NewSweeper(sweepPool,
		postgres.WithBatchSize(sc.SweepBatch), postgres.WithPause(sc.SweepPause))
	var swept sweepStats
	var bg sync.WaitGroup
	bg.Go(func() {
		// Sweeper.Run's loop, timing each pass.
		for runCtx.Err() == nil {
			t0 := time.Now()
			n, err := sweeper.Sweep(runCtx)
			if runCtx.Err() != nil {
				swept.pass(n, time.Since(t0), nil)
				return
			}
			swept.pass(n, time.Since(t0), err)
			select {
			case <-runCtx.Done():
			case <-time.After(sc.SweepInterval):
			}
		}
	})

	var w window
	var keys atomic.Int64
	var clients sync.WaitGroup
	for c := range cfg.Clients {
		rng := rand.New(rand.NewPCG(uint64(c), uint64(start.UnixNano())))
		clients.Go(func() {
			last := int64(-1)
			for runCtx.Err() == nil && time.Now().Before(deadline) {
				i := last
				if i < 0 || rng.Float64() >= sc.Replays {
					i = e.seq.Add(1)
				}
				t0 := time.Now()
				o, err := e.create(runCtx, fmt.Sprintf("%s-%d", e.prefix, i), i)
				if err != nil {
					if runCtx.Err() == nil {
						w.fail(err)
					}
					continue
				}
				w.add(time.Since(t0), o)
				if o == executed {
					keys.Add(1)
					last = i
				}
			}
		})
	}

	tick := time.NewTicker(sc.Sample)
	defer tick.Stop()
	prev, cpuPrev := start, sampleCPU()
	var firstErr error
	for n := 1; n <= intervals; n++ {
		select {
		case <-ctx.Done():
			cancel()
			clients.Wait()
			bg.Wait()
			return nil, ctx.Err()
		case now := <-tick.C:
			s := w.take(now.Sub(prev).Seconds())
			prev = now
			s.Elapsed = now.Sub(start).Seconds()
			s.Keys = keys.Load()
			deleted, passes, busy := swept.take()
			s.Swept, s.Passes, s.SweepSeconds = deleted, passes, busy.Seconds()
			if cpu := sampleCPU(); cpu.ok && cpuPrev.ok {
				all := s.Seconds * float64(runtime.NumCPU())
				s.MachineCPU = (cpu.machine - cpuPrev.machine).Seconds() / all
				s.ProcessCPU = (cpu.self - cpuPrev.self).Seconds() / all
				cpuPrev = cpu
			}
			s.Load1 = loadAverage()
			if s.table, err = sampleKeyTable(ctx, stats); err != nil {
				cancel()
				clients.Wait()
				bg.Wait()
				return nil, fmt.Errorf("sampling the key table: %w", err)
			}
			rep.Samples = append(rep.Samples, s)
			fmt.Fprintf(log, "%5.0fs %6.0f req/s p99 %6.1f ms | rows %7d (%7d unexpired) dead %7d | %6.1f MiB | swept %6d | autovacuums %d | errors %d | cpu %3.0f%% (this process %3.0f%%) load %.1f\n",
				s.Elapsed, s.PerSecond, s.P99ms, s.Rows, s.Unexpired, s.DeadTuples, mib(s.TotalBytes), s.Swept, s.Autovacuums, s.Errors, 100*s.MachineCPU, 100*s.ProcessCPU, s.Load1)
		}
	}
	cancel()
	clients.Wait()
	bg.Wait()
	w.mu.Lock()
	firstErr = w.firstErr
	w.mu.Unlock()
	swept.mu.Lock()
	sweepErr := swept.err
	swept.mu.Unlock()
	rep.Minutes = perMinute(rep.Samples)
	rep.Summary = summarizeSoak(rep.Samples, rep.Minutes, sc)
	if firstErr != nil {
		rep.Summary.FirstError = firstErr.Error()
	}
	if sweepErr != nil {
		rep.Summary.SweepError = sweepErr.Error()
	}
	return rep, nil
}

// loadAverage returns the one-minute load average, or 0 where
// /proc/loadavg is missing.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	_, _ = fmt.Sscanf(string(b), "%f", &l)
	return l
}

func (c config) soakForReport() soakReportConfig {
	return soakReportConfig{
		Command:        c.forReport().Command,
		Duration:       c.Soak.Duration.String(),
		Clients:        c.Clients,
		PoolSize:       c.PoolSize,
		TTL:            c.Soak.TTL.String(),
		Sample:         c.Soak.Sample.String(),
		SweepInterval:  c.Soak.SweepInterval.String(),
		SweepBatch:     c.Soak.SweepBatch,
		SweepPause:     c.Soak.SweepPause.String(),
		Replays:        c.Soak.Replays,
		Throwaway:      c.Soak.Throwaway,
		SharedBuffers:  c.Soak.SharedBuffers,
		VacuumTruncate: c.Soak.VacuumTruncate,
	}
}
