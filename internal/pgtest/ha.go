package pgtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The HA cluster's timing. Patroni's leader key lives haTTL without a
// renewal, its members run their loop every haLoopWait and give up a
// request to etcd or PostgreSQL after haRetryTimeout (Patroni requires
// loop_wait + 2 × retry_timeout ≤ ttl); its defaults are 30 s, 10 s and
// 10 s. HAProxy's health checks are in haproxyConfig.
const (
	haTTL          = 10 * time.Second
	haLoopWait     = time.Second
	haRetryTimeout = 4 * time.Second
	// haMaxLag is Patroni's maximum_lag_on_failover, its default: a
	// replica further behind than this (in bytes of WAL) is not promoted
	// by a failover.
	haMaxLag  = 1 << 20
	haMembers = 3

	// haStartTimeout bounds starting the whole cluster; haWaitTimeout
	// bounds each wait for a state of the cluster, such as a healthy one
	// after a member was killed.
	haStartTimeout = 3 * time.Minute
	haWaitTimeout  = 2 * time.Minute
	// haCtlTimeout bounds one patronictl command.
	haCtlTimeout = time.Minute
	// haProbeTimeout bounds one probe of a member: an HTTP request to
	// Patroni's REST API, or connecting to PostgreSQL and one query.
	haProbeTimeout = 2 * time.Second
	haPollInterval = 50 * time.Millisecond
)

// defaultHADirs are where Patroni, etcd and HAProxy are commonly
// installed, after PATH: Debian's haproxy is in /usr/sbin, which may not be
// in PATH.
var defaultHADirs = []string{"/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/opt/homebrew/bin"}

const howToGetHA = `An HA cluster needs Patroni (patroni, patronictl; with its etcd support), etcd and HAProxy
besides the PostgreSQL server binaries: install them
(e.g. apt-get install patroni etcd-server haproxy);
idem's .ci/run installs the Debian packages when they are missing.`

// HAOptions configures an HA cluster ([StartHA]).
type HAOptions struct {
	// Synchronous turns Patroni's synchronous_mode on: the leader
	// acknowledges a commit only once a synchronous standby, which Patroni
	// picks among the replicas and which alone it may promote, has flushed
	// the commit's WAL. Without it the replicas stream asynchronously.
	Synchronous bool
}

// HACluster is a PostgreSQL cluster as an HA manager runs it: three
// members under Patroni, which keeps its leader key in an etcd of the
// cluster's own, and an HAProxy that routes connections to the leader by
// Patroni's REST health check (GET /primary). Everything listens on
// loopback ports and lives in temporary directories; each member is a
// throwaway cluster (PostgreSQL runs as the OS user postgres when the
// process runs as root, and so does Patroni). See [StartHA].
//
// Each member is reached through [Link]s: its PostgreSQL port (which
// HAProxy and the other members' replication reach it through), its REST
// API (which HAProxy's checks and the other members' Patroni reach) and
// its own connection to etcd; [HACluster.Partition] cuts all three.
type HACluster struct {
	// Server is the cluster's leader, reached through HAProxy: databases
	// made on it with [Server.CreateDatabase] are on every member, and
	// their connection strings go through HAProxy too (see
	// [HACluster.CreateDatabase], which also waits for the replicas).
	Server *Server

	opts      HAOptions
	dir       string // etcd's data, HAProxy's and patronictl's configuration, their logs
	runAs     *osUser
	binDir    string // PostgreSQL's
	bins      haBins
	namespace string
	ctlConfig string // patronictl's configuration, which reaches etcd directly

	etcd        *daemon
	etcdPort    int
	haproxy     *daemon
	haproxyPort int
	members     []*haMember
	http        *http.Client

	mu        sync.Mutex // guards each member's patroni
	closeOnce sync.Once
	closeErr  error
}

// haBins are the programs of an HA cluster besides PostgreSQL's.
type haBins struct{ patroni, patronictl, etcd, haproxy string }

// haMember is one member of an HA cluster: a throwaway cluster's directory
// and data directory, which Patroni initializes (or copies from the
// leader) and runs.
type haMember struct {
	name    string
	c       *cluster
	config  string // Patroni's configuration file
	log     string // Patroni's log
	pgPort  int
	apiPort int
	// The links a partition cuts: to its PostgreSQL, to its REST API, and
	// from its Patroni to etcd.
	pg, api, dcs *Link
	patroni      *daemon // nil while killed
}

