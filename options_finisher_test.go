package idem_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store/memory"
)

// TestNewFinisherRefusesValuesItDoesNotTake: an option given a value it
// does not take fails NewFinisher with an error naming the option; a zero
// grace, which means none, does not.
func TestNewFinisherRefusesValuesItDoesNotTake(t *testing.T) {
	e, err := idem.New(memory.New())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		opt  idem.FinisherOption
		want string // in the error; "" for none
	}{
		{idem.WithInterval(0), "WithInterval(0s)"},
		{idem.WithInterval(-time.Second), "WithInterval(-1s)"},
		{idem.WithGrace(-time.Second), "WithGrace(-1s)"},
		{idem.WithBatchSize(0), "WithBatchSize(0)"},
		{idem.WithMaxAttempts(-1), "WithMaxAttempts(-1)"},
		{idem.WithAttemptTimeout(0), "WithAttemptTimeout(0s)"},
		{idem.WithGrace(0), ""},
		{idem.WithInterval(time.Millisecond), ""},
	} {
		f, err := idem.NewFinisher(e, c.opt)
		switch {
		case c.want == "" && (err != nil || f == nil):
			t.Errorf("NewFinisher = %v, %v; want a finisher", f, err)
		case c.want != "" && (err == nil || f != nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("NewFinisher = %v, %v; want an error naming %s", f, err, c.want)
		}
	}
	// Every option at fault is named, in one error.
	_, err = idem.NewFinisher(e, idem.WithBatchSize(0), idem.WithMaxAttempts(0))
	if err == nil || !strings.Contains(err.Error(), "WithBatchSize") || !strings.Contains(err.Error(), "WithMaxAttempts") {
		t.Errorf("NewFinisher's error %v, want one naming WithBatchSize and WithMaxAttempts", err)
	}
}
