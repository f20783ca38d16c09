package pgtest

import "syscall"

// daemonProcAttr runs a daemon (PgBouncer, etcd, Patroni, HAProxy) as u
// (nil: as this process's user), in a new session if setsid, and has the
// kernel kill it when this process dies, so that a test binary that is
// killed leaves no daemon behind.
func daemonProcAttr(u *osUser, setsid bool) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setsid: setsid}
	if u != nil {
		attr.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid}
	}
	return attr
}