// StartHA starts an HA cluster: etcd, three members under Patroni (the
// first initializes the database and becomes the leader, the others copy
// it and stream from it), and HAProxy in front of them. It returns once
// the cluster is healthy ([HACluster.WaitHealthy]). The caller must call
// [HACluster.Close], which stops everything and removes the directories.
//
// Patroni's settings are a test's: a leader key that lives 10 s (ttl),
// members that look at the cluster every second (loop_wait), a request to
// etcd or PostgreSQL given up after 4 s (retry_timeout), pg_rewind to
// bring a former leader back, maximum_lag_on_failover its default of
// 1 MB. HAProxy checks each member's GET /primary every second, every
// 200 ms while a member's state is changing and every 500 ms while it is
// down, takes a member out after two failed checks and back after one
// that passed, and then closes the sessions it had sent there
// (on-marked-down shutdown-sessions).
//
// When a program is missing, the error names it and says how to install
// it. It is for idem's own tests of how idem behaves under an HA manager.
func StartHA(ctx context.Context, opts HAOptions) (*HACluster, error) {
	c, err := startHA(ctx, defaultDiscovery(), opts)
	if err != nil {
		return nil, fmt.Errorf("start an HA cluster (Patroni, etcd, HAProxy): %w", err)
	}
	return c, nil
}

func findHABins(path string) (haBins, error) {
	dirs := strings.Join(defaultHADirs, string(filepath.ListSeparator))
	find := func(name string) string {
		if p := lookPath(name, path); p != "" {
			return p
		}
		return lookPath(name, dirs)
	}
	b := haBins{patroni: find("patroni"), patronictl: find("patronictl"), etcd: find("etcd"), haproxy: find("haproxy")}
	var missing []string
	for name, p := range map[string]string{"patroni": b.patroni, "patronictl": b.patronictl, "etcd": b.etcd, "haproxy": b.haproxy} {
		if p == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return b, fmt.Errorf("not installed: %s (looked in PATH and %s)\n%s",
			strings.Join(missing, ", "), strings.Join(defaultHADirs, ", "), howToGetHA)
	}
	return b, nil
}

func startHA(ctx context.Context, d discovery, opts HAOptions) (_ *HACluster, err error) {
	if !clusterSupported {
		return nil, errors.New("an HA cluster needs a Unix-like system")
	}
	bins, err := findHABins(os.Getenv("PATH"))
	if err != nil {
		return nil, err
	}
	binDir, err := d.findBinDir(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, howToGetServerBinaries)
	}
	for _, name := range []string{"pg_basebackup", "pg_rewind", "pg_controldata", "pg_isready"} {
		if !isExecutable(filepath.Join(binDir, name)) {
			return nil, fmt.Errorf("no %s in %s, next to initdb; Patroni needs it", name, binDir)
		}
	}
	runAs, err := clusterUser()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, haStartTimeout)
	defer cancel()
	dir, err := os.MkdirTemp(tempBase(runAs), "idem-ha-")
	if err != nil {
		return nil, err
	}
	c := &HACluster{
		opts:      opts,
		dir:       dir,
		runAs:     runAs,
		binDir:    binDir,
		bins:      bins,
		namespace: "/idem-" + randomHex(4) + "/",
		http:      &http.Client{Timeout: haProbeTimeout},
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w%s", err, c.logs())
			c.Close()
		}
	}()
	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	for i := range haMembers {
		m, err := c.newMember(ctx, d, fmt.Sprintf("pg%d", i))
		if err != nil {
			return nil, err
		}
		c.members = append(c.members, m)
	}
	if err := c.writeCtlConfig(); err != nil {
		return nil, err
	}
	// The first member alone, so that it initializes the database and
	// leads; then the others, which copy it.
	if err := c.startPatroni(c.members[0]); err != nil {
		return nil, err
	}
	err = c.poll(ctx, "the first member to become the leader", func(ctx context.Context) (bool, error) {
		return c.holdsLeaderKey(ctx, c.members[0])
	})
	if err != nil {
		return nil, err
	}
	for _, m := range c.members[1:] {
		if err := c.startPatroni(m); err != nil {
			return nil, err
		}
	}
	if err := c.startHAProxy(); err != nil {
		return nil, err
	}
	connString := (&url.URL{
		Scheme:   "postgres",
		User:     url.User(clusterUserName),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.haproxyPort)),
		Path:     "/postgres",
		RawQuery: "sslmode=disable&connect_timeout=2",
	}).String()
	if _, err := c.WaitHealthy(ctx); err != nil {
		return nil, err
	}
	if c.Server, err = openServer(ctx, connString, "an HA cluster behind HAProxy in "+dir, urlProbeTimeout); err != nil {
		return nil, err
	}
	return c, nil
}

