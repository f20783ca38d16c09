package chaos

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store/postgres"
)

// haEnv selects TestHA's run: "full" runs every event in both replication
// modes and logs the table of docs/ha.md; anything else runs the smoke
// subset.
const haEnv = "IDEM_HA"

// The load of TestHA: haClients clients, each starting an op at most every
// haPace, retrying each under its key until it has an answer.
const (
	haClients = 8
	haPace    = 25 * time.Millisecond
	// haWarmup is how many answers the clients get before the event, and
	// haAfter how many after the cluster took writes again.
	haWarmup = 400
	haAfter  = 800
	// haAnswerTimeout bounds waiting for those answers.
	haAnswerTimeout = 2 * time.Minute
	// haHousekeeping is the interval of the sweeper's and the finisher's
	// passes during the event, and haSweptTimeout bounds waiting for the
	// sweeper to delete a row after the event.
	haHousekeeping = 200 * time.Millisecond
	haSweptTimeout = 90 * time.Second
)

// haEvent is something an HA manager does, or that happens to its
// cluster, while idem serves.
type haEvent struct {
	name    string
	bouncer bool // the server reaches HAProxy through PgBouncer
	// multiHost: the server reaches the members with a multi-host
	// connection string, not through HAProxy.
	multiHost bool
	// loginRetry is PgBouncer's server_login_retry (0: its default, 15 s).
	loginRetry time.Duration
	// cause makes it happen to c, whose leader is leader and whose member
	// that Patroni would promote is candidate; it returns once the cause
	// is set off (the kill done, patronictl returned).
	cause func(ctx context.Context, c *pgtest.HACluster, leader, candidate string) error
	// recover, if set, undoes the cause once the clients have been served
	// by another member for a while: the killed member restarted, the
	// partition healed.
	recover func(c *pgtest.HACluster, leader string) error
}

var (
	haKill = haEvent{
		name: "kill -9 of the leader",
		cause: func(_ context.Context, c *pgtest.HACluster, leader, _ string) error {
			return c.Kill(leader)
		},
		recover: func(c *pgtest.HACluster, leader string) error { return c.Start(leader) },
	}
	haSwitchover = haEvent{
		name: "patronictl switchover",
		cause: func(ctx context.Context, c *pgtest.HACluster, leader, candidate string) error {
			return c.Switchover(ctx, leader, candidate)
		},
	}
	haFailover = haEvent{
		name: "patronictl failover",
		cause: func(ctx context.Context, c *pgtest.HACluster, _, candidate string) error {
			return c.Failover(ctx, candidate)
		},
	}
	haPartition = haEvent{
		name: "partition of the leader",
		cause: func(_ context.Context, c *pgtest.HACluster, leader, _ string) error {
			return c.Partition(leader)
		},
		recover: func(c *pgtest.HACluster, leader string) error { return c.Heal(leader) },
	}
)

// throughBouncer is ev with the server behind PgBouncer, whose
// server_login_retry is loginRetry (0: its default, 15 s).
func throughBouncer(ev haEvent, loginRetry time.Duration) haEvent {
	retry := "15 s, its default"
	if loginRetry > 0 {
		retry = fmt.Sprint(loginRetry)
	}
	ev.name += ", through PgBouncer (server_login_retry " + retry + ")"
	ev.bouncer = true
	ev.loginRetry = loginRetry
	return ev
}

// withMultiHost is ev with the server reaching the members with a
// multi-host connection string (target_session_attrs=read-write).
func withMultiHost(ev haEvent) haEvent {
	ev.name += ", multi-host URL"
	ev.multiHost = true
	return ev
}

