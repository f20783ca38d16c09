//go:build unix

package pgtest

import (
	"io/fs"
	"syscall"
)

const clusterSupported = true

// sysProcAttr returns the attributes to run a command as u (nil: as this
// process's user), in a new session if setsid.
func sysProcAttr(u *osUser, setsid bool) *syscall.SysProcAttr {
	if u == nil && !setsid {
		return nil
	}
	attr := &syscall.SysProcAttr{Setsid: setsid}
	if u != nil {
		attr.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid}
	}
	return attr
}

// ownedBy reports whether the file st describes belongs to u.
func ownedBy(st fs.FileInfo, u *osUser) bool {
	sys, ok := st.Sys().(*syscall.Stat_t)
	return ok && sys.Uid == u.uid
}
