package pgtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// daemonStopTimeout bounds waiting for a daemon to exit after SIGTERM,
// before SIGKILL.
const daemonStopTimeout = 10 * time.Second

// A daemon is a long-running program the tests start (etcd, Patroni,
// HAProxy), with its output appended to a log file. It dies with the test
// binary (daemonProcAttr).
type daemon struct {
	name    string
	logFile string
	cmd     *exec.Cmd
	exited  chan struct{} // closed once cmd has been waited for
	// group: the daemon leads a process group of its own, which holds the
	// programs it runs, and kill kills them all.
	group bool
}

// startDaemon starts bin with args in dir as runAs (nil: this process's
// user), its standard output and error appended to logFile; if group, in
// a session and process group of its own.
func startDaemon(name, logFile, dir string, runAs *osUser, group bool, bin string, args ...string) (*daemon, error) {
	out, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer out.Close() // the child has its own copy
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = childEnv()
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = daemonProcAttr(runAs, group)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	d := &daemon{name: name, logFile: logFile, cmd: cmd, exited: make(chan struct{}), group: group}
	go func() {
		_ = cmd.Wait()
		close(d.exited)
	}()
	return d, nil
}

// running reports whether the daemon has not exited.
func (d *daemon) running() bool {
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// exitErr describes how the daemon exited, with the end of its log.
func (d *daemon) exitErr() error {
	return fmt.Errorf("%s exited (%v); its log:\n%s", d.name, d.cmd.ProcessState, tail(d.logFile, 3000))
}

// kill kills the daemon with SIGKILL, and the programs it runs in its
// process group, and waits until it is gone.
func (d *daemon) kill() {
	d.signalKill()
	<-d.exited
}

// signalKill sends SIGKILL to the daemon, or to its process group.
func (d *daemon) signalKill() {
	if d.group {
		_ = killGroup(d.cmd.Process.Pid)
		return
	}
	_ = d.cmd.Process.Kill()
}

// stop asks the daemon to exit with SIGTERM, and kills it if it has not
// within daemonStopTimeout.
func (d *daemon) stop() error {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		return nil
	case <-time.After(daemonStopTimeout):
		d.kill()
		return errors.New(d.name + " did not exit on SIGTERM; killed")
	}
}
