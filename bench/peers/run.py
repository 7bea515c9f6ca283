#!/usr/bin/env python3
"""Rebuno beside its peers: `make bench-peers` (docs/performance.md, "Peers").

Installs Restate and DBOS into a temporary folder (npm and PyPI, pinned by
package-lock.json and requirements.txt beside this file), then runs one
workload against every system: executions of STEPS no-op durable steps,
COUNT of them one at a time (c1) and COUNT with 50 in flight (c50, or
--concurrency), in rounds
that take the systems in turn (each round in another order). Each system
starts afresh in each round (a new database or data folder), gets a warm-up,
then the two measured windows. Around each window the harness reads the CPU
time of every process involved from /proc (each process with its
descendants) and counts their fsync and fdatasync calls through perf's
syscall tracepoints, which cost the traced processes next to nothing (strace
would stop them at every system call). It prints one table and the
conditions.

    python3 bench/peers/run.py [--quick] [--only rebuno-py,restate-ts] [--concurrency 200] [--json FILE]

restate-server looks up its latest release when it starts: it runs in a
network namespace of its own with only loopback (`unshare -n`), and its
service and client join that namespace (`nsenter --net`), so nothing leaves
the machine. Needs root (namespaces, perf), `make build`, the Python SDK's
virtualenv and the TypeScript SDK built (the Makefile target provides them),
and Postgres 15 binaries for DBOS TypeScript (tests/postgres/cluster.sh).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, TypeVar

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STEPS = 10
COUNT, CONCURRENCY, ROUNDS = 200, 50, 3
QUICK_COUNT = 20
WINDOW_TIMEOUT = 900.0  # seconds; a window this long means something hangs
START_TIMEOUT = 90.0
AGENT_SECRET = "peers-bench-secret-0123456789"
# restate-server's default ports, free in its own network namespace.
RESTATE_INGRESS, RESTATE_ADMIN, RESTATE_SERVICE = 8080, 9070, 9080
FSYNC_EVENTS = "syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync"
TICKS = os.sysconf("SC_CLK_TCK")
T = TypeVar("T")


# ------------------------------------------------------------------ processes


def _die_with_parent() -> None:
    """Runs in each child before exec: the kernel kills it if the harness dies."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Processes:
    """The processes of one system in one round, each in a process group of
    its own, so that `close` ends whatever they started too."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str], talk: bool = False) -> subprocess.Popen[bytes]:
        """Start argv with its stderr (and stdout, unless the harness talks to
        it through stdin and stdout) in logs/NAME.log."""
        log = open(self.logs / f"{name}.log", "wb")
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE if talk else subprocess.DEVNULL,
                                stdout=subprocess.PIPE if talk else log, stderr=log,
                                start_new_session=True, preexec_fn=_die_with_parent)
        log.close()
        self.started.append(proc)
        return proc

    def close(self) -> None:
        """Kill every process group: the measurements are over and the data is
        thrown away, so nothing needs a clean stop (hypercorn takes 10 s)."""
        for proc in self.started:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.started:
            proc.wait()
        self.started.clear()

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.logs / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return f"--- {path} (last {lines} lines)\n" + "\n".join(text.splitlines()[-lines:])


def _poll(what: str, probe: Callable[[], T | None]) -> T:
    """Calls probe until it returns something true, and returns that."""
    deadline = time.monotonic() + START_TIMEOUT
    while not (value := probe()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not ready within {START_TIMEOUT:.0f}s")
        time.sleep(0.02)
    return value


def _log_match(procs: Processes, name: str, proc: subprocess.Popen[bytes], pattern: str) -> re.Match[str]:
    """The first match of pattern in the log of a process that is starting."""
    def probe() -> re.Match[str] | None:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited ({proc.returncode})\n{procs.log_tail(name)}")
        return re.search(pattern, (procs.logs / f"{name}.log").read_text(errors="replace"))
    return _poll(name, probe)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Conversation:
    """The harness's side of loop.py / loop.ts: `run COUNT CONCURRENCY` → `done`."""

    def __init__(self, procs: Processes, name: str, proc: subprocess.Popen[bytes]) -> None:
        self.procs, self.name, self.proc = procs, name, proc
        self.buffer = b""
        self.how = self._expect("ready", START_TIMEOUT)

    def run(self, count: int, concurrency: int) -> float:
        """Runs the executions; returns the seconds they took."""
        assert self.proc.stdin is not None
        started = time.perf_counter()
        self.proc.stdin.write(f"run {count} {concurrency}\n".encode())
        self.proc.stdin.flush()
        self._expect("done", WINDOW_TIMEOUT)
        return time.perf_counter() - started

    def _expect(self, word: str, timeout: float) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            readable, _, _ = select.select([self.proc.stdout], [], [], max(0.0, remaining))
            chunk = os.read(self.proc.stdout.fileno(), 4096) if readable else b""
            if not chunk:
                why = "timed out" if not readable else f"exited ({self.proc.wait()})"
                raise RuntimeError(f"{self.name} {why} before '{word}'\n{self.procs.log_tail(self.name)}")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        first, _, rest = line.decode().partition(" ")
        if first != word:
            raise RuntimeError(f"{self.name}: expected '{word}', got {line!r}")
        return rest


