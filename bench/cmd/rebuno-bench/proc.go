package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// pinning records how the kernel and the load generator were placed on cores
// (docs/protocol/conformance.md §4: kernel on core 0 with GOMAXPROCS=1, load generator on core 1).
type pinning struct {
	KernelCPU  int    // -1 when the kernel is not pinned
	GOMAXPROCS int    // the kernel's
	SelfCPU    int    // -1 when this process is not pinned
	Taskset    string // path of taskset, "" when absent
	Impossible string // why pinning could not be done, "" when it was
}

func (p pinning) String() string {
	if p.Impossible != "" {
		return fmt.Sprintf("NOT PINNED (%s); kernel GOMAXPROCS=%d", p.Impossible, p.GOMAXPROCS)
	}
	how := "taskset -c 0"
	if p.Taskset == "" {
		how = "sched_setaffinity before exec"
	}
	return fmt.Sprintf("kernel on core %d (%s, GOMAXPROCS=%d), load generator + webhook receiver on core %d (GOMAXPROCS=1)",
		p.KernelCPU, how, p.GOMAXPROCS, p.SelfCPU)
}

// planPinning pins this process to the second allowed core and plans the
// kernel's placement on the first one. It must run early in main, while the
// process has few threads.
func planPinning(disabled bool) pinning {
	p := pinning{KernelCPU: -1, SelfCPU: -1}
	if disabled {
		p.Impossible = "disabled with -no-pin"
		return p
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		p.Impossible = "sched_getaffinity: " + err.Error()
		return p
	}
	var cpus []int
	for i := 0; i < 1024; i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	if len(cpus) < 2 {
		p.Impossible = fmt.Sprintf("only %d CPU(s) available to this process; kernel and load generator share cores", len(cpus))
		return p
	}
	p.KernelCPU, p.SelfCPU = cpus[0], cpus[1]
	if err := pinAllThreads(p.SelfCPU); err != nil {
		p.Impossible = "pinning the load generator failed: " + err.Error()
		p.KernelCPU, p.SelfCPU = -1, -1
		return p
	}
	runtime.GOMAXPROCS(1)
	if path, err := exec.LookPath("taskset"); err == nil {
		p.Taskset = path
	}
	return p
}

// pinAllThreads sets the affinity of every thread of this process. Threads
// created later inherit it from the thread that creates them, so once every
// existing thread is pinned the whole process stays pinned. The loop repeats
// until a pass finds no thread it had not pinned yet.
func pinAllThreads(cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	done := map[int]bool{}
	for pass := 0; pass < 10; pass++ {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		fresh := 0
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || done[tid] {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
				return fmt.Errorf("thread %d: %w", tid, err)
			}
			done[tid] = true
			fresh++
		}
		if fresh == 0 {
			return nil
		}
	}
	return nil
}

// startPinned starts cmd so that it runs on cpu. With taskset the command is
// wrapped (taskset execs, so the pid stays the kernel's); without it, the
// fork happens on a thread temporarily moved to cpu, whose affinity the child
// inherits.
func startPinned(cmd *exec.Cmd, p pinning) error {
	if p.Impossible != "" || p.KernelCPU < 0 {
		return cmd.Start()
	}
	if p.Taskset != "" {
		cmd.Args = append([]string{p.Taskset, "-c", strconv.Itoa(p.KernelCPU), cmd.Path}, cmd.Args[1:]...)
		cmd.Path = p.Taskset
		return cmd.Start()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var kset, sset unix.CPUSet
	kset.Set(p.KernelCPU)
	sset.Set(p.SelfCPU)
	if err := unix.SchedSetaffinity(0, &kset); err != nil {
		return err
	}
	err := cmd.Start()
	unix.SchedSetaffinity(0, &sset)
	return err
}

// ---- /proc readings ----

var clockTicks = readClockTicks()

func readClockTicks() float64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && n > 0 {
			return float64(n)
		}
	}
	return 100
}

// procCPU returns the user+system CPU time a process has used so far.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may contain spaces; fields resume after its ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	// After ')' the fields start at field 3 (state); utime is 14, stime 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return time.Duration((ut + st) / clockTicks * float64(time.Second)), nil
}

// selfCPU returns this process's user+system CPU time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procStatus reads fields of /proc/<pid>/status.
func procStatus(pid int) (map[string]string, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out, sc.Err()
}

// memKiB parses "1234 kB".
func memKiB(v string) int64 {
	n, _ := strconv.ParseInt(strings.TrimSuffix(v, " kB"), 10, 64)
	return n
}

// rss returns VmRSS and VmHWM (peak) in bytes.
func rss(pid int) (cur, peak int64) {
	st, err := procStatus(pid)
	if err != nil {
		return 0, 0
	}
	return memKiB(st["VmRSS"]) << 10, memKiB(st["VmHWM"]) << 10
}

// selfThreadsPinned reports whether every thread of this process may run only
// on cpu.
func selfThreadsPinned(cpu int) bool {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return false
	}
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var set unix.CPUSet
		if unix.SchedGetaffinity(tid, &set) != nil {
			continue
		}
		if set.Count() != 1 || !set.IsSet(cpu) {
			return false
		}
	}
	return true
}

// ---- machine description ----

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if k, v, ok := strings.Cut(string(line), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func osRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// dbSize returns the size of a database file plus its -wal file, in bytes.
func dbSize(path string) int64 {
	var n int64
	for _, p := range []string{path, path + "-wal"} {
		if st, err := os.Stat(p); err == nil {
			n += st.Size()
		}
	}
	return n
}

// diskOf names the filesystem a directory lives on, for the report.
func diskOf(dir string) string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return "unknown"
	}
	abs, _ := filepath.Abs(dir)
	best, fs := "", "unknown"
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		if (abs == f[1] || strings.HasPrefix(abs, strings.TrimSuffix(f[1], "/")+"/")) && len(f[1]) > len(best) {
			best, fs = f[1], f[2]+" on "+f[0]
		}
	}
	return fs + " (" + best + ")"
}

// runqueueWait sums, over the threads of a process, the time they spent
// runnable but waiting for a CPU (/proc/<pid>/task/*/schedstat, field 2). On
// a pinned core it measures how much other work on the machine delayed the
// process.
func runqueueWait(pid int) time.Duration {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var total int64
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "schedstat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		if n, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			total += n
		}
	}
	return time.Duration(total)
}

// coreTimes reads one CPU's line of /proc/stat: the time it was busy (not
// idle, not waiting for I/O, not stolen) and the time the hypervisor stole.
func coreTimes(cpu int) (busy, steal time.Duration, ok bool) {
	if cpu < 0 {
		return 0, 0, false
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	prefix := fmt.Sprintf("cpu%d ", cpu)
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		f := strings.Fields(line)[1:]
		var v [10]float64
		for i := 0; i < len(f) && i < len(v); i++ {
			v[i], _ = strconv.ParseFloat(f[i], 64)
		}
		// user nice system idle iowait irq softirq steal guest guest_nice
		tick := func(x float64) time.Duration { return time.Duration(x / clockTicks * float64(time.Second)) }
		return tick(v[0] + v[1] + v[2] + v[5] + v[6]), tick(v[7]), true
	}
	return 0, 0, false
}
