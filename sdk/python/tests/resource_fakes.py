"""Test doubles for the resource unit tests: `ResourceKernel`, the in-memory
kernel of `fakes.py` plus the resource routes and the kernel's counting rules
(docs/protocol/resources.md §3, §4), and `FakeDriver`, a driver that records
every call."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import httpx2

from rebuno import Agent, CheckpointUnavailable

from .fakes import FakeKernel, Recorded, deliver, make_agent, uuid7


def _error(status: int, code: str, message: str = "", details: dict[str, Any] | None = None) -> httpx2.Response:
    body: dict[str, Any] = {"code": code, "message": message or code.replace("_", " ")}
    if details is not None:
        body["details"] = details
    return httpx2.Response(status, json=body)


@dataclass
class FakeResource:
    key: str
    driver_id: str
    configuration: Any
    coverage_reuse: bool
    every_steps: int
    on_completion: bool
    registered_seq: int
    generation: int = 0
    binding: Any = None
    checkpoint_ref: str = ""
    covered: bool = False
    starts: int = 0

    def view(self) -> dict[str, Any]:
        return {"key": self.key, "driver_id": self.driver_id, "configuration": self.configuration,
                "coverage_reuse": self.coverage_reuse, "every_steps": self.every_steps,
                "on_completion": self.on_completion, "registered_seq": self.registered_seq,
                "generation": self.generation, "binding": self.binding, "checkpoint_ref": self.checkpoint_ref,
                "covered": self.covered}


@dataclass
class ResourceKernel(FakeKernel):
    """`FakeKernel` with resources. `log` lists what happened, in order:
    `("executing", target, {key: generation})`, `("succeeded"|"failed", target)`,
    `("registered", key)`, `("bound", key)`, `("checkpointed", key, generation, ref)`,
    `("checkpoint_failed", key, generation, error)`, `("completed"|"failed_execution", ...)`."""

    resources: dict[str, dict[str, FakeResource]] = field(default_factory=dict)
    declared: dict[str, list[str]] = field(default_factory=dict)  # step id → declared keys
    log: list[tuple[Any, ...]] = field(default_factory=list)
    seq: itertools.count = field(default_factory=lambda: itertools.count(5))  # type: ignore[type-arg]

    # ---------------------------------------------------------- helpers

    def add_resource(self, eid: str, key: str, *, driver_id: str = "fake.v1", configuration: Any = None,
                     coverage_reuse: bool = False, every_steps: int = 1, on_completion: bool = True,
                     **state: Any) -> FakeResource:
        """A resource registered by an earlier dispatch (or copied into a fork)."""
        r = FakeResource(key, driver_id, configuration, coverage_reuse, every_steps, on_completion, next(self.seq),
                         **state)
        self.resources.setdefault(eid, {})[key] = r
        self.executions[eid]["resource_keys"].append(key)
        return r

    def bodies(self, suffix: str) -> list[Any]:
        return [r.json() for r in self.requests if r.method == "POST" and r.path.endswith(suffix)]

    def outcomes(self) -> list[dict[str, Any]]:
        """Bodies of step complete/fail requests, in order."""
        return [r.json() for r in self.requests if re.search(r"/steps/[0-9a-f]{64}/(complete|fail)$", r.path)]

    def checkpointed(self) -> list[tuple[Any, ...]]:
        return [e for e in self.log if e[0] == "checkpointed"]

    # ----------------------------------------------------------- routes

    def _route(self, rec: Recorded) -> httpx2.Response:
        m = re.fullmatch(r"/v0/executions/([0-9a-f-]{36})/resources(?:/([^/]+)/binding|/(checkpoints))?", rec.path)
        if m is None or rec.method != "POST":
            resp = super()._route(rec)
            em = re.fullmatch(r"/v0/executions/([0-9a-f-]{36})/(complete|fail)", rec.path)
            if em and resp.status_code == 204:
                self.log.append(("completed" if em.group(2) == "complete" else "failed_execution",))
            return resp
        eid = m.group(1)
        ex = self.executions.get(eid)
        if ex is None:
            return _error(404, "not_found")
        if "rebuno-dispatch-id" not in rec.headers:
            return _error(400, "validation_error", "validation error: missing dispatch_id")
        if ex["status"] in ("completed", "failed", "cancelled"):
            return _error(409, "execution_terminal")
        data = rec.json()
        table = self.resources.setdefault(eid, {})
        if m.group(2) is not None:
            r = table.get(m.group(2))
            if r is None:
                return _error(404, "not_found")
            if r.binding is None:
                r.binding = data["binding"]
                self.log.append(("bound", r.key))
            elif r.binding != data["binding"]:
                return _error(409, "conflict", "resource already bound")
            return httpx2.Response(204)
        if m.group(3) is not None:
            self._captures(eid, data, None)
            return httpx2.Response(204)
        return self._register(ex, table, data)

    def _register(self, ex: dict[str, Any], table: dict[str, FakeResource], data: dict[str, Any]) -> httpx2.Response:
        assert set(data) == {"key", "driver_id", "configuration", "coverage_reuse", "every_steps", "on_completion"}, \
            data
        key = data["key"]
        r = table.get(key)
        if r is None:
            r = FakeResource(key, data["driver_id"], data["configuration"], data["coverage_reuse"],
                             data["every_steps"], data["on_completion"], next(self.seq))
            table[key] = r
            ex["resource_keys"].append(key)
            self.log.append(("registered", key))
        elif (r.driver_id, r.configuration, r.coverage_reuse) != (data["driver_id"], data["configuration"],
                                                                  data["coverage_reuse"]):
            stored = {"driver_id": r.driver_id, "configuration": r.configuration, "coverage_reuse": r.coverage_reuse}
            requested = {k: data[k] for k in ("driver_id", "configuration", "coverage_reuse")}
            return _error(409, "conflict", f'conflict: resource "{key}" is registered with another driver_id, '
                          "configuration or coverage_reuse", {"stored": stored, "requested": requested})
        return httpx2.Response(200, json=r.view())

    def _submit(self, ex: dict[str, Any], rec: Recorded, terminal: bool) -> httpx2.Response:
        data = rec.json()
        assert "resources" in data, "every submit carries resources"
        for key in data["resources"]:
            if key not in self.resources.get(ex["id"], {}):
                return _error(400, "validation_error", f"unknown resource key {key!r}")
        if data["kind"] == "llm_call" and data["resources"]:
            return _error(400, "validation_error", "resources are not allowed on an llm_call step")
        resp = super()._submit(ex, rec, terminal)
        answer = json.loads(resp.content)
        if answer.get("decision") != "proceed":
            return resp
        sid = answer["step_id"]
        self.declared[sid] = list(data["resources"])
        answer["resources"] = self._live_start(ex["id"], data["kind"], data.get("target", ""), data["resources"])
        headers = {}
        if "rebuno-step-occurrence" in resp.headers:
            headers["Rebuno-Step-Occurrence"] = resp.headers["rebuno-step-occurrence"]
        return httpx2.Response(200, json=answer, headers=headers)

    def _live_start(self, eid: str, kind: str, target: str, declared: list[str]) -> list[dict[str, Any]]:
        affecting = kind != "llm_call"
        raised: dict[str, int] = {}
        table = self.resources.get(eid, {})
        for r in table.values():
            mine = affecting and r.key in declared
            if not r.coverage_reuse or mine:
                r.generation += 1
                r.covered = False
                raised[r.key] = r.generation
            if mine:
                r.starts += 1
        self.log.append(("executing", target, dict(raised)))
        entries = []
        for key in declared:
            if key in raised:
                r = table[key]
                entries.append({"key": key, "generation": r.generation,
                                "due": r.every_steps > 0 and r.starts >= r.every_steps})
        for key, gen in raised.items():
            if key not in declared:
                entries.append({"key": key, "generation": gen, "due": False})
        return entries

    def _outcome(self, ex: dict[str, Any], rec: Recorded, sid: str, verb: str, terminal: bool) -> httpx2.Response:
        resp = super()._outcome(ex, rec, sid, verb, terminal)
        if verb != "stream" and resp.status_code == 200 and json.loads(resp.content)["decision"] == "recorded":
            st = self.steps[sid]
            self.log.append(("succeeded" if verb == "complete" else "failed", st.target))
            self._captures(ex["id"], rec.json(), sid)
        return resp

    def _captures(self, eid: str, data: dict[str, Any], recording: str | None) -> None:
        table = self.resources.get(eid, {})
        for f in data.get("capture_failures") or []:
            self.log.append(("checkpoint_failed", f["key"], f["generation"], f["error"]))
        seen: set[str] = set()
        for c in data.get("captures") or []:
            r = table.get(c["key"])
            ref = c.get("checkpoint_ref")
            refusal = None
            if r is None:
                refusal = "unknown_resource"
            elif not isinstance(ref, str) or not ref:
                refusal = "missing_checkpoint_ref"
            elif c["key"] in seen:
                refusal = "duplicate_capture"
            elif c["generation"] != r.generation:
                refusal = "stale_generation"
            elif self._writers(eid, r, recording):
                refusal = "writers_active"
            seen.add(c["key"])
            if refusal is not None:
                self.log.append(("checkpoint_failed", c["key"], c["generation"], refusal))
                continue
            assert r is not None
            r.covered = True
            r.starts = 0
            self.log.append(("checkpointed", r.key, c["generation"], ref))

    def _writers(self, eid: str, r: FakeResource, recording: str | None) -> bool:
        for sid, st in self.steps.items():
            if st.status != "executing" or st.kind == "llm_call" or sid == recording:
                continue
            if not r.coverage_reuse or r.key in self.declared.get(sid, []):
                return True
        return False


class Handle:
    """A fake resource handle."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.writes: list[str] = []

    def __repr__(self) -> str:
        return f"Handle({self.name})"


