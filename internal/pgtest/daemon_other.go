//go:build !linux

package pgtest

import "syscall"

// daemonProcAttr runs a daemon (PgBouncer, etcd, Patroni, HAProxy) as u
// (nil: as this process's user), in a new session if setsid. Only Linux
// can tie a daemon's life to this process's; elsewhere a test binary that
// is killed leaves it running.
func daemonProcAttr(u *osUser, setsid bool) *syscall.SysProcAttr { return sysProcAttr(u, setsid) }
