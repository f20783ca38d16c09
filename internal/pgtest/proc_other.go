//go:build !unix

package pgtest

import (
	"errors"
	"io/fs"
	"syscall"
)

// clusterSupported is false: a throwaway cluster listens on a Unix socket
// and runs as another user when the process runs as root.
const clusterSupported = false

func sysProcAttr(*osUser, bool) *syscall.SysProcAttr { return nil }

func ownedBy(fs.FileInfo, *osUser) bool { return false }

func killGroup(int) error { return errors.New("killing a process group needs a Unix-like system") }

func processAlive(int) bool { return false }

func killGroupOf(int) error { return errors.New("killing a process group needs a Unix-like system") }
