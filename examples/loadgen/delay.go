package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// delayProxy is a TCP proxy on 127.0.0.1 that forwards every connection it
// accepts to one address and delays each direction by half a round-trip
// time, so that the scenarios meet PostgreSQL at a network's latency rather
// than loopback's.
//
// It delays, it does not throttle: bytes read at time t are written at
// t + rtt/2, in order, while later bytes keep being read meanwhile. A
// pipelined batch therefore costs one round trip and n statements sent one
// after the other cost n, as on a network with that latency and ample
// bandwidth. Each direction of a connection has a reader goroutine, which
// timestamps each chunk it reads into a queue, and a writer goroutine,
// which waits until the chunk at the head of the queue is due and writes
// it.
//
// An end of file on one side becomes, once due, a half-close (CloseWrite)
// of the other, so that a peer that stops sending can still be answered.
// When both directions have ended, or on any other error on either side
// (a reset, a failed write), both connections are closed.
type delayProxy struct {
	ln     *net.TCPListener
	target string
	delay  time.Duration // one way: half the round trip

	ctx    context.Context // canceled by Close, ends dials under way
	cancel context.CancelFunc

	mu     sync.Mutex
	links  map[*link]struct{}
	closed bool
	wg     sync.WaitGroup // the accept loop and every connection's goroutines
}

// queuedChunks is how many chunks a direction holds while they wait to be
// due; only beyond it does a reader wait for the writer, as a sender waits
// for a full TCP window.
const queuedChunks = 256

// newDelayProxy starts a proxy on 127.0.0.1 (on a port of the system's
// choosing, see [delayProxy.addr]) that forwards to target, a TCP address,
// with round-trip time rtt. Close stops it.
func newDelayProxy(target string, rtt time.Duration) (*delayProxy, error) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &delayProxy{
		ln:     ln,
		target: target,
		delay:  rtt / 2,
		ctx:    ctx,
		cancel: cancel,
		links:  map[*link]struct{}{},
	}
	p.wg.Go(p.accept)
	return p, nil
}

// addr is the address the proxy listens on.
func (p *delayProxy) addr() *net.TCPAddr { return p.ln.Addr().(*net.TCPAddr) }

// Close stops accepting, closes every connection at once (whatever data was
// still waiting to be due is dropped), and returns when all of the proxy's
// goroutines have ended.
func (p *delayProxy) Close() error {
	p.mu.Lock()
	p.closed = true
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.cancel()
	for _, l := range links {
		l.abort()
	}
	p.wg.Wait()
	return err
}

// open returns how many connections the proxy holds.
func (p *delayProxy) open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

func (p *delayProxy) accept() {
	for {
		c, err := p.ln.AcceptTCP()
		if err != nil {
			// Closed, or out of file descriptors: refuse the
			// connections that follow rather than leave them hanging.
			_ = p.ln.Close()
			return
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

// serve forwards between client and the target until both directions have
// ended.
func (p *delayProxy) serve(client *net.TCPConn) {
	var d net.Dialer
	sc, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	l := &link{client: client, server: sc.(*net.TCPConn), delay: p.delay, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.abort()
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()

	var wg sync.WaitGroup
	l.forward(&wg, l.client, l.server)
	l.forward(&wg, l.server, l.client)
	wg.Wait()
	l.abort()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// link is one proxied connection: the client's and the target's.
type link struct {
	client, server *net.TCPConn
	delay          time.Duration
	done           chan struct{} // closed by abort
	once           sync.Once
}

// chunk is what one read returned, and when it is due on the other side.
type chunk struct {
	data []byte
	eof  bool // the reader reached end of file: half-close the other side
	due  time.Time
}

// abort closes both connections, which ends every goroutine of the link.
func (l *link) abort() {
	l.once.Do(func() {
		close(l.done)
		_ = l.client.Close()
		_ = l.server.Close()
	})
}

// forward starts the reader and the writer of the direction src → dst.
func (l *link) forward(wg *sync.WaitGroup, src, dst *net.TCPConn) {
	q := make(chan chunk, queuedChunks)
	wg.Go(func() { l.read(src, q) })
	wg.Go(func() { l.write(dst, q) })
}

func (l *link) read(src *net.TCPConn, q chan<- chunk) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		due := time.Now().Add(l.delay)
		if n > 0 {
			select {
			case q <- chunk{data: bytes.Clone(buf[:n]), due: due}:
			case <-l.done:
				return
			}
		}
		switch {
		case errors.Is(err, io.EOF):
			select {
			case q <- chunk{eof: true, due: due}:
			case <-l.done:
			}
			return
		case err != nil:
			l.abort()
			return
		}
	}
}

func (l *link) write(dst *net.TCPConn, q <-chan chunk) {
	t, err := newTimer()
	if err != nil {
		l.abort()
		return
	}
	defer func() { _ = t.close() }()
	for {
		var c chunk
		select {
		case c = <-q:
		case <-l.done:
			return
		}
		if err := t.sleepUntil(c.due); err != nil {
			l.abort()
			return
		}
		if c.eof {
			// If dst is gone already, its reader has seen to it.
			_ = dst.CloseWrite()
			return
		}
		if _, err := dst.Write(c.data); err != nil {
			l.abort()
			return
		}
	}
}
