package main

import (
	"os"
	"syscall"
	"time"
	"unsafe"
)

// timer waits until a point in time, for the delay proxy's writers.
//
// On Linux it is a timerfd that the runtime's network poller watches.
// time.Sleep and time.Timer will not do: when the process has nothing else
// to run, the runtime waits for its next timer in epoll_wait, whose timeout
// is in whole milliseconds, so a 100 µs sleep takes about 1.1 ms, and a
// 0.2 ms round trip would come out near 2 ms. The timerfd wakes the poller
// within tens of microseconds (the proxy's round-trip test checks it).
type timer struct {
	f  *os.File
	fd uintptr
}

// Linux's CLOCK_MONOTONIC, the clock of Go's monotonic readings.
const clockMonotonic = 1

// itimerspec is struct itimerspec of timerfd_settime(2).
type itimerspec struct {
	interval, value syscall.Timespec
}

func newTimer() (*timer, error) {
	fd, _, errno := syscall.Syscall(syscall.SYS_TIMERFD_CREATE, clockMonotonic, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return nil, os.NewSyscallError("timerfd_create", errno)
	}
	// A non-blocking descriptor: os.File reads it through the poller.
	return &timer{f: os.NewFile(fd, "timerfd"), fd: fd}, nil
}

// sleepUntil returns once due has passed, never before.
func (t *timer) sleepUntil(due time.Time) error {
	var buf [8]byte // the number of expirations
	for {
		d := time.Until(due)
		if d <= 0 {
			return nil
		}
		spec := itimerspec{value: syscall.NsecToTimespec(d.Nanoseconds())}
		if _, _, errno := syscall.Syscall6(syscall.SYS_TIMERFD_SETTIME, t.fd, 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0); errno != 0 {
			return os.NewSyscallError("timerfd_settime", errno)
		}
		if _, err := t.f.Read(buf[:]); err != nil {
			return err
		}
	}
}

func (t *timer) close() error { return t.f.Close() }