# ---------------------------------------------------------------- measurement


def _process_table() -> dict[int, tuple[int, int]]:
    """pid → (parent pid, CPU ticks: its own and its reaped children's)."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        # After the command: state, ppid, ..., utime, stime, cutime, cstime (stat fields 14-17).
        table[int(entry.name)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
    return table


def _tree(table: dict[int, tuple[int, int]], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in table and pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, []))
    return tree


def _machine_busy_ticks() -> int:
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
    return user + nice + system + irq + softirq + steal


def _load1() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


class FsyncCounter:
    """perf stat on the given processes (threads and children they start
    included) for as long as its workload, `cat`, reads an open pipe; perf
    enables the counters before it starts the workload, whose first line
    therefore says that counting has begun."""

    def __init__(self, pids: set[int], out: Path) -> None:
        self.out = out
        self.proc = subprocess.Popen(
            ["perf", "stat", "-x", ",", "-o", str(out), "-e", FSYNC_EVENTS, "-p", ",".join(map(str, sorted(pids))),
             "--", "sh", "-c", "echo counting; exec cat >/dev/null"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline() != b"counting\n":
            raise RuntimeError(f"perf stat did not start: {self.proc.communicate()[1].decode(errors='replace')}")

    def stop(self) -> int:
        _, err = self.proc.communicate(timeout=30)  # closes cat's input: perf reports and exits
        counts = [line.split(",") for line in self.out.read_text().splitlines() if "syscalls:" in line]
        if len(counts) != 2 or not all(c[0].isdigit() for c in counts):
            raise RuntimeError(f"perf stat counted nothing: {self.out.read_text()!r} {err.decode(errors='replace')}")
        return sum(int(c[0]) for c in counts)


@dataclass
class Window:
    executions: int
    concurrency: int
    seconds: float
    cpu: dict[str, float]  # role → CPU seconds of its process tree
    fsyncs: int
    load1: float  # the 1-minute load average when the window began
    others: float  # cores busy with processes outside this system, on average

    @property
    def steps(self) -> int:
        return self.executions * STEPS

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds

    def cpu_us_per_step(self, role: str) -> float:
        return self.cpu[role] / self.steps * 1e6


@dataclass
class Running:
    """A started system: the root process of each role, and its client."""
    roles: dict[str, int]
    client: Conversation


def measure(running: Running, count: int, concurrency: int, scratch: Path) -> Window:
    table = _process_table()
    trees = {role: _tree(table, pid) for role, pid in running.roles.items()}
    fsyncs = FsyncCounter(set().union(*trees.values()), scratch / "perf.out")
    try:
        load1 = _load1()
        table = _process_table()
        before = {role: {pid: table[pid][1] for pid in tree if pid in table} for role, tree in trees.items()}
        busy_before = _machine_busy_ticks()
        seconds = running.client.run(count, concurrency)
        busy_after = _machine_busy_ticks()
    except BaseException:
        fsyncs.proc.kill()
        fsyncs.proc.wait()
        raise
    table = _process_table()
    cpu = {}
    for role, pid in running.roles.items():
        after = {p: table[p][1] for p in _tree(table, pid)}
        cpu[role] = (sum(after.values()) - sum(t for p, t in before[role].items() if p in after)) / TICKS
    others = max(0.0, (busy_after - busy_before) / TICKS - sum(cpu.values())) / seconds
    return Window(count, concurrency, seconds, cpu, fsyncs.stop(), load1, others)


# ------------------------------------------------------------------ the systems


@dataclass
class Bench:
    """What every system's start needs: the temporary folder, the tools and
    the round."""
    tmp: Path
    kernel: Path
    sdk_python: Path
    postgres_url: str | None = None
    postmaster: int | None = None
    round: int = 0
    # Executions in flight in the second window.
    concurrency: int = CONCURRENCY

    def env(self, **extra: str) -> dict[str, str]:
        """The caller's environment without REBUNO_* (the kernel's and SDKs'
        settings), plus extra."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("REBUNO_")}
        return {**base, "STEPS": str(STEPS), "PYTHONPATH": str(HERE), **extra}

    def node(self, script: Path) -> list[str]:
        """Node running a TypeScript file through the tsx loader installed with the peers."""
        return ["node", "--import", (self.tmp / "node_modules/tsx/dist/loader.mjs").as_uri(), str(script)]

    @property
    def peers_python(self) -> str:
        return str(self.tmp / "venv/bin/python")

    @property
    def restate_server(self) -> str:
        return str(self.tmp / "node_modules/@restatedev/restate-server-linux-x64/bin/restate-server")

    def data(self, system: str) -> Path:
        return self.tmp / f"{system}-round{self.round}"