// TestHA runs the payments server against an HA cluster as teams run one
// (internal/pgtest's HACluster: three PostgreSQL members under Patroni
// with etcd, and HAProxy routing to the leader by Patroni's health
// check), and while 8 clients drive payments through it, each retrying
// under its key until it has an answer, something happens to the cluster:
// the leader's machine dies (kill -9 of its Patroni and PostgreSQL),
// patronictl switchover, patronictl failover, a network partition of the
// leader; a switchover and a kill also with PgBouncer between the server
// and HAProxy (with PgBouncer's default server_login_retry of 15 s, and
// with 1 s), and a switchover and a partition with the server reaching
// the members through a multi-host connection string instead of HAProxy.
// A sweeper and a finisher run beside it, passing every 200 ms. Then
// every payment is retried once more. For each event:
//
//   - no acknowledged answer lost with synchronous_mode (asynchronous: lost
//     ones are counted, each lost with its payment);
//   - no payment twice, no key without its payment or payment without its
//     key, and every retry afterwards replays its first answer byte for
//     byte (a lost key's retry executes once);
//   - clients are told UNAVAILABLE or ABORTED, every answer with a
//     RetryInfo, never INTERNAL, and never the database's text (with a
//     multi-host URL, calls on a connection to the member cut off also end
//     at their deadline);
//   - the server process survives and recovers on its own, and the
//     sweeper deletes again once the event is over, while the dead member
//     is still dead or cut off.
//
// It logs the longest time without an answer, the latency during the
// event, how long until throughput recovered and how many lines the
// server, the sweeper and the finisher logged. With IDEM_HA=full it runs
// every event in synchronous and asynchronous mode and logs the table of
// docs/ha.md; otherwise a smoke subset: synchronous, switchover and
// kill -9.
func TestHA(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Patroni, etcd, HAProxy and PostgreSQL, and takes minutes: runs without -short")
	}
	full := os.Getenv(haEnv) == "full"
	modes := []bool{true}
	events := []haEvent{haSwitchover, haKill}
	if full {
		modes = []bool{true, false}
		events = []haEvent{haKill, haSwitchover, haFailover, haPartition,
			throughBouncer(haSwitchover, 0), throughBouncer(haSwitchover, time.Second), throughBouncer(haKill, time.Second),
			withMultiHost(haSwitchover), withMultiHost(haPartition)}
	}
	var mu sync.Mutex
	var rows []haResult
	for _, synchronous := range modes {
		mode := "asynchronous"
		if synchronous {
			mode = "synchronous"
		}
		t.Run(mode, func(t *testing.T) {
			c := pgtest.NewHA(t, pgtest.HAOptions{Synchronous: synchronous})
			for _, ev := range events {
				ok := t.Run(ev.name, func(t *testing.T) {
					r := runHAEvent(t, c, ev, synchronous)
					r.mode = mode
					mu.Lock()
					rows = append(rows, r)
					mu.Unlock()
				})
				if !ok {
					break // the cluster may not be whole for the next
				}
			}
		})
	}
	t.Logf("results (%s=%s):\n%s", haEnv, os.Getenv(haEnv), haTable(rows))
}

// haResult is what one event did to the clients.
type haResult struct {
	event, mode string
	ops         int
	// lost, twice and disagree are checkFailedOver's; wrongReplays is
	// checkRetried's.
	lost, twice, disagree, wrongReplays int
	// writable is how long after the event began a new connection through
	// HAProxy reached a writable leader other than the old one.
	writable time.Duration
	// stall is the longest time without an answer to any client, and
	// recovered how long after the event began the answer rate was back
	// for good (haRecovery).
	stall, recovered time.Duration
	// p99 and worst are the latency of the ops in flight during the event,
	// from first attempt to first answer; baseP99 that of the ops before.
	p99, worst, baseP99 time.Duration
	// told counts the answers that were not definitive, by code; noHint
	// those of UNAVAILABLE and ABORTED without a RetryInfo.
	told   map[codes.Code]int
	noHint int
	// logLines counts the server's log lines during the load, and
	// housekeeping the WARN and ERROR lines of the sweeper and the
	// finisher.
	logLines, housekeeping int
	// swept is how long after the load stopped the sweeper deleted rows
	// again.
	swept time.Duration
}