// startEtcd starts a single-member etcd and waits until it is healthy.
func (c *HACluster) startEtcd(ctx context.Context) error {
	clientPort, err := freePort()
	if err != nil {
		return err
	}
	peerPort, err := freePort()
	if err != nil {
		return err
	}
	c.etcdPort = clientPort
	client := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	peer := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	c.etcd, err = startDaemon("etcd", filepath.Join(c.dir, "etcd.log"), c.dir, nil, false, c.bins.etcd,
		"--name", "idem", "--data-dir", filepath.Join(c.dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "idem="+peer, "--logger", "zap", "--log-outputs", "stderr")
	if err != nil {
		return err
	}
	return c.poll(ctx, "etcd to be healthy", func(ctx context.Context) (bool, error) {
		if !c.etcd.running() {
			return false, c.etcd.exitErr()
		}
		var health struct{ Health string }
		err := c.getJSON(ctx, client+"/health", &health)
		return err == nil && health.Health == "true", err
	})
}

// newMember makes a member's directory, its links and its Patroni
// configuration.
func (c *HACluster) newMember(ctx context.Context, d discovery, name string) (*haMember, error) {
	cl, err := d.newCluster(ctx)
	if err != nil {
		return nil, err
	}
	m := &haMember{name: name, c: cl, config: filepath.Join(cl.dir, "patroni.yml"), log: filepath.Join(cl.dir, "patroni.log")}
	if m.pgPort, err = freePort(); err != nil {
		return m, err
	}
	if m.apiPort, err = freePort(); err != nil {
		return m, err
	}
	for _, l := range []struct {
		link   **Link
		target int
	}{{&m.pg, m.pgPort}, {&m.api, m.apiPort}, {&m.dcs, c.etcdPort}} {
		if *l.link, err = NewLink(net.JoinHostPort("127.0.0.1", strconv.Itoa(l.target))); err != nil {
			return m, err
		}
	}
	return m, c.writeConfig(m)
}

// writeConfig writes m's Patroni configuration. It is JSON, which YAML
// (Patroni's format) includes.
func (c *HACluster) writeConfig(m *haMember) error {
	addr := func(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
	cfg := map[string]any{
		"scope":     "idem",
		"namespace": c.namespace,
		"name":      m.name,
		"restapi":   map[string]any{"listen": addr(m.apiPort), "connect_address": addr(m.api.Port())},
		// use_proxies: etcd's address is the link's, and Patroni must not
		// learn the address etcd advertises, which bypasses it.
		"etcd3": map[string]any{"host": addr(m.dcs.Port()), "use_proxies": true},
		"bootstrap": map[string]any{
			"dcs": map[string]any{
				"ttl":                     int(haTTL / time.Second),
				"loop_wait":               int(haLoopWait / time.Second),
				"retry_timeout":           int(haRetryTimeout / time.Second),
				"maximum_lag_on_failover": haMaxLag,
				"synchronous_mode":        c.opts.Synchronous,
				"postgresql": map[string]any{
					"use_pg_rewind": true,
					"use_slots":     true,
					"parameters": map[string]any{
						"wal_log_hints": "on",
						// See docs/standby.md: a promotion on PostgreSQL
						// 15 may wait this long after the stream broke.
						"wal_retrieve_retry_interval": "100ms",
						// A leader that shuts down sends its replicas the
						// last of its WAL first, for as long as this: cut
						// off from them, its demotion waits that long, and
						// Patroni 3.0 may start a second demotion meanwhile,
						// which leaves the member broken (two postmasters,
						// a failed pg_rewind). The default is 60 s.
						"wal_sender_timeout": "5s",
					},
				},
			},
			"initdb": []any{map[string]string{"encoding": "UTF8"}, map[string]string{"locale": "C"}},
		},
		"postgresql": map[string]any{
			"listen":          addr(m.pgPort),
			"connect_address": addr(m.pg.Port()),
			"data_dir":        m.c.dataDir,
			"bin_dir":         c.binDir,
			"pgpass":          filepath.Join(m.c.dir, "pgpass"),
			"authentication": map[string]any{
				"superuser":   map[string]string{"username": clusterUserName},
				"replication": map[string]string{"username": clusterUserName},
			},
			"parameters": map[string]any{
				"unix_socket_directories": m.c.dir,
				"logging_collector":       "on",
				"log_directory":           m.c.dir,
				"log_filename":            filepath.Base(m.c.logFile),
			},
			"pg_hba": []string{
				"local all all trust",
				"host all all 127.0.0.1/32 trust",
				"host replication all 127.0.0.1/32 trust",
			},
			"remove_data_directory_on_rewind_failure":     true,
			"remove_data_directory_on_diverged_timelines": true,
		},
		"watchdog": map[string]any{"mode": "off"},
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return writeOwned(m.config, b, c.runAs)
}

// writeCtlConfig writes patronictl's configuration: the cluster's scope
// and etcd, reached directly, so that patronictl works whichever member is
// cut off.
func (c *HACluster) writeCtlConfig() error {
	c.ctlConfig = filepath.Join(c.dir, "patronictl.yml")
	b, err := json.Marshal(map[string]any{
		"scope":     "idem",
		"namespace": c.namespace,
		"etcd3":     map[string]any{"host": net.JoinHostPort("127.0.0.1", strconv.Itoa(c.etcdPort))},
	})
	if err != nil {
		return err
	}
	return os.WriteFile(c.ctlConfig, b, 0o644)
}

// writeOwned writes b to path, owned by u (nil: this process's user).
func writeOwned(path string, b []byte, u *osUser) error {
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return err
	}
	if u != nil {
		return os.Chown(path, int(u.uid), int(u.gid))
	}
	return nil
}

// startPatroni starts m's Patroni, as the cluster's OS user.
func (c *HACluster) startPatroni(m *haMember) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.patroni != nil {
		return fmt.Errorf("pgtest: %s's Patroni runs already", m.name)
	}
	// A process group of its own, which also holds what it runs besides
	// PostgreSQL (pg_rewind, pg_basebackup), so that killing it kills
	// them too; PostgreSQL runs in a session of its own.
	d, err := startDaemon("Patroni of "+m.name, m.log, m.c.dir, c.runAs, true, c.bins.patroni, m.config)
	if err != nil {
		return err
	}
	m.patroni = d
	// From now on Close stops its PostgreSQL, if one runs.
	m.c.started = true
	return nil
}

// startHAProxy starts HAProxy in front of the members.
func (c *HACluster) startHAProxy() error {
	port, err := freePort()
	if err != nil {
		return err
	}
	c.haproxyPort = port
	cfg := filepath.Join(c.dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(c.haproxyConfig()), 0o644); err != nil {
		return err
	}
	c.haproxy, err = startDaemon("HAProxy", filepath.Join(c.dir, "haproxy.log"), c.dir, nil, false, c.bins.haproxy, "-db", "-f", cfg)
	return err
}

// haproxyConfig returns HAProxy's configuration: one TCP proxy whose
// servers are the members, of which only the one whose Patroni answers
// GET /primary with 200 (the leader) takes connections.
func (c *HACluster) haproxyConfig() string {
	var b strings.Builder
	fmt.Fprintf(&b, `# idem's pgtest: HAProxy in front of an HA cluster's members.
global
	maxconn 2000

defaults
	mode tcp
	timeout connect 2s
	timeout client 1h
	timeout server 1h
	timeout check 1s

listen postgres
	bind 127.0.0.1:%d
	option httpchk OPTIONS /primary
	http-check expect status 200
	default-server inter 1s fastinter 200ms downinter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
`, c.haproxyPort)
	for _, m := range c.members {
		fmt.Fprintf(&b, "\tserver %s 127.0.0.1:%d check port %d\n", m.name, m.pg.Port(), m.api.Port())
	}
	return b.String()
}

// Members returns the members' names.
func (c *HACluster) Members() []string {
	names := make([]string, len(c.members))
	for i, m := range c.members {
		names[i] = m.name
	}
	return names
}

func (c *HACluster) member(name string) (*haMember, error) {
	for _, m := range c.members {
		if m.name == name {
			return m, nil
		}
	}
	return nil, fmt.Errorf("pgtest: no member %q in the HA cluster (members: %s)", name, strings.Join(c.Members(), ", "))
}

// poll calls check every haPollInterval until it reports true, for at
// most haWaitTimeout; the error then says what was awaited and what check
// last returned.
func (c *HACluster) poll(ctx context.Context, what string, check func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, haWaitTimeout)
	defer cancel()
	for {
		pctx, pcancel := context.WithTimeout(ctx, haProbeTimeout)
		ok, err := check(pctx)
		pcancel()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: no %s after %v (last: %v)", what, haWaitTimeout, err)
		case <-time.After(haPollInterval):
		}
	}
}