@dataclass
class System:
    key: str
    label: str
    start: Callable[[Bench, Processes], Running]


def rebuno(sdk: str) -> Callable[[Bench, Processes], Running]:
    def start(b: Bench, procs: Processes) -> Running:
        kernel = procs.start("kernel", [str(b.kernel), "dev", "--db", str(b.data(f"rebuno-{sdk}")) + ".db",
                                          "--listen-addr", "127.0.0.1:0", "--no-repl"], b.env())
        url = _log_match(procs, "kernel", kernel, r"url:\s+(http://\S+)").group(1)
        port = _free_port()
        env = b.env(REBUNO_URL=url, AGENT_ID="peers-bench", PORT=str(port), REBUNO_AGENT_SECRET=AGENT_SECRET,
                    AGENT_URL=f"http://127.0.0.1:{port}/webhook")
        if sdk == "py":
            client, agent = ([str(b.sdk_python), str(HERE / f"rebuno/{name}.py")] for name in ("client", "agent"))
        else:
            client, agent = (b.node(HERE / f"rebuno/{name}.ts") for name in ("client", "agent"))
        # The client registers the agent before it says it is ready; the agent starts registered.
        talk = procs.start("client", client, env, talk=True)
        conversation = Conversation(procs, "client", talk)
        served = procs.start("agent", agent, env)
        _poll("agent", lambda: served.poll() is None and _listening(port))
        return Running({"kernel": kernel.pid, "agent": served.pid, "client": talk.pid}, conversation)
    return start