// runHAEvent runs ev on c under load and checks what the clients and the
// database saw; c is healthy before and after.
func runHAEvent(t *testing.T, c *pgtest.HACluster, ev haEvent, synchronous bool) haResult {
	ctx := context.Background()
	dsn, err := c.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	serverDSN := dsn
	if ev.multiHost {
		if serverDSN, err = c.MultiHostConnString(dsn); err != nil {
			t.Fatal(err)
		}
	}
	if ev.bouncer {
		b, err := pgtest.StartPgBouncer(ctx, c.Server, pgtest.PgBouncerOptions{
			PoolSize: 4, QueryWaitTimeout: 5 * time.Second, ServerLoginRetry: ev.loginRetry,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		if serverDSN, err = b.ConnString(dsn); err != nil {
			t.Fatal(err)
		}
	}
	srv := startServer(t, binary(t, serverPkg), serverDSN)
	pool := observerPool(t, dsn)
	dropBackstop(t, pool)
	// The payments table is on every member before anything happens.
	if err := c.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	candidate, err := c.Candidate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pid := srv.pid()
	logBefore := strings.Count(srv.output.String(), "\n")
	hk := startHousekeeping(t, serverDSN)

	l := &load{
		ops:           newOps(100000, 10),
		conns:         clients(t, srv.addr, haClients),
		confirmations: 1,
		pace:          haPace,
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.runUntil(t, stop)
	}()
	stopLoad := sync.OnceFunc(func() {
		close(stop)
		<-done
	})
	defer stopLoad()
	waitAnswers(t, l, haWarmup)
	began := time.Now()
	if err := ev.cause(ctx, c, leader, candidate); err != nil {
		t.Fatalf("%s: %v", ev.name, err)
	}
	next, err := c.WaitWritable(ctx, leader)
	if err != nil {
		t.Fatalf("after %s: %v", ev.name, err)
	}
	writable := time.Since(began)
	waitAnswers(t, l, l.answered.Load()+haAfter)
	stopped := time.Now()
	stopLoad()
	// The sweeper resumed: it deletes an expired row, while what happened
	// to the old leader still holds.
	swept := hk.waitSwept(t, pool)
	hkLines := hk.stop()
	// The killed member restarts, the partition heals, only now: until
	// then the clients met what a partition or a dead machine that
	// outlasts the failover leaves.
	if ev.recover != nil {
		if err := ev.recover(c, leader); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%s: %s led, %s took writes through HAProxy %v after the event began", ev.name, leader, next, writable.Round(time.Millisecond))
	if _, err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	pool.Reset() // its connections may have gone with the old leader

	r := haResult{event: ev.name, ops: len(l.ops), writable: writable, swept: swept, housekeeping: hkLines, told: make(map[codes.Code]int)}
	r.logLines = strings.Count(srv.output.String(), "\n") - logBefore
	l.mu.Lock()
	for code, n := range l.codes {
		if code != codes.OK && code != codes.InvalidArgument {
			r.told[code] = n
		}
	}
	for _, n := range l.noHint {
		r.noHint += n
	}
	l.mu.Unlock()
	measureHA(&r, l.ops, began, stopped)
	t.Logf("longest time without an answer %v; throughput back %v after the event began; latency p99 %v (max %v) during the event, %v before; not definitive: %v (%d without RetryInfo); %d server log lines; %d sweeper and finisher log lines, the sweeper deleted again %v after the load",
		r.stall, r.recovered, r.p99, r.worst, r.baseP99, r.told, r.noHint, r.logLines, r.housekeeping, r.swept)
	if !srv.running() || srv.pid() != pid {
		t.Errorf("the server process changed (%s); it must find the new leader on its own", srv.exitState())
	}
	allowed := []codes.Code{codes.OK, codes.InvalidArgument, codes.Unavailable, codes.Aborted}
	if ev.multiHost {
		// A call in flight on a connection to a member cut off keeps
		// waiting for it until the call's deadline: nothing closes that
		// connection, as HAProxy does when it takes the member out.
		allowed = append(allowed, codes.DeadlineExceeded)
	}
	l.checkCodes(t, allowed...)
	checkStorageErrors(t, l, srv)

	fc := checkFailedOver(t, pool, l.ops)
	r.lost, r.twice, r.disagree = len(fc.lost), fc.twice, fc.disagree
	t.Logf("%d of %d acknowledged answers lost", len(fc.lost), len(l.ops))
	if synchronous && len(fc.lost) > 0 {
		t.Errorf("%d acknowledged answers lost with synchronous_mode, want none", len(fc.lost))
	}

	// Every op once more: a key the cluster holds replays its first answer
	// byte for byte; a lost key runs again, once.
	l.confirmations = 2
	l.pace = 0
	l.run(t)
	r.wrongReplays = checkRetried(t, pool, l.ops, fc.lost)
	l.checkCodes(t, codes.OK, codes.InvalidArgument)
	return r
}

// housekeeping is a sweeper and a finisher that run as a server replica
// runs them, with passes every haHousekeeping, on a pool of their own.
type housekeeping struct {
	log    *logCapture
	cancel context.CancelFunc
	done   sync.WaitGroup
}

// startHousekeeping starts a sweeper and a finisher on a new pool on dsn.
func startHousekeeping(t *testing.T, dsn string) *housekeeping {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h := &housekeeping{log: &logCapture{}}
	logger := slog.New(slog.NewTextHandler(io.MultiWriter(os.Stderr, h.log), &slog.HandlerOptions{Level: slog.LevelDebug}))
	engine, err := idem.New(postgres.New(pool), idem.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	finisher, err := idem.NewFinisher(engine, idem.WithInterval(haHousekeeping))
	if err != nil {
		t.Fatal(err)
	}
	sweeper := postgres.NewSweeper(pool, postgres.WithInterval(haHousekeeping), postgres.WithLogger(logger))
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done.Add(2)
	go func() { defer h.done.Done(); _ = sweeper.Run(ctx) }()
	go func() { defer h.done.Done(); _ = finisher.Run(ctx) }()
	t.Cleanup(func() { h.stop() })
	return h
}

// waitSwept writes an expired key row through pool and returns how long
// until this sweeper deleted rows (it logs so at DEBUG); it fails t if
// that takes longer than haSweptTimeout. The payments server's own
// sweeper, which passes once a minute, may delete the row first: then it
// is written again, and what is left is deleted at the end.
func (h *housekeeping) waitSwept(t *testing.T, pool *pgxpool.Pool) time.Duration {
	t.Helper()
	const swept = "idem: swept expired rows"
	before := h.log.count(swept)
	start := time.Now()
	for h.log.count(swept) == before {
		if time.Since(start) > haSweptTimeout {
			t.Fatalf("the sweeper has not deleted an expired key after %v: it never resumed after the event", haSweptTimeout)
		}
		_, err := pool.Exec(context.Background(), `INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, expires_at)
			VALUES (`+pgtest.KeyIDSQL("'swept'", "'/chaos/Swept'", "'k'")+`, 'swept', '/chaos/Swept', 'k', '\x01', now() - interval '1 hour')
			ON CONFLICT DO NOTHING`)
		if err != nil {
			t.Fatalf("write an expired key: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(start).Round(time.Millisecond)
	// The last row written may outlive the pass that deleted the one
	// before: it is none of the payments' keys.
	if _, err := pool.Exec(context.Background(), `DELETE FROM idempotency_keys WHERE tenant = 'swept'`); err != nil {
		t.Fatal(err)
	}
	return took
}

// stop stops the sweeper and the finisher and returns how many lines they
// logged at WARN or ERROR.
func (h *housekeeping) stop() int {
	h.cancel()
	h.done.Wait()
	return h.log.count("level=ERROR") + h.log.count("level=WARN")
}

// waitAnswers waits until the clients of l have had n definitive answers.
func waitAnswers(t *testing.T, l *load, n int64) {
	t.Helper()
	deadline := time.Now().Add(haAnswerTimeout)
	for l.answered.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d answers after %v, want %d: the service did not recover", l.answered.Load(), haAnswerTimeout, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// haWindow is the window over which measureHA counts answers, and
// haRecovery the share of the rate before the event that counts as
// recovered.
const (
	haWindow   = time.Second
	haRecovery = 0.8
)

// measureHA fills in r's times from the first answers of ops, for an event
// that began at began, in a load that stopped handing out ops at stopped.
func measureHA(r *haResult, ops []*op, began, stopped time.Time) {
	var at []time.Time
	var base, during []time.Duration
	var first time.Time
	for _, o := range ops {
		if len(o.answers) == 0 {
			continue
		}
		a := o.answers[0].at
		at = append(at, a)
		if first.IsZero() || a.Before(first) {
			first = a
		}
	}
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	// The rate before the event, after the first second of warm-up.
	from := first.Add(haWindow)
	n := 0
	for _, a := range at {
		if !a.Before(from) && a.Before(began) {
			n++
		}
	}
	rate := float64(n) / began.Sub(from).Seconds()
	// Recovered at the end of the last window, from the event on, whose
	// rate was below haRecovery of it.
	var recoveredAt time.Time
	for end := began.Add(haWindow); !end.After(stopped); end = end.Add(50 * time.Millisecond) {
		lo, _ := slices.BinarySearchFunc(at, end.Add(-haWindow), func(a, t time.Time) int { return a.Compare(t) })
		hi, _ := slices.BinarySearchFunc(at, end, func(a, t time.Time) int { return a.Compare(t) })
		if float64(hi-lo) < haRecovery*rate*haWindow.Seconds() {
			recoveredAt = end
		}
	}
	if !recoveredAt.IsZero() {
		r.recovered = recoveredAt.Sub(began)
	}
	end := began.Add(r.writable)
	if recoveredAt.After(end) {
		end = recoveredAt
	}
	for _, o := range ops {
		if len(o.answers) == 0 {
			continue
		}
		a := o.answers[0].at
		switch d := a.Sub(o.start); {
		case a.Before(began):
			base = append(base, d)
		case o.start.Before(end):
			during = append(during, d)
		}
	}
	for i := 1; i < len(at); i++ {
		if at[i].After(began.Add(-haWindow)) {
			r.stall = max(r.stall, at[i].Sub(at[i-1]))
		}
	}
	r.baseP99 = percentile(base, 0.99)
	r.p99 = percentile(during, 0.99)
	if len(during) > 0 {
		r.worst = slices.Max(during)
	}
	round := func(d *time.Duration) { *d = d.Round(time.Millisecond) }
	for _, d := range []*time.Duration{&r.stall, &r.recovered, &r.p99, &r.worst, &r.baseP99, &r.writable} {
		round(d)
	}
}

// percentile returns the p-th quantile of ds, or 0 for none.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(p*float64(len(ds))))]
}

// haTable renders rows as the Markdown table of docs/ha.md.
func haTable(rows []haResult) string {
	var b strings.Builder
	b.WriteString("| replication | event | ops | acknowledged answers lost | payments twice | key and payment apart | wrong replays | writable again after | longest without an answer | latency p99 / max during (p99 before) | throughput back after | answers not definitive (without RetryInfo) | server log lines | sweeper and finisher log lines | sweeper deleted again after |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		var told []string
		for code, n := range r.told {
			told = append(told, fmt.Sprintf("%v %d", code, n))
		}
		sort.Strings(told)
		if len(told) == 0 {
			told = []string{"nothing"}
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %v | %v | %v / %v (%v) | %v | %s (%d) | %d | %d | %v |\n",
			r.mode, r.event, r.ops, r.lost, r.twice, r.disagree, r.wrongReplays, r.writable, r.stall,
			r.p99, r.worst, r.baseP99, r.recovered, strings.Join(told, ", "), r.noHint, r.logLines, r.housekeeping, r.swept)
	}
	return b.String()
}