// getJSON GETs u and decodes the JSON of a 200 answer into v.
func (c *HACluster) getJSON(ctx context.Context, u string, v any) error {
	code, body, err := c.get(ctx, u)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", u, code, body)
	}
	return json.Unmarshal(body, v)
}

// get GETs u and returns the answer's status code and body.
func (c *HACluster) get(ctx context.Context, u string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, body, err
}

// holdsLeaderKey reports whether m's Patroni says, on its REST API
// reached directly (never through its link), that it holds the leader key
// (GET /leader answers 200).
func (c *HACluster) holdsLeaderKey(ctx context.Context, m *haMember) (bool, error) {
	if d := c.patroniOf(m); d == nil {
		return false, fmt.Errorf("%s's Patroni is not running", m.name)
	} else if !d.running() {
		return false, d.exitErr()
	}
	code, body, err := c.get(ctx, "http://127.0.0.1:"+strconv.Itoa(m.apiPort)+"/leader")
	if err != nil {
		return false, err
	}
	if code != http.StatusOK {
		return false, fmt.Errorf("%s: GET /leader: %d %s", m.name, code, body)
	}
	return true, nil
}

func (c *HACluster) patroniOf(m *haMember) *daemon {
	c.mu.Lock()
	defer c.mu.Unlock()
	return m.patroni
}