def restate(sdk: str) -> Callable[[Bench, Processes], Running]:
    def start(b: Bench, procs: Processes) -> Running:
        # Loopback only: restate-server asks for its latest release at start.
        server = procs.start("server", ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
                                          b.restate_server, "--base-dir", str(b.data(f"restate-{sdk}")),
                                          "--bind-ip", "127.0.0.1", "--listen-mode", "tcp", "--no-logo"],
                               b.env(RESTATE_LOG_DISABLE_ANSI_CODES="true"))
        _log_match(procs, "server", server, r"Ingress HTTP listening")
        inside = ["nsenter", f"--net=/proc/{server.pid}/ns/net", "--"]
        env = b.env(PORT=str(RESTATE_SERVICE), SERVICE_URL=f"http://127.0.0.1:{RESTATE_SERVICE}",
                    ADMIN_URL=f"http://127.0.0.1:{RESTATE_ADMIN}", INGRESS_URL=f"http://127.0.0.1:{RESTATE_INGRESS}")
        if sdk == "py":
            service = procs.start("service", inside + [b.peers_python, str(HERE / "restate/service.py")], env)
        else:
            service = procs.start("service", inside + b.node(b.tmp / "peers/restate/service.ts"), env)
        # One client for both services: it registers the deployment, then invokes.
        talk = procs.start("client", inside + b.node(b.tmp / "peers/restate/client.ts"), env, talk=True)
        return Running({"server": server.pid, "service": service.pid, "client": talk.pid},
                       Conversation(procs, "client", talk))
    return start


def dbos_py(b: Bench, procs: Processes) -> Running:
    database = str(b.data("dbos-py")) + ".sqlite"
    app = procs.start("app", [b.peers_python, str(HERE / "dbos/app.py")], b.env(DATABASE=database), talk=True)
    return Running({"app": app.pid}, Conversation(procs, "app", app))


def dbos_ts(b: Bench, procs: Processes) -> Running:
    assert b.postgres_url and b.postmaster
    database = b.postgres_url.replace("/postgres?", f"/dbos_round{b.round}?")
    app = procs.start("app", b.node(b.tmp / "peers/dbos/app.ts"), b.env(DATABASE=database), talk=True)
    return Running({"app": app.pid, "postgres": b.postmaster}, Conversation(procs, "app", app))


SYSTEMS = [
    System("rebuno-py", "Rebuno: kernel (rebuno dev, SQLite) + Python SDK agent + Python SDK client", rebuno("py")),
    System("rebuno-ts", "Rebuno: kernel (rebuno dev, SQLite) + TypeScript SDK agent + TypeScript SDK client",
           rebuno("ts")),
    System("restate-ts", "Restate 1.7 (restate-server) + its TypeScript SDK service (1.17) + fetch client",
           restate("ts")),
    System("restate-py", "Restate 1.7 (restate-server) + its Python SDK service (1.3, hypercorn) + fetch client",
           restate("py")),
    System("dbos-ts", "DBOS TypeScript 5.3 on Postgres 15 (in process)", dbos_ts),
    System("dbos-py", "DBOS Python 3.4 on SQLite (in process)", dbos_py),
]

# The comparisons the performance targets name: each Rebuno row against the peer it is held to.
COMPARED = [("rebuno-py", "restate-py"), ("rebuno-ts", "restate-ts"), ("rebuno-py", "dbos-py")]


def measure_system(b: Bench, system: System, count: int) -> tuple[Window, Window, str]:
    """One round of one system: start it afresh, warm it up, measure c1 and
    c50, kill it. Returns the windows and how the client awaits results."""
    logs = b.tmp / "logs" / f"{system.key}-round{b.round}"
    logs.mkdir(parents=True)
    procs = Processes(logs)
    try:
        running = system.start(b, procs)
        running.client.run(max(1, count // 20), 1)  # warm-up
        running.client.run(min(count, b.concurrency), min(count, b.concurrency))
        return measure(running, count, 1, logs), measure(running, count, b.concurrency, logs), running.client.how
    finally:
        procs.close()


# --------------------------------------------------------------------- setup


def install(tmp: Path) -> None:
    """The peers, from npm and PyPI, into tmp; the TypeScript peers' sources
    beside their node_modules, where Node resolves their imports."""
    started = time.monotonic()
    for name in ("package.json", "package-lock.json"):
        shutil.copy(HERE / name, tmp / name)
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=tmp, check=True,
                   stdout=subprocess.DEVNULL)
    (tmp / "peers").mkdir()
    shutil.copy(HERE / "loop.ts", tmp / "peers")
    for name in ("restate", "dbos"):
        shutil.copytree(HERE / name, tmp / "peers" / name, ignore=shutil.ignore_patterns("*.py"))
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True)
    subprocess.run([str(tmp / "venv/bin/pip"), "install", "-q", "--disable-pip-version-check", "--require-hashes",
                    "-r", str(HERE / "requirements.txt")], check=True)
    print(f"peers installed in {tmp} in {time.monotonic() - started:.0f} s", flush=True)


