package sqlite

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// One kernel per database file. The single writer's group commit, its row
// cache and the in-process notifier all assume that nothing else writes the
// file; two `rebuno dev` on one file would also race their migrations. So
// Open takes an exclusive lock on a file beside the database (flock, which the
// operating system releases when the process dies, kill -9 included) and
// writes its pid into it, so that a second process can say who holds it.

// ErrInUse is returned by Open when another process holds the database.
var ErrInUse = errors.New("database in use by another process")

type fileLock struct{ f *os.File }

func lockPath(dbPath string) string { return dbPath + ".lock" }

// acquire takes the lock of dbPath without waiting.
func acquire(dbPath string) (*fileLock, error) {
	path := lockPath(dbPath)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := "another process"
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
				holder = "process " + strconv.Itoa(pid)
			}
		}
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is used by %s (another rebuno dev?); stop it, or give this one its own --db",
				ErrInUse, dbPath, holder)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &fileLock{f: f}, nil
}

// release drops the lock. The file stays: removing it would let a process
// that opened it just before lock a file nobody else sees.
func (l *fileLock) release() {
	if l != nil {
		l.f.Close()
	}
}
