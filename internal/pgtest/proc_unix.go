//go:build unix

package pgtest

import (
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
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

// killGroup sends SIGKILL to the process group that pid leads, or to pid
// alone when it leads none.
func killGroup(pid int) error {
	if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid {
		return syscall.Kill(-pid, syscall.SIGKILL)
	}
	return syscall.Kill(pid, syscall.SIGKILL)
}

// processAlive reports whether pid runs; a zombie, which waits only for its
// parent to reap it, does not (on Linux, where /proc tells).
func processAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'Z' {
			return false
		}
	}
	return true
}

// killGroupOf sends SIGKILL to every process of the process group pid
// belongs to (which pid need not lead), or to pid alone when that group is
// this process's own.
func killGroupOf(pid int) error {
	pgid, err := syscall.Getpgid(pid)
	if err != nil {
		return err
	}
	if pgid == syscall.Getpgrp() {
		return syscall.Kill(pid, syscall.SIGKILL)
	}
	return syscall.Kill(-pgid, syscall.SIGKILL)
}
