package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
)

// capacityConfig is what -capacity measures: the disk a key takes, from
// Rows rows, and how fast a Sweeper deletes expired ones at each of
// Sweeps.
type capacityConfig struct {
	Rows   int
	Sweeps []sweepSetting
}

// sweepSetting is a batch size and a pause between batches.
type sweepSetting struct {
	Batch int           `json:"batch_size"`
	Pause time.Duration `json:"-"`
}

func (s sweepSetting) String() string { return fmt.Sprintf("batch %d, pause %s", s.Batch, s.Pause) }

// The sweeper's defaults, as postgres.WithBatchSize and WithPause document
// them.
const (
	sweepBatchSize = 1000
	sweepPause     = 100 * time.Millisecond
)

var defaultSweepSettings = []sweepSetting{
	{sweepBatchSize, sweepPause},
	{sweepBatchSize, 0},
	{10 * sweepBatchSize, 0},
}

// capacityReport is what a key row costs and how fast the sweeper deletes.
type capacityReport struct {
	Command string  `json:"command"`
	Machine machine `json:"machine"`
	// The row measured: its scope's and response's lengths in bytes.
	TenantBytes   int `json:"tenant_bytes"`
	MethodBytes   int `json:"method_bytes"`
	KeyBytes      int `json:"key_bytes"`
	ResponseBytes int `json:"response_bytes"`

	Rows int64 `json:"rows"`
	// TupleBytes is the average size of a row's tuple, header included
	// (pg_column_size of the whole row); a heap page also spends a 4-byte
	// line pointer on it.
	TupleBytes float64 `json:"tuple_bytes"`
	// HeapBytes is the table's main fork after VACUUM, HeapPerRow that
	// over Rows: tuples, line pointers, page headers and the space left
	// at the end of each page.
	HeapBytes  int64   `json:"heap_bytes"`
	HeapPerRow float64 `json:"heap_bytes_per_row"`
	// OtherBytes is the free space map, the visibility map and TOAST.
	OtherBytes  int64       `json:"other_bytes"`
	Indexes     []indexSize `json:"indexes"`
	IndexPerRow float64     `json:"index_bytes_per_row"`
	// FreePercent is pgstattuple's free space of the heap, when the
	// extension could be created.
	FreePercent *float64      `json:"heap_free_percent,omitempty"`
	Sweeps      []sweepResult `json:"sweeps"`
	// Columns is the average size of each column that is not null, in
	// bytes (pg_column_size), in the table's order.
	Columns []columnSize `json:"columns"`
}

type columnSize struct {
	Name  string  `json:"name"`
	Bytes float64 `json:"bytes"`
}

type indexSize struct {
	Name   string  `json:"name"`
	Method string  `json:"method"`
	Bytes  int64   `json:"bytes"`
	PerRow float64 `json:"bytes_per_row"`
	// LeafDensity is pgstatindex's avg_leaf_density of a B-tree, in
	// percent, when the extension could be created.
	LeafDensity *float64 `json:"avg_leaf_density,omitempty"`
}

type sweepResult struct {
	sweepSetting
	Pause     string  `json:"pause"`
	Deleted   int64   `json:"deleted"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"rows_per_second"`
}

