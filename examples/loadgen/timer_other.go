//go:build !linux

package main

import "time"

// timer waits until a point in time, for the delay proxy's writers. Outside
// Linux it is time.Sleep, as precise as the runtime's poller makes it there
// (kqueue takes its timeout in nanoseconds).
type timer struct{}

func newTimer() (*timer, error) { return &timer{}, nil }

// sleepUntil returns once due has passed, never before.
func (*timer) sleepUntil(due time.Time) error {
	for d := time.Until(due); d > 0; d = time.Until(due) {
		time.Sleep(d)
	}
	return nil
}

func (*timer) close() error { return nil }