def start_postgres(b: Bench, stack: ExitStack) -> None:
    cluster = REPO / "tests/postgres/cluster.sh"
    env = {**os.environ, "REBUNO_PG_STATE": str(b.tmp / "postgres")}
    stack.callback(subprocess.run, [str(cluster), "stop"], env=env, check=False)
    b.postgres_url = subprocess.run([str(cluster), "start"], env=env, check=True, capture_output=True,
                                    text=True).stdout.strip()
    data = Path((b.tmp / "postgres/dir").read_text().strip()) / "data"
    b.postmaster = int((data / "postmaster.pid").read_text().split()[0])


def versions(b: Bench) -> dict[str, str]:
    def out(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True).stdout.strip()
    return {
        "rebuno": out(str(b.kernel), "version"),
        "restate-server": out(b.restate_server, "--version"),
        "node": out("node", "--version"),
        "python": out(b.peers_python, "--version"),
        "peers (PyPI)": ", ".join(line.split(" ")[0] for line in (HERE / "requirements.txt").read_text().splitlines()
                                  if line.startswith(("restate-sdk==", "dbos==", "hypercorn=="))),
        "peers (npm)": ", ".join(f"{k}@{v}" for k, v in json.loads((HERE / "package.json").read_text())
                                 ["dependencies"].items()),
        "machine": f"{os.cpu_count()} CPUs, {_cpu_model()}, Linux {os.uname().release}",
    }


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


# -------------------------------------------------------------------- report


def _range(values: list[float], digits: int = 0) -> str:
    low, high = (f"{v:,.{digits}f}" for v in (min(values), max(values)))
    return low if low == high else f"{low}–{high}"


def _median(values: list[float], digits: int = 0) -> str:
    return f"{statistics.median(values):,.{digits}f}"


def report(results: dict[str, list[tuple[Window, Window]]], how: dict[str, str], meta: dict[str, object]) -> str:
    """The table (markdown) and the conditions it was measured under."""
    cn = f"c{meta['concurrency']}"
    lines = [
        f"{meta['executions']} executions × {STEPS} no-op durable steps, one at a time (c1) and {meta['concurrency']} in "
        f"flight ({cn}), {meta['rounds']} round(s) taking the systems in turn. steps/s: the range over rounds; "
        "CPU: µs per step of each process with its descendants, from /proc, median over rounds; fsyncs: fsync + "
        "fdatasync calls per step of all those processes, counted by perf, median; load: the 1-minute load "
        "average when a window began, and the cores other processes on the machine used during the windows.",
        "",
        f"| system | steps/s c1 | steps/s {cn} | CPU per step, c1 (µs) | CPU per step, {cn} (µs) "
        f"| fsyncs per step, c1 · {cn} | load · others (cores) |",
        "|---|---|---|---|---|---|---|",
    ]
    for system in SYSTEMS:
        if system.key not in results:
            continue
        c1s, c50s = ([pair[i] for pair in results[system.key]] for i in (0, 1))
        both = c1s + c50s

        def cpu(windows: list[Window]) -> str:
            return " · ".join(f"{role} {_median([w.cpu_us_per_step(role) for w in windows])}" for role in windows[0].cpu)

        lines.append(" | ".join([
            f"| {system.label}", _range([w.steps_per_second for w in c1s]), _range([w.steps_per_second for w in c50s]),
            cpu(c1s), cpu(c50s),
            f"{_median([w.fsyncs / w.steps for w in c1s], 2)} · {_median([w.fsyncs / w.steps for w in c50s], 2)}",
            f"{_range([w.load1 for w in both], 1)} · {_range([w.others for w in both], 2)} |",
        ]))
    def best(key: str, window: int) -> float:
        return max(pair[window].steps_per_second for pair in results[key])

    ratios = [f"{ours} ÷ {peer}: c1 {best(ours, 0) / best(peer, 0):.2f}×, {cn} {best(ours, 1) / best(peer, 1):.2f}×"
              for ours, peer in COMPARED if ours in results and peer in results]
    if ratios:
        lines += ["", f"Best round against best round (steps/s): {'; '.join(ratios)}."]
    lines += ["", f"Results awaited: {'; '.join(f'{k}: {v}' for k, v in how.items())}.",
              f"Load average (1 min): {meta['load_before']} before the run, {meta['load_after']} after it."]
    lines += [f"{k}: {v}" for k, v in meta["versions"].items()]  # type: ignore[attr-defined]
    return "\n".join(lines)


