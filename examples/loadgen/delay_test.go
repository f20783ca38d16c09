package main

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// ioTimeout bounds every read and write of the tests' connections, so that
// a close the proxy fails to pass on fails the test instead of hanging it.
const ioTimeout = 10 * time.Second

// startServer serves each connection to a TCP listener on 127.0.0.1 with
// handle, until the test ends.
func startServer(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(ioTimeout))
				handle(c)
			})
		}
	})
	return ln.Addr().String()
}

// echo writes back what it reads until end of file.
func echo(c net.Conn) { _, _ = io.Copy(c, c) }

func startProxy(t *testing.T, target string, rtt time.Duration) *delayProxy {
	t.Helper()
	p, err := newDelayProxy(target, rtt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func dial(t *testing.T, p *delayProxy) *net.TCPConn {
	t.Helper()
	c, err := net.DialTCP("tcp", nil, p.addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	return c
}

// linkGoroutines counts the goroutines running a proxied connection's
// reader or writer, or the proxy's own.
func linkGoroutines() (links, proxy int) {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "main.(*link).") {
			links++
		}
		if strings.Contains(g, "main.(*delayProxy).") {
			proxy++
		}
	}
	return links, proxy
}

// waitClosed waits until p holds no connection, then checks that no
// goroutine of one is left.
func waitClosed(t *testing.T, p *delayProxy) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.open() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the proxy still holds %d connection(s)", p.open())
		}
		time.Sleep(time.Millisecond)
	}
	if links, _ := linkGoroutines(); links != 0 {
		t.Fatalf("%d goroutine(s) of closed connections still run", links)
	}
}

// closeProxy closes p and checks that none of its goroutines is left.
func closeProxy(t *testing.T, p *delayProxy) {
	t.Helper()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if links, proxy := linkGoroutines(); links+proxy != 0 {
		t.Fatalf("after Close, %d connection and %d proxy goroutine(s) still run", links, proxy)
	}
}

// TestDelayProxyRoundTrip sends one small message at a time through the
// proxy to an echo server: each answer takes at least the round-trip time,
// and, at best, not much longer, also well under a millisecond (which
// time.Sleep could not do: see timer).
func TestDelayProxyRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		rtt, margin time.Duration
	}{
		{300 * time.Microsecond, 500 * time.Microsecond},
		{10 * time.Millisecond, 5 * time.Millisecond},
	} {
		t.Run(tc.rtt.String(), func(t *testing.T) {
			p := startProxy(t, startServer(t, echo), tc.rtt)
			c := dial(t, p)
			msg, got := []byte("ping"), make([]byte, 4)
			best := time.Hour
			for range 20 {
				t0 := time.Now()
				if _, err := c.Write(msg); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(c, got); err != nil {
					t.Fatal(err)
				}
				d := time.Since(t0)
				if d < tc.rtt {
					t.Fatalf("an answer came after %v, before the round-trip time %v", d, tc.rtt)
				}
				if !bytes.Equal(got, msg) {
					t.Fatalf("echo %q, want %q", got, msg)
				}
				best = min(best, d)
			}
			if best >= tc.rtt+tc.margin {
				t.Errorf("the fastest of 20 round trips took %v, want less than %v + %v", best, tc.rtt, tc.margin)
			}
			closeProxy(t, p)
		})
	}
}

// TestDelayProxyPipelines sends messages one after another without waiting
// for answers: each answer arrives one round trip after its message, not
// after the answers before it, so the whole exchange costs about one round
// trip, not one per message.
func TestDelayProxyPipelines(t *testing.T) {
	const (
		rtt  = 40 * time.Millisecond
		n    = 10
		size = 8
	)
	p := startProxy(t, startServer(t, echo), rtt)
	c := dial(t, p)

	sent := make([]time.Time, n)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range n {
			var msg [size]byte
			binary.BigEndian.PutUint64(msg[:], uint64(i))
			sent[i] = time.Now()
			if _, err := c.Write(msg[:]); err != nil {
				t.Error(err)
				return
			}
			// Apart, so that the proxy reads each message on its own.
			time.Sleep(2 * time.Millisecond)
		}
	})
	start := time.Now()
	arrived := make([]time.Time, n)
	for i := range n {
		var got [size]byte
		if _, err := io.ReadFull(c, got[:]); err != nil {
			t.Fatal(err)
		}
		arrived[i] = time.Now()
		if v := binary.BigEndian.Uint64(got[:]); v != uint64(i) {
			t.Fatalf("answer %d is message %d", i, v)
		}
	}
	wg.Wait()
	for i := range n {
		if d := arrived[i].Sub(sent[i]); d < rtt {
			t.Errorf("message %d came back after %v, before the round-trip time %v", i, d, rtt)
		}
	}
	// Throttled, one message per round trip or per delay, the last answer
	// would come n round trips (or n/2) after the first message.
	if d := arrived[n-1].Sub(sent[n-1]); d > rtt+20*time.Millisecond {
		t.Errorf("the last answer came %v after its message, want about %v", d, rtt)
	}
	if d := time.Since(start); d > 2*rtt+20*time.Millisecond {
		t.Errorf("%d pipelined messages took %v, want about one round trip (%v) plus the time spent sending", n, d, rtt)
	}
}

