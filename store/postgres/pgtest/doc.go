// Package pgtest gives tests a PostgreSQL database of their own, with
// idem's schema applied and no rows. Use it to test your handlers as they
// run in production, through the interceptor on a real transaction (see the
// examples): store/memory has no transaction to hand them.
//
// # Tests
//
// A test asks for a pool, or for a configuration to adjust before opening
// one:
//
//	func TestCreatePayment(t *testing.T) {
//		pool := pgtest.NewPool(t)
//		st := postgres.New(pool)
//		// ...
//	}
//
// [NewPool] closes its pool when the test ends, and [NewConfig] and
// [NewPool] drop the database then. Under go test -short they skip the
// test, so that the quick run leaves out every test that needs a database;
// when no PostgreSQL can be had, they fail it with a message that says how
// to get one, and never skip it for that.
//
// A package whose tests use pgtest should let [Run] wrap them, so that a
// throwaway cluster the tests started is stopped as soon as they finish:
//
//	func TestMain(m *testing.M) {
//		os.Exit(pgtest.Run(m))
//	}
//
// Without such a TestMain everything works the same, but a throwaway
// cluster outlives the test binary: a watchdog process stops it and removes
// its directory only after the test binary has exited.
//
// # Finding a server
//
// The first of these that works is used, once per process:
//
//  1. DATABASE_URL, when it is set (a URL or a keyword/value connection
//     string). If it is set but unusable, that is an error: pgtest does not
//     fall back to anything else.
//  2. The libpq defaults: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE and
//     the other PG* variables, else the local socket directory and the OS
//     user name, provided a server answers within a few seconds and the role
//     may create databases.
//  3. A throwaway cluster made from the PostgreSQL server binaries on the
//     machine (initdb, pg_ctl and postgres, looked up in PATH, through
//     pg_config --bindir and in the usual installation directories such as
//     /usr/lib/postgresql/*/bin). It lives in a temporary directory, listens
//     only on a Unix socket in that directory, and is stopped and removed at
//     the end. initdb refuses to run as root, so when the process runs as
//     root the cluster runs as the OS user postgres.
//
// The server needs PostgreSQL 13 or later, and the role needs permission to
// create databases.
//
// # Isolation
//
// Every database pgtest hands out is new: it is created with CREATE DATABASE
// from a template that holds idem's migrations, so a test starts from an
// empty schema without running migrations itself. The template is created
// once per server and named after a hash of the migration files
// (idem_template_<hash>), so a schema change gets a new template; templates
// of earlier schemas stay until someone drops them. Test databases are named
// idem_test_<random hex>; one left behind by a killed test run can be
// dropped by hand.
//
// # Compatibility
//
// [NewConfig], [NewPool] and [Run] are the whole package, and follow the
// module's versioning: their signatures stay, and so do the ways of finding
// a server above and the promise of a new, migrated, empty database per
// call. What a database holds follows idem's migrations, which change with
// idem; the names of the template and test databases are not part of the
// promise.
package pgtest
