package pgtest

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// echoServer starts a TCP server on a loopback port that echoes every
// line back, and returns its address.
func echoServer(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return lis.Addr().String()
}

// silence is how long a test waits to see that nothing arrives.
const silence = 300 * time.Millisecond

// roundTrip writes line on c and reads it back, failing t unless it comes
// back within waitLimit.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string) {
	t.Helper()
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := r.ReadString('\n')
	if err != nil || got != line+"\n" {
		t.Fatalf("read %q, %v; want %q", got, err, line)
	}
}

// quiet fails t if anything arrives on c within silence.
func quiet(t *testing.T, c net.Conn, r *bufio.Reader, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(silence))
	if got, err := r.ReadString('\n'); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: read %q, %v; want nothing", what, got, err)
	}
}

func dialLink(t *testing.T, l *Link) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// TestLinkCutHeal checks that a cut link carries nothing, on connections
// open before the cut or made during it, and closes none of them; healed,
// it delivers what it held back.
func TestLinkCutHeal(t *testing.T) {
	l, err := NewLink(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	before, rb := dialLink(t, l)
	roundTrip(t, before, rb, "first")

	l.Cut()
	if _, err := io.WriteString(before, "held\n"); err != nil {
		t.Fatal(err)
	}
	quiet(t, before, rb, "an open connection through a cut link")
	during, rd := dialLink(t, l)
	if _, err := io.WriteString(during, "new\n"); err != nil {
		t.Fatal(err)
	}
	quiet(t, during, rd, "a connection made through a cut link")

	l.Heal()
	before.SetReadDeadline(time.Now().Add(30 * time.Second))
	if got, err := rb.ReadString('\n'); err != nil || got != "held\n" {
		t.Fatalf("after the heal, the held line came back as %q, %v", got, err)
	}
	during.SetReadDeadline(time.Now().Add(30 * time.Second))
	if got, err := rd.ReadString('\n'); err != nil || got != "new\n" {
		t.Fatalf("after the heal, the line sent during the cut came back as %q, %v", got, err)
	}
	roundTrip(t, before, rb, "after")
}

// TestLinkSever checks that Sever silences the connections open at the
// time, for good, and leaves new ones alone.
func TestLinkSever(t *testing.T) {
	l, err := NewLink(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	old, ro := dialLink(t, l)
	roundTrip(t, old, ro, "first")

	l.Sever()
	if _, err := io.WriteString(old, "lost\n"); err != nil {
		t.Fatal(err)
	}
	quiet(t, old, ro, "a severed connection")
	fresh, rf := dialLink(t, l)
	roundTrip(t, fresh, rf, "fresh")
	quiet(t, old, ro, "a severed connection, once others flow")
}