// runCapacity writes one key row through idem's store (a CreatePayment
// response, a UUID key), copies it into cc.Rows rows with random ids and
// keys and increasing expiry, as a table filled by requests holds them,
// vacuums, and measures the table and each index. Then, for each sweep
// setting, it fills the table with cc.Rows expired rows and times one
// Sweeper pass over them.
func runCapacity(ctx context.Context, cfg config, log io.Writer) (*capacityReport, error) {
	cc := cfg.Capacity
	if cc.Rows < 1000 {
		return nil, errors.New("-capacity-rows must be at least 1000")
	}
	if cfg.DatabaseURL != "" {
		if err := os.Setenv("DATABASE_URL", cfg.DatabaseURL); err != nil {
			return nil, err
		}
	}
	pg, err := pgtest.Start(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = pg.Close() }()
	dsn, drop, err := pg.CreateDatabase(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = drop(context.WithoutCancel(ctx)) }()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer pool.Close()

	e := newEnv(cfg, handlers[0], "")
	key := uuid()
	rep := &capacityReport{
		Command:       cfg.forReport().Command,
		Machine:       describeMachine(ctx, pg),
		TenantBytes:   len(tenant),
		MethodBytes:   len(createPayment),
		KeyBytes:      len(key),
		ResponseBytes: len(e.response),
	}
	claim, err := postgres.New(pool).Claim(ctx, store.Scope{Tenant: tenant, Method: createPayment, Key: key}, store.ClaimRequest{Fingerprint: e.fingerprint})
	if err != nil {
		return nil, err
	}
	if claim.Txn == nil {
		return nil, errors.New("a fresh key was taken")
	}
	if err := claim.Txn.Record(ctx, store.Outcome{Body: e.response}); err != nil {
		return nil, err
	}
	clone, err := cloneStatement(ctx, pool)
	if err != nil {
		return nil, err
	}

	fmt.Fprintf(log, "capacity: writing %d key rows\n", cc.Rows)
	if err := fill(ctx, pool, clone, key, 0, cc.Rows-1, false); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) idempotency_keys"); err != nil {
		return nil, err
	}
	if err := rep.measure(ctx, pool); err != nil {
		return nil, err
	}

	for _, s := range cc.Sweeps {
		// The template row stays, unexpired, for the next fill.
		if _, err := pool.Exec(ctx, "DELETE FROM idempotency_keys WHERE key <> $1", key); err != nil {
			return nil, err
		}
		if _, err := pool.Exec(ctx, "VACUUM idempotency_keys"); err != nil {
			return nil, err
		}
		if err := fill(ctx, pool, clone, key, 0, cc.Rows, true); err != nil {
			return nil, err
		}
		if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) idempotency_keys"); err != nil {
			return nil, err
		}
		fmt.Fprintf(log, "capacity: sweeping %d expired rows, %s\n", cc.Rows, s)
		sw := postgres.NewSweeper(pool, postgres.WithBatchSize(s.Batch), postgres.WithPause(s.Pause))
		t0 := time.Now()
		n, err := sw.Sweep(ctx)
		d := time.Since(t0)
		if err != nil {
			return nil, err
		}
		rep.Sweeps = append(rep.Sweeps, sweepResult{sweepSetting: s, Pause: s.Pause.String(), Deleted: n, Seconds: d.Seconds(), PerSecond: float64(n) / d.Seconds()})
	}
	return rep, nil
}

// cloneStatement returns an INSERT that copies the row whose key is $1
// into $2 rows, each with a random id and key, made and expiring when the
// original was (or, when $3 is true, expiring an hour ago) plus a
// millisecond per row, counted from the $4th: as in a table filled by
// requests, creation and expiry follow insertion order, and the indexes on
// them grow at their right-hand end. Every other column is copied as the
// store wrote it, whatever columns later migrations add.
func cloneStatement(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	cols, err := columns(ctx, pool)
	if err != nil {
		return "", err
	}
	exprs := make([]string, len(cols))
	for i, c := range cols {
		switch c {
		case "id":
			exprs[i] = "gen_random_uuid()"
		case "key":
			exprs[i] = "gen_random_uuid()::text"
		case "created_at":
			exprs[i] = "CASE WHEN $3::bool THEN now() - interval '1 hour' - (t.expires_at - t.created_at) ELSE t.created_at END + ($4::bigint + g) * interval '1 millisecond'"
		case "expires_at":
			exprs[i] = "CASE WHEN $3::bool THEN now() - interval '1 hour' ELSE t.expires_at END + ($4::bigint + g) * interval '1 millisecond'"
		default:
			exprs[i] = "t." + pgx.Identifier{c}.Sanitize()
		}
		cols[i] = pgx.Identifier{c}.Sanitize()
	}
	return fmt.Sprintf("INSERT INTO idempotency_keys (%s)\nSELECT %s\nFROM idempotency_keys t, generate_series(1, $2::int) g\nWHERE t.key = $1",
		strings.Join(cols, ", "), strings.Join(exprs, ", ")), nil
}

// fill inserts n copies of the row with key, in statements of at most
// 100 000 rows, the first of them the from'th copy; expired ones expire an
// hour before now.
func fill(ctx context.Context, pool *pgxpool.Pool, clone, key string, from, n int, expired bool) error {
	const chunk = 100_000
	for done := 0; done < n; done += chunk {
		if _, err := pool.Exec(ctx, clone, key, min(chunk, n-done), expired, from+done); err != nil {
			return err
		}
	}
	return nil
}