class FakeDriver:
    """A driver that records calls. `calls` lists `("create", ref?)`,
    `("open", binding)` and `("checkpoint", handle name)`. Refs are
    `ref-1`, `ref-2`, ... unless `checkpoint_result` says otherwise."""

    driver_id = "fake.v1"

    def __init__(self, *, configuration: Any = None, coverage_reuse: bool = False, sync: bool = False) -> None:
        self.configuration = configuration
        self.coverage_reuse = coverage_reuse
        self.calls: list[tuple[Any, ...]] = []
        # Whether each call ran on the event loop's thread.
        self.on_loop_thread: list[bool] = []
        self.create_error: BaseException | None = None
        self.open_error: BaseException | None = None
        # An exception to raise, or a value to return, instead of a fresh ref.
        self.checkpoint_result: Any = None
        self.create_result: Any = None
        self.on_checkpoint: Callable[[], Awaitable[None]] | None = None
        self._refs = itertools.count(1)
        self._handles = itertools.count(1)
        if sync:
            self.create = self._create_sync  # type: ignore[method-assign]
            self.open = self._open_sync  # type: ignore[method-assign]
            self.checkpoint = self._checkpoint_sync  # type: ignore[method-assign]

    def _create_sync(self, *args: Any) -> Any:
        self.calls.append(("create", *args))
        self.on_loop_thread.append(threading.current_thread() is threading.main_thread())
        if self.create_error is not None:
            raise self.create_error
        if self.create_result is not None:
            return self.create_result
        h = Handle(f"h{next(self._handles)}")
        return h, {"id": h.name}

    def _open_sync(self, binding: Any) -> Any:
        self.calls.append(("open", binding))
        if self.open_error is not None:
            raise self.open_error
        return Handle(f"opened-{binding['id']}")

    def _checkpoint_sync(self, handle: Handle) -> Any:
        self.calls.append(("checkpoint", handle.name))
        self.on_loop_thread.append(threading.current_thread() is threading.main_thread())
        if isinstance(self.checkpoint_result, BaseException):
            raise self.checkpoint_result
        if self.checkpoint_result is not None:
            return self.checkpoint_result
        return f"ref-{next(self._refs)}"

    async def create(self, *args: Any) -> Any:
        await asyncio.sleep(0)
        return self._create_sync(*args)

    async def open(self, binding: Any) -> Any:
        await asyncio.sleep(0)
        return self._open_sync(binding)

    async def checkpoint(self, handle: Handle) -> Any:
        if self.on_checkpoint is not None:
            await self.on_checkpoint()
        await asyncio.sleep(0)
        return self._checkpoint_sync(handle)

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == name]


class OtherDriver(FakeDriver):
    driver_id = "other.v1"


async def run_handler(kernel: ResourceKernel, body: Callable[[], Awaitable[Any]], eid: str | None = None,
                      *, agent: Agent | None = None) -> tuple[str, Any]:
    """Run `body` as a handler; return ("ok", value) or ("raised", exception).
    The Agent then completes the execution with the value (None when raised)."""
    agent = agent or make_agent(kernel)
    out: list[tuple[str, Any]] = []

    @agent.bind
    async def process() -> Any:
        try:
            value = await body()
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            out.append(("raised", e))
            return None
        out.append(("ok", value))
        return value if _jsonable(value) else None

    if eid is None:
        eid = kernel.add_execution()
    if kernel.executions[eid]["status"] not in ("completed", "failed", "cancelled"):
        kernel.executions[eid]["status"] = "running"
    await deliver(agent, eid, uuid7(), 1)
    await agent.join()
    await agent.close()
    assert out, "handler did not run"
    return out[0]


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


__all__ = ["ResourceKernel", "FakeResource", "FakeDriver", "OtherDriver", "Handle", "run_handler",
           "CheckpointUnavailable"]