# ---------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_COUNT} executions, one round (a smoke test)")
    parser.add_argument("--only", help="comma-separated systems: " + ",".join(s.key for s in SYSTEMS))
    parser.add_argument("--executions", type=int, help=f"executions per window (default {COUNT})")
    parser.add_argument("--rounds", type=int, help=f"rounds (default {ROUNDS})")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY,
                        help=f"executions in flight in the second window (default {CONCURRENCY})")
    parser.add_argument("--kernel", type=Path, default=REPO / "bin/rebuno")
    parser.add_argument("--python", type=Path, default=REPO / "sdk/python/.venv/bin/python",
                        help="the Python SDK's virtualenv")
    parser.add_argument("--json", type=Path, help="also write every window's numbers here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, databases)")
    args = parser.parse_args()
    count = args.executions or (QUICK_COUNT if args.quick else COUNT)
    rounds = args.rounds or (1 if args.quick else ROUNDS)
    keys = args.only.split(",") if args.only else [s.key for s in SYSTEMS]
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    unknown = set(keys) - {s.key for s in SYSTEMS}
    if unknown:
        parser.error(f"unknown systems: {', '.join(sorted(unknown))}")
    systems = [s for s in SYSTEMS if s.key in keys]
    for need, hint in ((args.kernel, "make build"), (args.python, "make sdk/python/.venv/.installed"),
                       (REPO / "sdk/typescript/dist/index.js", "make sdk/typescript/dist/index.js")):
        if not need.exists():
            parser.error(f"{need} is missing ({hint})")
    for tool in ("npm", "node", "perf", "unshare", "nsenter", "ip"):
        if not shutil.which(tool):
            parser.error(f"{tool} is not on PATH")

    # SIGTERM ends the run like Ctrl-C does: through the clean-up below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="rebuno-peers-"))
        if args.keep:
            print(f"keeping {tmp}")
        else:
            stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        bench = Bench(tmp, args.kernel.resolve(), args.python.absolute(), concurrency=args.concurrency)
        install(tmp)
        if any(s.key == "dbos-ts" for s in systems):
            start_postgres(bench, stack)
        meta: dict[str, object] = {"executions": count, "rounds": rounds, "concurrency": args.concurrency,
                                   "load_before": _load1(),
                                   "versions": versions(bench),
                                   "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        results: dict[str, list[tuple[Window, Window]]] = {}
        how: dict[str, str] = {}
        for r in range(rounds):
            bench.round = r + 1
            for system in systems[r % len(systems):] + systems[:r % len(systems)]:
                c1, c50, how[system.key] = measure_system(bench, system, count)
                results.setdefault(system.key, []).append((c1, c50))
                print(f"round {bench.round} {system.key}: c1 {c1.steps_per_second:,.0f} steps/s, "
                      f"c{args.concurrency} {c50.steps_per_second:,.0f} steps/s (load {c1.load1:.2f}; other processes "
                      f"{c1.others:.2f} and {c50.others:.2f} cores)", flush=True)
        meta["load_after"] = _load1()
        print()
        print(report(results, how, meta))
        if args.json:
            args.json.write_text(json.dumps({
                **meta, "steps": STEPS, "how": how,
                "results": {k: [{"c1": vars(a), "c50": vars(b)} for a, b in v] for k, v in results.items()},
            }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
