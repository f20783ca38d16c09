package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuSample is the CPU time used so far by this process and by the whole
// machine. Their difference over a measurement is, on a machine that runs
// nothing else, PostgreSQL's share.
type cpuSample struct {
	self, machine time.Duration
	ok            bool
}

func sampleCPU() cpuSample {
	var s cpuSample
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return s
	}
	s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return s
	}
	// user nice system idle iowait irq softirq steal: all but idle and
	// iowait are busy. The unit is USER_HZ, 100 on Linux.
	var busy int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 || i >= 8 {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return s
		}
		busy += n
	}
	s.machine = time.Duration(busy) * 10 * time.Millisecond
	s.ok = true
	return s
}