// leader returns the one member whose Patroni says it holds the leader key.
func (c *HACluster) leader(ctx context.Context) (*haMember, error) {
	var holders []*haMember
	var errs []error
	for _, m := range c.members {
		if c.patroniOf(m) == nil {
			continue
		}
		ok, err := c.holdsLeaderKey(ctx, m)
		if ok {
			holders = append(holders, m)
		} else {
			errs = append(errs, err)
		}
	}
	switch len(holders) {
	case 1:
		return holders[0], nil
	case 0:
		return nil, fmt.Errorf("no member holds the leader key: %w", errors.Join(errs...))
	default:
		return nil, fmt.Errorf("%d members say they hold the leader key", len(holders))
	}
}

// Leader returns the name of the member that holds Patroni's leader key,
// as the members' Patroni says (GET /leader), or an error when none or
// several do.
func (c *HACluster) Leader(ctx context.Context) (string, error) {
	m, err := c.leader(ctx)
	if err != nil {
		return "", err
	}
	return m.name, nil
}

// memberConn connects to m's PostgreSQL directly, never through its link.
func (c *HACluster) memberConn(ctx context.Context, m *haMember) (*pgx.Conn, error) {
	return pgx.Connect(ctx, fmt.Sprintf("host=127.0.0.1 port=%d user=%s dbname=postgres sslmode=disable connect_timeout=2",
		m.pgPort, clusterUserName))
}

