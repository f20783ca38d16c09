package pgtest

import "syscall"

// pgBouncerProcAttr runs PgBouncer as u (nil: as this process's user) and
// has the kernel kill it when this process dies, so that a test binary that
// is killed leaves no PgBouncer behind.
func pgBouncerProcAttr(u *osUser) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if u != nil {
		attr.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid}
	}
	return attr
}
