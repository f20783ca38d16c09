package interceptor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/interceptor"
	testv1 "github.com/idemkit/idem/internal/gen/idem/test/v1"
	"github.com/idemkit/idem/internal/idemtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/postgres"
)

// storageText are words of storage errors that must never reach a client:
// SQLSTATEs, server messages, connection parameters, driver names.
var storageText = []string{"SQLSTATE", "ERROR:", "FATAL", "database", "user=", "127.0.0.1", "/var/run", "pgx", "postgres", "raised by"}

// wantNoStorageText fails t if the status of err, message or details,
// carries any of storageText.
func wantNoStorageText(t *testing.T, err error) {
	t.Helper()
	st := status.Convert(err)
	all := fmt.Sprint(st.Proto())
	for _, w := range storageText {
		if strings.Contains(strings.ToLower(all), strings.ToLower(w)) {
			t.Fatalf("the client got %q, which carries %q", all, w)
		}
	}
}

// wantLogged fails t unless the log holds a line with each of parts.
func wantLogged(t *testing.T, log *logBuffer, parts ...string) {
	t.Helper()
	for _, line := range strings.Split(log.String(), "\n") {
		found := true
		for _, p := range parts {
			found = found && strings.Contains(line, p)
		}
		if found {
			return
		}
	}
	t.Fatalf("no log line with all of %q; the log:\n%s", parts, log)
}

// raiseOn makes every statement of kind (INSERT, UPDATE) on
// idempotency_keys fail with a message that names the database.
func raiseOn(t *testing.T, e *env, kind string) {
	t.Helper()
	_, err := e.pool.Exec(context.Background(), fmt.Sprintf(`
		CREATE FUNCTION idem_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			RAISE EXCEPTION 'raised by a trigger of database %%', current_database();
		END $$;
		CREATE TRIGGER idem_refuse BEFORE %s ON idempotency_keys
			FOR EACH ROW EXECUTE FUNCTION idem_refuse();`, kind))
	if err != nil {
		t.Fatal(err)
	}
}

// asTenant returns a context that calls as tenant acme under key.
func asTenant(key string) context.Context {
	return metadata.AppendToOutgoingContext(withKey(key), "x-tenant-id", "acme")
}

// TestStorageErrorsStayInTheLog provokes each storage failure of a call,
// atomic and leased: the client gets UNAVAILABLE with RetryInfo and no
// storage text, nothing is written, and the log has the full error with the
// method, the tenant and what idem was doing.
func TestStorageErrorsStayInTheLog(t *testing.T) {
	const do = testv1.TestService_Do_FullMethodName
	for _, c := range []struct {
		name   string
		leased bool
		// provoke breaks the storage of e; setup may replace the store.
		setup   setup
		provoke func(t *testing.T, e *env)
		// doing and logged are what the log line must hold.
		doing  string
		logged string
	}{
		{
			name:   "claim, database refuses connections",
			setup:  setup{store: missingDatabase(t)},
			doing:  "claiming",
			logged: "3D000",
		},
		{
			name:   "claim, statement fails",
			setup:  setup{store: readOnlyUser(t)},
			doing:  "claiming",
			logged: "permission denied for table idempotency_keys",
		},
		{
			name:    "record, statement fails",
			provoke: func(t *testing.T, e *env) { raiseOn(t, e, "INSERT") },
			doing:   "recording",
			logged:  "raised by a trigger",
		},
		{
			name:   "lease, database refuses connections",
			leased: true,
			setup:  setup{store: missingDatabase(t)},
			doing:  "leasing",
			logged: "3D000",
		},
		{
			name:    "lease, statement fails",
			leased:  true,
			provoke: func(t *testing.T, e *env) { raiseOn(t, e, "INSERT") },
			doing:   "leasing",
			logged:  "raised by a trigger",
		},
		{
			name:    "leased record, statement fails",
			leased:  true,
			provoke: func(t *testing.T, e *env) { raiseOn(t, e, "UPDATE") },
			doing:   "recording",
			logged:  "raised by a trigger",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := c.setup
			if c.leased {
				s.opts = append(s.opts, idem.WithMethodPolicy(do, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute}))
			}
			e := newEnv(t, s)
			if c.provoke != nil {
				c.provoke(t, e)
			}
			_, err := e.client.Do(asTenant("k"), &testv1.DoRequest{Value: "v"})
			wantCode(t, err, codes.Unavailable)
			wantNoStorageText(t, err)
			// Everything is rolled back or never ran, except where a leased
			// record failed: the handler's effects are its own, and its
			// claim stays in progress until its lease (capped at 30 s in
			// the delay) runs out, for a retry to take it over.
			wantEffects, wantKeys, wantDelay := 0, 0, time.Second // idem's default
			if c.leased && c.doing == "recording" {
				wantEffects, wantKeys, wantDelay = 1, 1, 30*time.Second
			}
			if d := retryDelay(err); d == nil || *d != wantDelay {
				t.Errorf("RetryInfo delay %v, want %v", d, wantDelay)
			}
			if n, k := e.effects(t), e.countRows(t, `SELECT count(*) FROM idempotency_keys WHERE status = 'in_progress'`); n != wantEffects || k != wantKeys || e.keys(t) != k {
				t.Fatalf("after a storage failure: %d effects, %d keys in progress (%d in all); want %d and %d", n, k, e.keys(t), wantEffects, wantKeys)
			}
			wantLogged(t, e.log, "level=ERROR", c.doing, "method="+do, "tenant=acme", c.logged)

			// Opted in, for development, the client sees the error too.
			verbose := s
			verbose.opts = append(verbose.opts[:len(verbose.opts):len(verbose.opts)], idem.WithVerboseErrors(true))
			e = newEnv(t, verbose)
			if c.provoke != nil {
				c.provoke(t, e)
			}
			_, err = e.client.Do(asTenant("k"), &testv1.DoRequest{Value: "v"})
			if st := wantCode(t, err, codes.Unavailable); !strings.Contains(st.Message(), c.logged) {
				t.Fatalf("verbose message %q, want the storage error (%s)", st.Message(), c.logged)
			}
		})
	}
}

