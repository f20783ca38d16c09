//go:build !unix

package pgtest

import (
	"io/fs"
	"syscall"
)

// clusterSupported is false: a throwaway cluster listens on a Unix socket
// and runs as another user when the process runs as root.
const clusterSupported = false

func sysProcAttr(*osUser, bool) *syscall.SysProcAttr { return nil }

func ownedBy(fs.FileInfo, *osUser) bool { return false }