// streaming returns the members that stream from leader, from its
// pg_stat_replication, and those of them that are synchronous there.
func (c *HACluster) streaming(ctx context.Context, leader *haMember) (streaming, sync []string, err error) {
	conn, err := c.memberConn(ctx, leader)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT application_name, sync_state IN ('sync', 'quorum')
		FROM pg_stat_replication WHERE state = 'streaming' ORDER BY application_name`)
	if err != nil {
		return nil, nil, err
	}
	var name string
	var isSync bool
	_, err = pgx.ForEachRow(rows, []any{&name, &isSync}, func() error {
		streaming = append(streaming, name)
		if isSync {
			sync = append(sync, name)
		}
		return nil
	})
	return streaming, sync, err
}

// syncStandbys returns the members that Patroni's view of the cluster, as
// leader's REST API gives it (GET /cluster), names synchronous standbys:
// the only ones it promotes under synchronous_mode. It names one only
// once the standby is synchronous in PostgreSQL too.
func (c *HACluster) syncStandbys(ctx context.Context, leader *haMember) ([]string, error) {
	var view struct {
		Members []struct{ Name, Role string }
	}
	if err := c.getJSON(ctx, "http://127.0.0.1:"+strconv.Itoa(leader.apiPort)+"/cluster", &view); err != nil {
		return nil, err
	}
	var sync []string
	for _, m := range view.Members {
		if m.Role == "sync_standby" {
			sync = append(sync, m.Name)
		}
	}
	return sync, nil
}

// routed connects through HAProxy, as a client does, and returns the
// member it reached and whether that member takes writes.
func (c *HACluster) routed(ctx context.Context) (*haMember, bool, error) {
	conn, err := pgx.Connect(ctx, fmt.Sprintf("host=127.0.0.1 port=%d user=%s dbname=postgres sslmode=disable connect_timeout=2",
		c.haproxyPort, clusterUserName))
	if err != nil {
		return nil, false, err
	}
	defer conn.Close(context.Background())
	var port int
	var recovery bool
	if err := conn.QueryRow(ctx, `SELECT inet_server_port(), pg_is_in_recovery()`).Scan(&port, &recovery); err != nil {
		return nil, false, err
	}
	for _, m := range c.members {
		if m.pgPort == port {
			return m, !recovery, nil
		}
	}
	return nil, false, fmt.Errorf("HAProxy reached a server on port %d, which is no member's", port)
}

// WaitHealthy waits until the cluster is whole again and returns its
// leader: every member's Patroni runs, one holds the leader key, the
// others stream from it (one of them synchronously under
// [HAOptions.Synchronous]), and a new connection through HAProxy reaches
// the leader, writable. A member that was killed must have been started
// again ([HACluster.Start]), and a partition healed.
func (c *HACluster) WaitHealthy(ctx context.Context) (string, error) {
	var leader *haMember
	err := c.poll(ctx, "healthy HA cluster", func(ctx context.Context) (bool, error) {
		if !c.haproxyRunning() {
			return false, c.haproxy.exitErr()
		}
		var err error
		if leader, err = c.leader(ctx); err != nil {
			return false, err
		}
		streaming, sync, err := c.streaming(ctx, leader)
		if err != nil {
			return false, fmt.Errorf("%s: %w", leader.name, err)
		}
		if len(streaming) != len(c.members)-1 || (c.opts.Synchronous && len(sync) == 0) {
			return false, fmt.Errorf("%s streams to %v, synchronously to %v", leader.name, streaming, sync)
		}
		if c.opts.Synchronous {
			named, err := c.syncStandbys(ctx, leader)
			if err != nil || len(named) == 0 || !slices.Contains(sync, named[0]) {
				return false, fmt.Errorf("Patroni names %v synchronous standbys (%v), PostgreSQL %v", named, err, sync)
			}
		}
		m, writable, err := c.routed(ctx)
		if err != nil || m != leader || !writable {
			return false, fmt.Errorf("HAProxy reaches %v (writable %v, %v), the leader is %s", m, writable, err, leader.name)
		}
		return true, nil
	})
	if err != nil {
		return "", fmt.Errorf("%w%s", err, c.logs())
	}
	return leader.name, nil
}

func (c *HACluster) haproxyRunning() bool { return c.haproxy != nil && c.haproxy.running() }

// WaitWritable waits until a new connection through HAProxy reaches a
// member that takes writes, other than not (any member, for ""), and
// returns its name. It is what a client of the cluster sees: the end of a
// failover, as far as connecting goes.
func (c *HACluster) WaitWritable(ctx context.Context, not string) (string, error) {
	var name string
	err := c.poll(ctx, "writable member through HAProxy other than "+strconv.Quote(not), func(ctx context.Context) (bool, error) {
		m, writable, err := c.routed(ctx)
		if err != nil || !writable || m.name == not {
			return false, fmt.Errorf("reached %v, writable %v: %v", m, writable, err)
		}
		name = m.name
		return true, nil
	})
	return name, err
}

// String names the member, for messages.
func (m *haMember) String() string { return m.name }

// Candidate returns a member that Patroni may promote in place of the
// leader: the synchronous standby under [HAOptions.Synchronous] (Patroni
// promotes no other), else the first replica that streams from it.
func (c *HACluster) Candidate(ctx context.Context) (string, error) {
	leader, err := c.leader(ctx)
	if err != nil {
		return "", err
	}
	if c.opts.Synchronous {
		sync, err := c.syncStandbys(ctx, leader)
		if err != nil {
			return "", err
		}
		if len(sync) == 0 {
			return "", fmt.Errorf("Patroni names no synchronous standby of the leader %s to be promoted", leader.name)
		}
		return sync[0], nil
	}
	streaming, _, err := c.streaming(ctx, leader)
	if err != nil {
		return "", err
	}
	if len(streaming) == 0 {
		return "", fmt.Errorf("no replica streams from the leader %s to be promoted", leader.name)
	}
	return streaming[0], nil
}

// Kill kills member name as a crash of its machine would: SIGKILL, at
// once, to its Patroni and to every process of its PostgreSQL. It returns
// once they are gone. Its data directory stays; [HACluster.Start] starts
// its Patroni again, which brings it back as a replica.
func (c *HACluster) Kill(name string) error {
	m, err := c.member(name)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.patroni == nil {
		return fmt.Errorf("pgtest: %s was killed already", name)
	}
	pid, pidErr := postmasterPID(m.c.dataDir)
	m.patroni.signalKill()
	if pidErr == nil {
		if err := killGroupOf(pid); err != nil && processAlive(pid) {
			return fmt.Errorf("pgtest: kill %s's PostgreSQL (postmaster %d): %w", name, pid, err)
		}
	}
	<-m.patroni.exited
	m.patroni = nil
	deadline := time.Now().Add(10 * time.Second)
	for pidErr == nil && processAlive(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: %s's postmaster %d still runs 10 s after SIGKILL", name, pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// Start starts the Patroni of member name again, after [HACluster.Kill]:
// it starts PostgreSQL as a replica of the leader, rewinding it first if
// it had been a leader. [HACluster.WaitHealthy] waits until it streams.
func (c *HACluster) Start(name string) error {
	m, err := c.member(name)
	if err != nil {
		return err
	}
	return c.startPatroni(m)
}

// Switchover has Patroni hand the leader role from leader to candidate
// (patronictl switchover): the leader stops PostgreSQL, candidate is
// promoted, and the former leader comes back as its replica. It returns
// when patronictl does, once candidate leads.
func (c *HACluster) Switchover(ctx context.Context, leader, candidate string) error {
	return c.patronictl(ctx, "switchover", "--leader", leader, "--candidate", candidate, "--force")
}

// Failover has Patroni promote candidate (patronictl failover), the
// command for a cluster without a healthy leader; on a healthy one
// Patroni 3.0 demotes the leader first, as for a switchover.
func (c *HACluster) Failover(ctx context.Context, candidate string) error {
	return c.patronictl(ctx, "failover", "--candidate", candidate, "--force")
}

func (c *HACluster) patronictl(ctx context.Context, args ...string) error {
	out, err := runCommand(ctx, haCtlTimeout, nil, c.dir, childEnv(), c.bins.patronictl, append([]string{"-c", c.ctlConfig}, args...)...)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	// patronictl exits 0 after some failures, saying so ("Switchover
	// failed, details: 412, ..."); on success it says "Successfully
	// switched over" or "Successfully failed over".
	if s := string(out); strings.Contains(s, " failed, details") {
		return fmt.Errorf("pgtest: patronictl %s: %s", args[0], strings.TrimSpace(s))
	}
	return nil
}

// Partition cuts member name off the network: nothing reaches its
// PostgreSQL or its REST API (HAProxy's checks and connections, the other
// members' replication and Patroni), and its Patroni no longer reaches
// etcd. Connections already open stay open and carry nothing, as in a
// real partition. Its Patroni, cut off from etcd, demotes its PostgreSQL
// within the leader key's TTL, and the others elect a new leader once the
// key has expired. [HACluster.Heal] ends the partition.
func (c *HACluster) Partition(name string) error {
	m, err := c.member(name)
	if err != nil {
		return err
	}
	m.pg.Cut()
	m.api.Cut()
	m.dcs.Cut()
	return nil
}

// Heal ends a partition of member name: its links carry what they held
// back, and then everything else.
func (c *HACluster) Heal(name string) error {
	m, err := c.member(name)
	if err != nil {
		return err
	}
	m.dcs.Heal()
	m.api.Heal()
	m.pg.Heal()
	return nil
}

// CreateDatabase creates a database with idem's migrations on the leader
// ([Server.CreateDatabase] on [HACluster.Server]) and returns a connection
// string for it through HAProxy, once every replica has replayed its
// creation. The database goes when the cluster does.
func (c *HACluster) CreateDatabase(ctx context.Context) (string, error) {
	connString, _, err := c.Server.CreateDatabase(ctx)
	if err != nil {
		return "", err
	}
	return connString, c.WaitReplayed(ctx)
}

// MultiHostConnString returns a connection string for the database of
// connString (one that [HACluster.CreateDatabase] returned) that names
// every member instead of HAProxy, as a client without a proxy does:
// target_session_attrs=read-write, so that pgx skips the members that
// do not take writes, and connect_timeout=2 s, which pgx applies to each
// member in turn. It reaches the members through their links, so a
// partition cuts it off from the member as it cuts HAProxy off.
func (c *HACluster) MultiHostConnString(connString string) (string, error) {
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		return "", fmt.Errorf("parse connection string: %w", err)
	}
	hosts := make([]string, len(c.members))
	ports := make([]string, len(c.members))
	for i, m := range c.members {
		hosts[i], ports[i] = "127.0.0.1", strconv.Itoa(m.pg.Port())
	}
	return fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable target_session_attrs=read-write connect_timeout=2",
		strings.Join(hosts, ","), strings.Join(ports, ","), clusterUserName, cfg.Database), nil
}

// WaitReplayed waits until every running replica has replayed the
// leader's WAL as far as it went when WaitReplayed was called: what was
// committed before is on every member.
func (c *HACluster) WaitReplayed(ctx context.Context) error {
	leader, err := c.leader(ctx)
	if err != nil {
		return err
	}
	conn, err := c.memberConn(ctx, leader)
	if err != nil {
		return err
	}
	var lsn string
	err = conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn)
	conn.Close(context.Background())
	if err != nil {
		return err
	}
	for _, m := range c.members {
		if m == leader || c.patroniOf(m) == nil {
			continue
		}
		err := c.poll(ctx, m.name+" to replay the leader's WAL up to "+lsn, func(ctx context.Context) (bool, error) {
			conn, err := c.memberConn(ctx, m)
			if err != nil {
				return false, err
			}
			defer conn.Close(context.Background())
			var done bool
			err = conn.QueryRow(ctx, `SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, lsn).Scan(&done)
			return done, err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// logs returns the end of every log of the cluster, for an error message.