// missingDatabase returns a setup.store that builds a store on a database
// that does not exist: every connection is refused with FATAL 3D000, which
// names the user and the database.
func missingDatabase(t *testing.T) func(pool *pgxpool.Pool) store.Store {
	return func(pool *pgxpool.Pool) store.Store {
		cfg := pool.Config().Copy()
		cfg.ConnConfig.Database = "idem_no_such_database"
		missing, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(missing.Close)
		return postgres.New(missing)
	}
}

// readOnlyUser returns a store whose pool connects as a role that may read
// idempotency_keys but not write it, as a server given the wrong database
// user is: every claim fails on its first statement that needs to write.
func readOnlyUser(t *testing.T) func(pool *pgxpool.Pool) store.Store {
	return func(pool *pgxpool.Pool) store.Store {
		ctx := context.Background()
		role := fmt.Sprintf("idem_reader_%d", time.Now().UnixNano())
		if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE ROLE %s LOGIN; GRANT SELECT ON idempotency_keys TO %s`, role, role)); err != nil {
			t.Fatal(err)
		}
		cfg := pool.Config().Copy()
		cfg.ConnConfig.User = role
		reader, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			reader.Close()
			_, _ = pool.Exec(ctx, fmt.Sprintf(`REVOKE ALL ON idempotency_keys FROM %s; DROP ROLE %s`, role, role))
		})
		return postgres.New(reader)
	}
}

// TestInternalErrorsStayInTheLog covers the other internal errors a call
// can meet: a response or an error that cannot be encoded, and a Loader that
// fails. The client learns what failed, not the error's text; the log has
// it.
func TestInternalErrorsStayInTheLog(t *testing.T) {
	e := newEnv(t, setup{})
	intercept := interceptor.UnaryServerInterceptor(idemtest.NewEngine(t, postgres.New(e.pool),
		idem.WithTenant(idemtest.TenantFromHeader),
		idem.WithLogger(e.log.logger())))
	info := &grpc.UnaryServerInfo{FullMethod: testv1.TestService_Do_FullMethodName}
	call := func(key string, handler grpc.UnaryHandler) error {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(idem.KeyHeader, key, "x-tenant-id", "acme"))
		_, err := intercept(ctx, &testv1.DoRequest{Value: "v"}, info, handler)
		return err
	}
	// proto refuses to encode a string that is not UTF-8.
	err := call("response", func(context.Context, any) (any, error) {
		return &testv1.DoResponse{Value: "\xff"}, nil
	})
	wantCode(t, err, codes.Internal)
	if msg := status.Convert(err).Message(); strings.Contains(msg, "UTF-8") || strings.Contains(msg, "proto") {
		t.Fatalf("the client got the encoder's error: %q", msg)
	}
	wantLogged(t, e.log, "level=ERROR", "method="+info.FullMethod, "tenant=acme", "UTF-8")

	err = call("error", func(context.Context, any) (any, error) {
		return nil, status.Error(codes.InvalidArgument, "not UTF-8: \xff")
	})
	wantCode(t, err, codes.Internal)
	if msg := status.Convert(err).Message(); strings.Contains(msg, "UTF-8") || strings.Contains(msg, "proto") {
		t.Fatalf("the client got the encoder's error: %q", msg)
	}
	if k := e.keys(t); k != 0 {
		t.Fatalf("%d keys recorded for outcomes that could not be encoded, want 0", k)
	}
}

// failingLoader records a reference and fails to load it, with an error
// that names the database.
type failingLoader struct{}

func (failingLoader) Reference(context.Context, proto.Message) ([]byte, error) {
	return []byte("ref"), nil
}

func (failingLoader) Load(context.Context, []byte) (proto.Message, error) {
	return nil, errors.New(`failed to connect to user=app database=payments: 127.0.0.1:5432: FATAL: too many connections (SQLSTATE 53300)`)
}

func TestLoaderErrorsStayInTheLog(t *testing.T) {
	e := newEnv(t, setup{opts: []idem.Option{
		idem.WithMaxStoredResponseBytes(8),
		idem.WithMethodPolicy(maybeMethod, idem.MethodPolicy{Loader: failingLoader{}}),
	}})
	req := &testv1.MaybeRequest{Value: strings.Repeat("x", 20)}
	if _, err := e.client.Maybe(asTenant("k"), req); err != nil {
		t.Fatal(err)
	}
	_, err := e.client.Maybe(asTenant("k"), req)
	wantCode(t, err, codes.Unavailable)
	wantNoStorageText(t, err)
	wantLogged(t, e.log, "level=ERROR", "rebuilding", "method="+maybeMethod, "tenant=acme", "SQLSTATE 53300")
}

// TestHealthyCallsLogNothing: first executions, replays, recorded errors
// and the client errors idem answers itself leave the log empty.
func TestHealthyCallsLogNothing(t *testing.T) {
	e := newEnv(t, setup{})
	for range 2 {
		if _, err := e.client.Do(asTenant("ok"), &testv1.DoRequest{Value: "v"}); err != nil {
			t.Fatal(err)
		}
	}
	e.svc.setHook(func(context.Context, string) error { return status.Error(codes.InvalidArgument, "no") })
	for range 2 {
		if _, err := e.client.Do(asTenant("invalid"), &testv1.DoRequest{Value: "v"}); status.Code(err) != codes.InvalidArgument {
			t.Fatal(err)
		}
	}
	if _, err := e.client.Do(asTenant("ok"), &testv1.DoRequest{Value: "other"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatal(err)
	}
	if _, err := e.client.Do(asTenant("bad key"), &testv1.DoRequest{Value: "v"}); status.Code(err) != codes.InvalidArgument {
		t.Fatal(err)
	}
	if got := e.log.String(); got != "" {
		t.Fatalf("healthy calls logged:\n%s", got)
	}
}

// TestMissingSchemaIsNotRetriable covers a server started without
// postgres.Migrate: clients must not be told to retry for ever
// (UNAVAILABLE), nor see the database's error; the log says what to do.
func TestMissingSchemaIsNotRetriable(t *testing.T) {
	for _, leased := range []bool{false, true} {
		t.Run(fmt.Sprintf("leased=%v", leased), func(t *testing.T) {
			var s setup
			if leased {
				s.opts = []idem.Option{idem.WithMethodPolicy(testv1.TestService_Do_FullMethodName, idem.MethodPolicy{KeyRequired: true, Mode: idem.ModeLeased, Lease: time.Minute})}
			}
			e := newEnv(t, s)
			if _, err := e.pool.Exec(context.Background(), `DROP TABLE idempotency_keys`); err != nil {
				t.Fatal(err)
			}
			_, err := e.client.Do(asTenant("k"), &testv1.DoRequest{Value: "v"})
			st := wantCode(t, err, codes.Internal)
			wantNoStorageText(t, err)
			if !strings.Contains(st.Message(), "not set up") {
				t.Errorf("message %q does not say the store is not set up", st.Message())
			}
			if n := e.effects(t); n != 0 {
				t.Errorf("%d effects, want 0: the handler must not run", n)
			}
			if log := e.log.String(); !strings.Contains(log, "postgres.Migrate") || !strings.Contains(log, "level=ERROR") {
				t.Errorf("the log does not name postgres.Migrate at level ERROR:\n%s", log)
			}
		})
	}
}
