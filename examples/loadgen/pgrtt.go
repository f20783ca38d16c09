package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// parseRTTs parses -pg-rtt: one round-trip time or a comma-separated list,
// each a Go duration ("0", "200us", "1ms").
func parseRTTs(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range splitList(s) {
		d, err := time.ParseDuration(f)
		if err != nil {
			return nil, fmt.Errorf("-pg-rtt: %w", err)
		}
		if d < 0 {
			return nil, fmt.Errorf("-pg-rtt: %v is negative", d)
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-pg-rtt: no round-trip time in %q", s)
	}
	return out, nil
}

// rttLabel names a round-trip time for the report: "loopback" for 0, which
// adds no delay to however the server is reached.
func rttLabel(d time.Duration) string {
	if d == 0 {
		return "loopback"
	}
	return d.String()
}

// pgTCPAddr returns the TCP address of the PostgreSQL server that
// connString reaches, for the delay proxy to dial: addr when it is set
// (-pg-addr); else connString's own host and port when it names a TCP
// host; else, for a server reached through a Unix socket, the server's TCP
// listener as listen_addresses and port give it, preferring 127.0.0.1. A
// server that listens on no TCP address is an error.
func pgTCPAddr(ctx context.Context, connString, addr string) (string, error) {
	if addr != "" {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return "", fmt.Errorf("-pg-addr: %w", err)
		}
		return addr, nil
	}
	cc, err := pgx.ParseConfig(connString)
	if err != nil {
		return "", err
	}
	if network, a := pgconn.NetworkAddress(cc.Host, cc.Port); network == "tcp" {
		return a, nil
	}
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var listen, port string
	if err := conn.QueryRow(ctx, "SELECT current_setting('listen_addresses'), current_setting('port')").Scan(&listen, &port); err != nil {
		return "", fmt.Errorf("find PostgreSQL's TCP listener: %w", err)
	}
	host, ok := tcpListenHost(listen)
	if !ok {
		return "", fmt.Errorf("-pg-rtt needs PostgreSQL over TCP, but the server at %s listens on no TCP address (listen_addresses = '%s'): set listen_addresses in postgresql.conf, or point -database-url or -pg-addr at a server that listens on TCP", cc.Host, listen)
	}
	return net.JoinHostPort(host, port), nil
}

// tcpListenHost picks the host to dial among listen_addresses: 127.0.0.1
// when the server listens on it (or on every address, or on localhost),
// else ::1 likewise, else the first address listed.
func tcpListenHost(listen string) (string, bool) {
	var first string
	v6 := false
	for _, a := range splitList(listen) {
		switch {
		case a == "*" || a == "0.0.0.0" || a == "localhost" || strings.HasPrefix(a, "127."):
			return "127.0.0.1", true
		case a == "::" || a == "::1":
			v6 = true
		}
		if first == "" {
			first = a
		}
	}
	if v6 {
		return "::1", true
	}
	return first, first != ""
}

// throughProxy makes cc, and every fallback pgx would try after it,
// connect to the delay proxy at addr instead of the server. TLS settings
// stay as they were: the proxy forwards the bytes as they come.
func throughProxy(cc *pgconn.Config, addr *net.TCPAddr) {
	cc.Host, cc.Port = addr.IP.String(), uint16(addr.Port)
	for _, f := range cc.Fallbacks {
		f.Host, f.Port = cc.Host, cc.Port
	}
}

// pingP50 returns the median time of an empty query on a connection made
// from cc: the round trip the scenarios' statements meet, plus the least
// work PostgreSQL does for one.
func pingP50(ctx context.Context, cc *pgx.ConnConfig) (time.Duration, error) {
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return 0, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	const n = 101
	times := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if err := conn.PgConn().Ping(ctx); err != nil {
			return 0, err
		}
		times = append(times, time.Since(t0))
	}
	sortDurations(times)
	return percentile(times, 50), nil
}