func (rep *capacityReport) measure(ctx context.Context, pool *pgxpool.Pool) error {
	err := pool.QueryRow(ctx, `SELECT count(*), avg(pg_column_size(t.*)),
    pg_relation_size('idempotency_keys', 'main'),
    pg_table_size('idempotency_keys') - pg_relation_size('idempotency_keys', 'main')
FROM idempotency_keys t`).Scan(&rep.Rows, &rep.TupleBytes, &rep.HeapBytes, &rep.OtherBytes)
	if err != nil {
		return err
	}
	n := float64(rep.Rows)
	rep.HeapPerRow = float64(rep.HeapBytes) / n
	cols, err := columns(ctx, pool)
	if err != nil {
		return err
	}
	for _, c := range cols {
		var avg *float64
		q := fmt.Sprintf("SELECT avg(pg_column_size(%s)) FROM idempotency_keys", pgx.Identifier{c}.Sanitize())
		if err := pool.QueryRow(ctx, q).Scan(&avg); err != nil {
			return err
		}
		if avg != nil {
			rep.Columns = append(rep.Columns, columnSize{Name: c, Bytes: *avg})
		}
	}
	// pgstattuple is in postgresql-contrib, and needs a superuser or
	// pg_stat_scan_tables; without it the sizes alone are reported.
	_, extErr := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pgstattuple")
	if extErr == nil {
		var free float64
		if pool.QueryRow(ctx, "SELECT free_percent FROM pgstattuple('idempotency_keys')").Scan(&free) == nil {
			rep.FreePercent = &free
		}
	}
	rows, err := pool.Query(ctx, `SELECT c.relname, am.amname, pg_relation_size(c.oid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam
WHERE i.indrelid = 'idempotency_keys'::regclass ORDER BY c.relname`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var ix indexSize
		if err := rows.Scan(&ix.Name, &ix.Method, &ix.Bytes); err != nil {
			rows.Close()
			return err
		}
		ix.PerRow = float64(ix.Bytes) / n
		rep.IndexPerRow += ix.PerRow
		rep.Indexes = append(rep.Indexes, ix)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if extErr == nil {
		for i, ix := range rep.Indexes {
			var d float64
			// An empty B-tree (the partial index of leased calls in
			// progress) has no leaf density: NaN.
			if ix.Method == "btree" && pool.QueryRow(ctx, "SELECT avg_leaf_density FROM pgstatindex($1)", ix.Name).Scan(&d) == nil && d == d {
				rep.Indexes[i].LeafDensity = &d
			}
		}
	}
	return nil
}

// columns returns the names of idempotency_keys' columns, in order.
func columns(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	rows, err := pool.Query(ctx, `SELECT column_name FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = 'idempotency_keys' ORDER BY ordinal_position`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func uuid() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// sizing is one row of the sizing table: a rate of first executions and a
// TTL.
type sizing struct {
	Rate float64
	TTL  time.Duration
}

// deadShare is the share of dead rows a table holds before autovacuum
// vacuums it, by default (autovacuum_vacuum_scale_factor 0.2): the soak
// finds the table's size to be the packed bytes per row times its peak of
// rows and dead rows together.
const deadShare = 0.2

var sizings = []sizing{
	{100, time.Hour}, {100, 24 * time.Hour},
	{1000, time.Hour}, {1000, 24 * time.Hour},
	{10000, time.Hour}, {10000, 24 * time.Hour},
}

// markdown writes the per-row figures, the sweeper's rates and a sizing
// table derived from them.
func (rep *capacityReport) markdown(w io.Writer) {
	fmt.Fprintf(w, "# Capacity: %d key rows\n\n", rep.Rows)
	fmt.Fprintf(w, "%s\n\n", rep.Machine.caption())
	fmt.Fprintf(w, "A row as atomic mode records CreatePayment: tenant %d bytes, method %d, key %d (a UUID), response %d.\n\n",
		rep.TenantBytes, rep.MethodBytes, rep.KeyBytes, rep.ResponseBytes)
	var cols []string
	for _, c := range rep.Columns {
		cols = append(cols, fmt.Sprintf("%s %.0f", c.Name, c.Bytes))
	}
	fmt.Fprintf(w, "Columns that are not null, bytes each (pg_column_size): %s.\n\n", strings.Join(cols, ", "))
	fmt.Fprintln(w, "| relation | bytes | bytes per row | note |")
	fmt.Fprintln(w, "|---|---:|---:|---|")
	note := fmt.Sprintf("tuple %.0f bytes + 4-byte line pointer", rep.TupleBytes)
	if rep.FreePercent != nil {
		note += fmt.Sprintf("; %.1f%% free", *rep.FreePercent)
	}
	fmt.Fprintf(w, "| heap | %d | %.1f | %s |\n", rep.HeapBytes, rep.HeapPerRow, note)
	for _, ix := range rep.Indexes {
		note := ix.Method
		if ix.LeafDensity != nil {
			note += fmt.Sprintf(", leaf density %.0f%%", *ix.LeafDensity)
		}
		fmt.Fprintf(w, "| %s | %d | %.1f | %s |\n", ix.Name, ix.Bytes, ix.PerRow, note)
	}
	fmt.Fprintf(w, "| free space and visibility maps, TOAST | %d | %.1f | |\n", rep.OtherBytes, float64(rep.OtherBytes)/float64(rep.Rows))
	perRow := rep.perRow()
	fmt.Fprintf(w, "| **total** | | **%.0f** | |\n\n", perRow)

	fmt.Fprintln(w, "| sweeper setting | rows deleted | seconds | rows/s |")
	fmt.Fprintln(w, "|---|---:|---:|---:|")
	for _, s := range rep.Sweeps {
		fmt.Fprintf(w, "| %s | %d | %.1f | %.0f |\n", s.sweepSetting, s.Deleted, s.Seconds, s.PerSecond)
	}
	var def float64
	if len(rep.Sweeps) > 0 {
		def = rep.Sweeps[0].PerSecond
	}
	fmt.Fprintf(w, "\n| first executions/s | TTL | rows | disk, packed | disk with %.0f%% dead rows | sweeper deletions/s | share of one sweeper (%s) |\n", 100*deadShare, rep.sweepLabel())
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|")
	for _, z := range sizings {
		rows := z.Rate * z.TTL.Seconds()
		share := "—"
		if def > 0 {
			share = fmt.Sprintf("%.0f%%", 100*z.Rate/def)
		}
		fmt.Fprintf(w, "| %.0f | %s | %s | %s | %s | %.0f | %s |\n", z.Rate, ttlLabel(z.TTL), count(rows), bytesLabel(rows*perRow),
			bytesLabel(rows*(1+deadShare)*perRow), z.Rate, share)
	}
}

// perRow is the disk per row: heap, indexes, maps.
func (rep *capacityReport) perRow() float64 {
	return rep.HeapPerRow + rep.IndexPerRow + float64(rep.OtherBytes)/float64(rep.Rows)
}

func (rep *capacityReport) sweepLabel() string {
	if len(rep.Sweeps) == 0 {
		return "not measured"
	}
	return rep.Sweeps[0].sweepSetting.String()
}

func ttlLabel(d time.Duration) string {
	if d%time.Hour == 0 {
		return fmt.Sprintf("%d h", d/time.Hour)
	}
	return d.String()
}

// count writes n with an SI suffix: 360 k, 8.6 M.
func count(n float64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.3g G", n/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.3g M", n/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.3g k", n/1e3)
	}
	return fmt.Sprintf("%.0f", n)
}

// bytesLabel writes b in binary units: 52 MiB, 1.2 GiB.
func bytesLabel(b float64) string {
	switch {
	case b >= 1<<40:
		return fmt.Sprintf("%.3g TiB", b/(1<<40))
	case b >= 1<<30:
		return fmt.Sprintf("%.3g GiB", b/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.3g MiB", b/(1<<20))
	}
	return fmt.Sprintf("%.3g KiB", b/(1<<10))
}

// writeCapacityOutputs writes the capacity report's markdown and, as cfg
// asks, its JSON; it has no chart.
func writeCapacityOutputs(cfg config, rep *capacityReport, stdout io.Writer) error {
	return emit(cfg, stdout, rep.markdown, rep, nil)
}
