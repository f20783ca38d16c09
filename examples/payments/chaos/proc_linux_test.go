package chaos

import "syscall"

// childAttr makes a server process die with the test binary, so that a
// test run that is killed leaves no server behind.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