// TestDelayProxyCarriesBulk sends more than the sockets buffer, while the
// answers stream back, and gets every byte back in order.
func TestDelayProxyCarriesBulk(t *testing.T) {
	p := startProxy(t, startServer(t, echo), 2*time.Millisecond)
	c := dial(t, p)
	data := make([]byte, 8<<20)
	_, _ = rand.Read(data)
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := c.Write(data); err != nil {
			t.Error(err)
		}
		if err := c.CloseWrite(); err != nil {
			t.Error(err)
		}
	})
	got, err := io.ReadAll(c)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("got %d bytes back, want the %d sent, in order", len(got), len(data))
	}
	waitClosed(t, p)
	closeProxy(t, p)
}

// TestDelayProxyCloses closes connections from either side, fully or half,
// and checks that the other side learns of it through the proxy and that
// the proxy's goroutines for the connection end.
func TestDelayProxyCloses(t *testing.T) {
	const rtt = 2 * time.Millisecond

	t.Run("client closes", func(t *testing.T) {
		sawEOF := make(chan error, 1)
		p := startProxy(t, startServer(t, func(c net.Conn) {
			_, err := io.Copy(io.Discard, c)
			sawEOF <- err
		}), rtt)
		c := dial(t, p)
		if _, err := c.Write([]byte("last words")); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-sawEOF; err != nil {
			t.Fatalf("the server's read ended with %v, want end of file", err)
		}
		waitClosed(t, p)
		closeProxy(t, p)
	})

	t.Run("client half-closes", func(t *testing.T) {
		p := startProxy(t, startServer(t, func(c net.Conn) {
			b, err := io.ReadAll(c)
			if err != nil {
				return
			}
			// The client stopped sending; it is still listening.
			_, _ = c.Write(append([]byte("got "), b...))
		}), rtt)
		c := dial(t, p)
		if _, err := c.Write([]byte("question")); err != nil {
			t.Fatal(err)
		}
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c)
		if err != nil || string(got) != "got question" {
			t.Fatalf("read %q, %v after half-closing; want the answer and end of file", got, err)
		}
		_ = c.Close()
		waitClosed(t, p)
		closeProxy(t, p)
	})

	t.Run("server closes", func(t *testing.T) {
		p := startProxy(t, startServer(t, func(c net.Conn) {
			_, _ = c.Write([]byte("bye"))
		}), rtt)
		c := dial(t, p)
		got, err := io.ReadAll(c)
		if err != nil || string(got) != "bye" {
			t.Fatalf("read %q, %v; want the server's last words and end of file", got, err)
		}
		// The client's side is still open; closing it ends the link.
		_ = c.Close()
		waitClosed(t, p)
		closeProxy(t, p)
	})

	t.Run("server resets", func(t *testing.T) {
		p := startProxy(t, startServer(t, func(c net.Conn) {
			_ = c.(*net.TCPConn).SetLinger(0) // close with a reset
		}), rtt)
		c := dial(t, p)
		_, err := io.ReadAll(c)
		if err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
			t.Fatalf("read ended with %v", err)
		}
		waitClosed(t, p)
		closeProxy(t, p)
	})

	t.Run("proxy closes", func(t *testing.T) {
		serverDone := make(chan struct{})
		p := startProxy(t, startServer(t, func(c net.Conn) {
			defer close(serverDone)
			_, _ = io.Copy(io.Discard, c)
		}), rtt)
		c := dial(t, p)
		if _, err := c.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		// Wait until the proxy holds the connection.
		deadline := time.Now().Add(5 * time.Second)
		for p.open() == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		closeProxy(t, p)
		if _, err := io.ReadAll(c); err != nil && !strings.Contains(err.Error(), "reset") {
			t.Fatalf("read after the proxy closed ended with %v", err)
		}
		<-serverDone
	})

	t.Run("target refuses", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		target := ln.Addr().String()
		_ = ln.Close()
		p := startProxy(t, target, rtt)
		c := dial(t, p)
		if _, err := io.ReadAll(c); err != nil && !strings.Contains(err.Error(), "reset") {
			t.Fatalf("read ended with %v", err)
		}
		waitClosed(t, p)
		closeProxy(t, p)
	})
}
