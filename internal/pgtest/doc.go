// Package pgtest is the PostgreSQL machinery of idem's own tests, demos
// and load generator: it finds a server, or starts a throwaway one, and
// hands out isolated databases with idem's schema already applied; it also
// starts servers that tests may break, a PgBouncer in front of one, a
// primary with a standby, and an HA cluster under Patroni. It is internal: users test their handlers with
// the small public package store/postgres/pgtest, which is built on it.
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
// When none works, the error says what was tried and how to get PostgreSQL.
// Tests then fail; pgtest never skips them.
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
// idem_test_<random hex>; [NewDatabase] drops its database when the test
// ends, and one left behind by a killed test run can be dropped by hand.
//
// # Tests
//
// A test asks for a pool or a connection string:
//
//	func TestClaim(t *testing.T) {
//		pool := pgtest.NewPool(t)
//		st := postgres.New(pool)
//		// ...
//	}
//
// A package whose tests use pgtest should let [Run] wrap its tests, so that
// a throwaway cluster the tests started is stopped as soon as they finish:
//
//	func TestMain(m *testing.M) {
//		os.Exit(pgtest.Run(m))
//	}
//
// Without such a TestMain everything works the same, but a throwaway cluster
// outlives the test binary: a watchdog process stops it and removes its
// directory only after the test binary has exited. Stopping it is what Run
// is for.
//
// # Owning a server
//
// Tests of what happens when the database goes away need a server they may
// take down. [StartCluster] always starts a throwaway cluster, whatever
// DATABASE_URL and the libpq defaults say, and [Server.Restart] stops it as
// a crash would and starts it again while clients keep using it. pgtest
// never restarts a server it did not start.
//
// Failover tests need two: [StartReplicated] starts a primary and a standby
// that streams from it (synchronously or not), [Replicated.CreateDatabase]
// gives a connection string naming both with target_session_attrs =
// read-write, and [Replicated.KillPrimary] and [Replicated.Promote] fail
// the primary over while clients keep using it; [NewReplicated] does the
// first two for a test and stops both servers when it ends.
//
// # HA clusters
//
// Tests of idem under an HA manager need the manager: [StartHA] (and
// [NewHA] for a test) starts an etcd, three PostgreSQL members under
// Patroni, synchronous_mode on or off, and an HAProxy that routes to the
// leader by Patroni's REST health check, all on loopback ports, from the
// programs on the machine (Debian's patroni, etcd-server and haproxy; a
// missing one fails the test with what to install). [HACluster.Kill],
// [HACluster.Switchover], [HACluster.Failover] and [HACluster.Partition]
// are what happens to such a cluster; [HACluster.WaitHealthy] and
// [HACluster.WaitWritable] wait for what Patroni's REST API and a new
// connection through HAProxy say. A partition cuts the [Link]s, TCP
// proxies that can stop forwarding, in front of the member.
//
// # Programs
//
// Programs such as idem's demos use [Start], [Server.CreateDatabase] and
// [Server.Close] instead, which do the same without a testing.TB.
package pgtest