func (c *HACluster) logs() string {
	var b strings.Builder
	for _, m := range c.members {
		fmt.Fprintf(&b, "\n--- %s: Patroni log\n%s\n--- %s: PostgreSQL log\n%s", m.name, tail(m.log, 2000), m.name, tail(m.c.logFile, 1500))
	}
	for _, d := range []*daemon{c.etcd, c.haproxy} {
		if d != nil {
			fmt.Fprintf(&b, "\n--- %s log\n%s", d.name, tail(d.logFile, 1500))
		}
	}
	return b.String()
}

// Logs returns the end of each member's Patroni and PostgreSQL logs, and
// of etcd's and HAProxy's, for a test that failed.
func (c *HACluster) Logs() string { return c.logs() }

// Close stops every member's Patroni and PostgreSQL, HAProxy and etcd,
// and removes their directories. It may be called more than once.
func (c *HACluster) Close() error {
	c.closeOnce.Do(func() {
		var errs []error
		if c.Server != nil {
			errs = append(errs, c.Server.Close())
		}
		for _, m := range c.members {
			c.mu.Lock()
			if m.patroni != nil {
				m.patroni.kill()
				m.patroni = nil
			}
			c.mu.Unlock()
			for _, l := range []*Link{m.pg, m.api, m.dcs} {
				if l != nil {
					l.Close()
				}
			}
			// pg_ctl stop only if a postmaster runs: one that was killed
			// leaves its postmaster.pid behind.
			if pid, err := postmasterPID(m.c.dataDir); err != nil || !processAlive(pid) {
				m.c.started = false
			}
			errs = append(errs, m.c.stop())
		}
		for _, d := range []*daemon{c.haproxy, c.etcd} {
			if d != nil {
				errs = append(errs, d.stop())
			}
		}
		errs = append(errs, os.RemoveAll(c.dir))
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// NewHA starts an HA cluster ([StartHA]) for tb and stops it when tb has
// finished; when tb failed, it logs the end of the cluster's logs first.
// It fails tb, never skips it, when the cluster cannot be started (a
// missing program included); under go test -short it skips tb, as
// [NewDatabase] does.
func NewHA(tb testing.TB, opts HAOptions) *HACluster {
	tb.Helper()
	if testing.Short() {
		tb.Skip("pgtest: starts an HA cluster (Patroni, etcd, HAProxy), so it runs without -short")
	}
	c, err := StartHA(context.Background(), opts)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("pgtest: the HA cluster's logs:%s", c.logs())
		}
		if err := c.Close(); err != nil {
			tb.Errorf("pgtest: stop the HA cluster: %v", err)
		}
	})
	return c
}
