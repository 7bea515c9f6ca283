package sqlite

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

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
		if pid := holderPID(path); pid > 0 {
			holder = "process " + strconv.Itoa(pid)
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

// holderPID reads the pid the lock's holder wrote, 0 when there is none. A
// holder writes it just after taking the lock, so a process refused at that
// moment waits for it a little (at most 100 ms) rather than name nobody.
func holderPID(path string) int {
	for range 50 {
		if b, err := os.ReadFile(path); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
				return pid
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	return 0
}

// release drops the lock. The file stays: removing it would let a process
// that opened it just before lock a file nobody else sees.
func (l *fileLock) release() {
	if l != nil {
		l.f.Close()
	}
}
