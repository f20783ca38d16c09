//go:build !linux

package pgtest

import "syscall"

// pgBouncerProcAttr runs PgBouncer as u (nil: as this process's user).
// Only Linux can tie PgBouncer's life to this process's; elsewhere a test
// binary that is killed leaves it running.
func pgBouncerProcAttr(u *osUser) *syscall.SysProcAttr { return sysProcAttr(u, false) }
