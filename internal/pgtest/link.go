package pgtest

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A Link is a TCP proxy on a loopback port in front of one address, for
// tests of what happens when the network fails. [Link.Cut] makes it
// forward nothing in either direction and connect nothing new, yet close
// nothing, as a network partition drops packets without telling either
// end; [Link.Heal] delivers what it held back, as TCP retransmits after a
// partition, and then everything else. [Link.Sever] silences, for good,
// only the connections open at the time, as when the server they reached
// vanished from the network while new connections reach another. An
// [HACluster] puts one in front of each link of a member that a partition
// of the member severs.
//
// It stands in for iptables rules on loopback ports, which need root and
// CAP_NET_ADMIN, change the firewall of the whole machine (and of whatever
// else runs on it) and exist only on Linux; a Link needs none of that and
// affects exactly the connections that go through it.
type Link struct {
	lis     net.Listener
	network string
	target  string

	mu     sync.Mutex
	healed chan struct{} // closed while the link forwards
	closed chan struct{} // closed by Close
	conns  map[net.Conn]struct{}
	open   map[*linked]struct{} // the connections Sever would silence
	wg     sync.WaitGroup
}

// linked is one connection through a link.
type linked struct {
	severed chan struct{} // closed by Sever
}

// linkDialTimeout bounds connecting to the link's target.
const linkDialTimeout = 5 * time.Second

// NewLink starts a link on a free loopback port in front of target, a
// TCP host:port, forwarding. The caller must call [Link.Close].
func NewLink(target string) (*Link, error) {
	return newLink("tcp", target)
}

// LinkTo starts a link in front of the PostgreSQL server that connString
// reaches (over TCP or a Unix socket) and returns it with a connection
// string like connString that goes through it. The link is closed when tb
// has finished.
func LinkTo(tb testing.TB, connString string) (*Link, string) {
	tb.Helper()
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		tb.Fatalf("pgtest: parse connection string: %v", err)
	}
	network, target := "tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if strings.HasPrefix(cfg.Host, "/") {
		network, target = "unix", filepath.Join(cfg.Host, fmt.Sprintf(".s.PGSQL.%d", cfg.Port))
	}
	l, err := newLink(network, target)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(l.Close)
	// As withDatabase does: the last of a repeated setting counts.
	through := strings.TrimLeft(connString+" host=127.0.0.1 port="+strconv.Itoa(l.Port()), " ")
	if isURL(connString) {
		sep := "?"
		if strings.Contains(connString, "?") {
			sep = "&"
		}
		through = connString + sep + "host=127.0.0.1&port=" + strconv.Itoa(l.Port())
	}
	if got, err := pgconn.ParseConfig(through); err != nil || got.Host != "127.0.0.1" || int(got.Port) != l.Port() {
		tb.Fatalf("pgtest: a connection string through the link: %q reaches %v (%v)", through, got, err)
	}
	return l, through
}

func newLink(network, target string) (*Link, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &Link{
		lis:     lis,
		network: network,
		target:  target,
		healed:  make(chan struct{}),
		closed:  make(chan struct{}),
		conns:   make(map[net.Conn]struct{}),
		open:    make(map[*linked]struct{}),
	}
	close(l.healed)
	l.wg.Add(1)
	go l.serve()
	return l, nil
}

// Port returns the loopback port the link listens on.
func (l *Link) Port() int { return l.lis.Addr().(*net.TCPAddr).Port }

// Addr returns the link's address, 127.0.0.1:port.
func (l *Link) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(l.Port())) }

// Cut stops the link forwarding, until [Link.Heal].
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.healed:
		l.healed = make(chan struct{})
	default: // cut already
	}
}

// Heal makes a cut link forward again, what it held back first.
func (l *Link) Heal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.healed:
	default:
		close(l.healed)
	}
}

// Sever silences the connections through the link that are open now: they
// carry nothing more in either direction, and stay open, until
// [Link.Close]. Connections made afterwards are forwarded as before.
func (l *Link) Sever() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.open {
		close(c.severed)
		delete(l.open, c)
	}
}

// forward waits until the link may carry c's bytes; false means never:
// the link was closed, or c severed (then it waits for the close).
func (l *Link) forward(c *linked) bool {
	l.mu.Lock()
	healed := l.healed
	l.mu.Unlock()
	select {
	case <-c.severed:
		<-l.closed
		return false
	case <-l.closed:
		return false
	case <-healed:
	}
	select {
	case <-c.severed:
		<-l.closed
		return false
	default:
		return true
	}
}

// Close stops the link and closes every connection through it.
func (l *Link) Close() {
	l.mu.Lock()
	select {
	case <-l.closed:
		l.mu.Unlock()
		return
	default:
	}
	close(l.closed)
	l.lis.Close()
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

// track adds c to the connections Close closes, or closes it and returns
// false if the link is closed.
func (l *Link) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.closed:
		c.Close()
		return false
	default:
		l.conns[c] = struct{}{}
		return true
	}
}

func (l *Link) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	c.Close()
}

func (l *Link) serve() {
	defer l.wg.Done()
	for {
		c, err := l.lis.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if !l.track(c) {
			return
		}
		l.wg.Add(1)
		go l.handle(c)
	}
}

// handle connects c to the target, once the link forwards, and copies
// between them until either end closes.
func (l *Link) handle(c net.Conn) {
	defer l.wg.Done()
	defer l.untrack(c)
	lc := &linked{severed: make(chan struct{})}
	l.mu.Lock()
	l.open[lc] = struct{}{}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.open, lc)
		l.mu.Unlock()
	}()
	if !l.forward(lc) {
		return
	}
	t, err := net.DialTimeout(l.network, l.target, linkDialTimeout)
	if err != nil {
		return // the client sees its connection closed, as a refused one
	}
	if !l.track(t) {
		return
	}
	defer l.untrack(t)
	done := make(chan struct{}, 2)
	go func() { l.pipe(lc, t, c); done <- struct{}{} }()
	go func() { l.pipe(lc, c, t); done <- struct{}{} }()
	<-done
	// One end closed: close both, once the link would have carried the
	// close across.
	l.forward(lc)
	c.Close()
	t.Close()
	<-done
}

// pipe copies from src to dst, holding what it read while the link is
// cut, and dropping it once c is severed.
func (l *Link) pipe(c *linked, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !l.forward(c) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
