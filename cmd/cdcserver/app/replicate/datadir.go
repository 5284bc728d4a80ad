package replicate

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// The event store's directory is a cache (the slot is the durable log),
// by default a temporary directory of its own. A serve that is killed
// cannot remove it, and each one left the whole store behind in /tmp. So
// each holds an exclusive lock on a file in its directory for as long as
// it runs (the kernel releases it when the process dies, however it
// dies), and a start removes the temporary directories of earlier serves
// whose lock nobody holds.

// tempDirPrefix names serve's temporary directories.
const tempDirPrefix = "cdcserver-serve-"

// lockName is the file a serve holds locked in its directory.
const lockName = ".serve.lock"

// dataDirLock is a directory's lock, held until release.
type dataDirLock struct{ f *os.File }

// lockDataDir takes dir's lock, without waiting: false if another process
// holds it.
func lockDataDir(dir string) (*dataDirLock, bool, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, err
	}
	return &dataDirLock{f: f}, true, nil
}

func (l *dataDirLock) release() {
	if l != nil && l.f != nil {
		_ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
		_ = l.f.Close()
	}
}

// removeStaleTempDirs removes the temporary directories under root that
// earlier serves left (killed: nothing holds their lock), and returns
// them. A directory without a lock file is left alone: it may be one a
// serve just made and has not locked yet.
func removeStaleTempDirs(root string) []string {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var removed []string
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), tempDirPrefix) {
			continue
		}
		dir := filepath.Join(root, e.Name())
		if _, err := os.Stat(filepath.Join(dir, lockName)); err != nil {
			continue
		}
		l, ok, err := lockDataDir(dir)
		if err != nil || !ok {
			continue // a running serve's
		}
		if os.RemoveAll(dir) == nil {
			removed = append(removed, dir)
		}
		l.release()
	}
	return removed
}
