"""Resources: external state an execution changes (a sandbox, a directory),
checkpointed during the run and restored in forks.

    workspace = await resource("workspace", driver=LocalDirectory(),
                               checkpoints=CheckpointPolicy(every_steps=5))

    @tool("write_file", resources=["workspace"])
    async def write_file(path: str, content: str) -> str:
        await workspace.files.write(path, content)
        return f"wrote {path}"

What the SDK does (docs/protocol/sdk.md §4):

* `resource()` registers the key with the kernel, then creates the resource
  (from the fork's checkpoint, or the initial environment) and records its
  binding, or opens the binding a previous dispatch recorded. A create that
  finds the resource uncovered is followed by a **baseline** capture. Within a
  dispatch the same key returns the same handle.
* Tool calls and local steps run **one at a time** while the execution has
  resources; calls made inside a running body re-enter without waiting.
* The kernel counts live affecting starts and says in `proceed` when a
  capture is **due**; the SDK then calls `driver.checkpoint(handle)` after the
  body and sends the ref with the step's outcome. A nested step's due capture
  waits for the outermost running body.
* When the handler returns normally, each resource opened in the dispatch that
  is uncovered and has `on_completion` is captured before `complete`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from dataclasses import dataclass
from typing import Any, Awaitable, Iterator, Protocol, Sequence, TypeVar

from ._callables import call_off_loop
from ._resource_state import BodyMark, OpenedResource, current_mark, reset_mark, set_mark
from .errors import APIError, CheckpointUnavailable, ConflictError, Terminated
from .execution import ExecutionContext, require_context
from .identity import canonical_json
from .types import Decision, Resource

__all__ = [
    "CheckpointPolicy",
    "ResourceDriver",
    "resource",
    "valid_resource_key",
    "StepGuard",
    "completion_captures",
    "MAX_EVERY_STEPS",
]

log = logging.getLogger("rebuno")

MAX_EVERY_STEPS = 1_000_000
MAX_DRIVER_ID_BYTES = 256
MAX_REF_BYTES = 1024
MAX_ERROR_BYTES = 4096
_KEY = re.compile(r"[A-Za-z0-9._-]{1,128}")

HandleT = TypeVar("HandleT")
BindingT = TypeVar("BindingT")


def valid_resource_key(key: object) -> bool:
    """1 to 128 characters from `A–Z a–z 0–9 . _ -`, and neither `.` nor `..`."""
    return isinstance(key, str) and _KEY.fullmatch(key) is not None and key not in (".", "..")


@dataclass(frozen=True)
class CheckpointPolicy:
    """When the SDK captures a resource.

    `every_steps=N`: after every Nth live tool call or local step affecting
    the resource (an integer from 1 to 1,000,000). `on_completion`: when the
    handler returns normally, if the resource is uncovered. The policy a key
    was first registered with is kept for the whole execution and its forks.
    """

    every_steps: int = 1
    on_completion: bool = True

    def __post_init__(self) -> None:
        n = self.every_steps
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_EVERY_STEPS:
            raise ValueError(f"every_steps must be an integer from 1 to {MAX_EVERY_STEPS:,}, not {n!r}")
        if not isinstance(self.on_completion, bool):
            raise TypeError(f"on_completion must be a bool, not {self.on_completion!r}")


class ResourceDriver(Protocol[HandleT, BindingT]):
    """What `resource(driver=...)` needs. Duck typing works: any object with
    these members. Each method may be `async` or plain (a plain one runs in a
    worker thread, so it cannot stall the lease heartbeats).

    Optional members: `configuration` (JSON settings without credentials,
    default None) and `coverage_reuse` (default False: every live step ends
    the resource's coverage; True: only a live tool call or local step that
    declares the resource does).
    """

    @property
    def driver_id(self) -> str:
        """A stable name of the implementation, e.g. `"example.e2b.v1"`."""
        ...

    def create(self, checkpoint_ref: str | None = None) -> (
            tuple[HandleT, BindingT] | Awaitable[tuple[HandleT, BindingT]]):
        """A new, isolated resource: from `checkpoint_ref`, or the initial
        environment when called without one. Returns `(handle, binding)`; raise
        `CheckpointUnavailable` when the checkpoint is missing or expired."""
        ...

    def open(self, binding: BindingT) -> HandleT | Awaitable[HandleT]:
        """A handle for the live resource a binding names."""
        ...

    def checkpoint(self, handle: HandleT) -> str | Awaitable[str]:
        """Capture the resource; return an immutable ref and leave the
        handle usable."""
        ...


# --------------------------------------------------------------------- helpers


def truncate_utf8(text: str, limit: int = MAX_ERROR_BYTES) -> str:
    """`text` cut to at most `limit` bytes of UTF-8, at a character boundary
    (a lone surrogate becomes `?`)."""
    data = text.encode("utf-8", "replace")
    return data[:limit].decode("utf-8", "ignore")


def _ref_problem(ref: Any) -> str | None:
    if not isinstance(ref, str):
        return f"checkpoint() must return a string ref, not {type(ref).__name__}"
    if not ref:
        return "checkpoint() returned an empty ref"
    if len(ref.encode("utf-8", "replace")) > MAX_REF_BYTES:
        return f"checkpoint() returned a ref longer than {MAX_REF_BYTES} bytes"
    return None


@dataclass(frozen=True)
class _Identity:
    driver_id: str
    configuration: Any
    configuration_text: str
    coverage_reuse: bool

    def describe(self) -> str:
        return (f"driver_id {self.driver_id!r}, configuration {self.configuration_text}, "
                f"coverage_reuse {self.coverage_reuse}")


def _identity(driver: Any) -> _Identity:
    for name in ("create", "open", "checkpoint"):
        if not callable(getattr(driver, name, None)):
            raise TypeError(f"a resource driver needs a {name}() method; {type(driver).__name__} has none")
    driver_id = getattr(driver, "driver_id", None)
    if not isinstance(driver_id, str):
        raise TypeError(f"driver_id must be a string, not {type(driver_id).__name__}")
    if not driver_id or len(driver_id.encode("utf-8", "replace")) > MAX_DRIVER_ID_BYTES:
        raise ValueError(f"driver_id must be a non-empty string of at most {MAX_DRIVER_ID_BYTES} bytes")
    configuration = getattr(driver, "configuration", None)
    try:
        text = canonical_json(configuration, lenient=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"the driver's configuration is not JSON-serialisable: {e}") from None
    reuse = getattr(driver, "coverage_reuse", False)
    if not isinstance(reuse, bool):
        raise TypeError(f"coverage_reuse must be a bool, not {reuse!r}")
    return _Identity(driver_id, configuration, text, reuse)


def _described(data: Any) -> str:
    if not isinstance(data, dict):
        return str(data)
    try:
        config = canonical_json(data.get("configuration"), lenient=False)
    except (TypeError, ValueError):
        config = repr(data.get("configuration"))
    return (f"driver_id {data.get('driver_id')!r}, configuration {config}, "
            f"coverage_reuse {data.get('coverage_reuse')}")


# -------------------------------------------------------------------- resource()


async def resource(key: str, *, driver: ResourceDriver[HandleT, Any],
                   checkpoints: CheckpointPolicy | None = None) -> HandleT:
    """Open the execution's resource `key` and return its handle.

    On first use the SDK creates the resource from its initial environment or
    the fork's selected checkpoint; later dispatches open the recorded
    binding. Calls with the same key within a dispatch return the same handle.
    `checkpoints` defaults to `CheckpointPolicy()` (every step, and on
    completion); the policy a key was first registered with always wins.

    Raises `ValueError` when the key is invalid or was opened (in this
    dispatch, or as recorded) with another driver_id, configuration or
    coverage_reuse; `CheckpointUnavailable` (after failing the execution) when
    the driver cannot restore the selected checkpoint; `RuntimeError` outside
    a handler. Other create and open errors propagate unchanged.
    """
    ctx = require_context("resource()")
    if not valid_resource_key(key):
        raise ValueError(f"invalid resource key {key!r}: 1 to 128 characters from A-Z a-z 0-9 . _ -, "
                         "and neither '.' nor '..'")
    policy = CheckpointPolicy() if checkpoints is None else checkpoints
    if not isinstance(policy, CheckpointPolicy):
        raise TypeError("checkpoints must be a CheckpointPolicy or None")
    ident = _identity(driver)
    ctx.check()
    rs = ctx.resources
    entry = rs.entries.get(key)
    if entry is not None:
        cached = _Identity(entry.driver_id, entry.configuration, entry.configuration_text, entry.coverage_reuse)
        if cached.driver_id != ident.driver_id or cached.configuration_text != ident.configuration_text \
                or cached.coverage_reuse != ident.coverage_reuse:
            raise ValueError(f'resource "{key}" is already open in this dispatch with {cached.describe()}; '
                             f"this call passes {ident.describe()}")
        handle = entry.handle if entry.done else await asyncio.shield(entry.ready)
        _warn_policy(entry, policy.every_steps, policy.on_completion)
        return handle  # type: ignore[no-any-return]

    entry = OpenedResource(key=key, driver=driver, driver_id=ident.driver_id, configuration=ident.configuration,
                           configuration_text=ident.configuration_text, coverage_reuse=ident.coverage_reuse,
                           every_steps=policy.every_steps, on_completion=policy.on_completion,
                           ready=asyncio.get_running_loop().create_future())
    # A failed first use is retrieved by whoever awaits it, or by nobody.
    entry.ready.add_done_callback(lambda f: f.cancelled() or f.exception())
    rs.entries[key] = entry
    rs.serialise = True  # "while an execution has resources" starts now
    try:
        handle = await _first_use(ctx, entry, policy)
    except BaseException as exc:
        if rs.entries.get(key) is entry:
            del rs.entries[key]
        if not entry.ready.done():
            if isinstance(exc, asyncio.CancelledError):
                entry.ready.cancel()
            else:
                entry.ready.set_exception(exc)
        raise
    entry.handle, entry.done = handle, True
    entry.ready.set_result(handle)
    return handle  # type: ignore[no-any-return]


def _warn_policy(entry: OpenedResource, every_steps: int, on_completion: bool) -> None:
    """One warning per key and dispatch when code passes a policy other than
    the stored one, which wins (docs/protocol/sdk.md §4.3)."""
    stored = (entry.stored_every_steps, entry.stored_on_completion)
    if (every_steps, on_completion) != stored and not entry.policy_warned:
        entry.policy_warned = True
        log.warning('rebuno: resource "%s" keeps its recorded checkpoint policy (every_steps=%d, '
                    "on_completion=%s); the policy passed (every_steps=%d, on_completion=%s) is ignored",
                    entry.key, stored[0], stored[1], every_steps, on_completion)


def _registration(entry: OpenedResource, every_steps: int, on_completion: bool) -> dict[str, Any]:
    return {"key": entry.key, "driver_id": entry.driver_id, "configuration": entry.configuration,
            "coverage_reuse": entry.coverage_reuse, "every_steps": every_steps, "on_completion": on_completion}


async def _register(ctx: ExecutionContext, entry: OpenedResource, every_steps: int, on_completion: bool) -> Resource:
    # Resource requests read and change coverage, which a step outcome still
    # waiting for a carrier would change after them (docs/protocol/steps.md §13).
    await ctx.outbox.flush()
    try:
        view = await ctx.kernel.register_resource(ctx.execution_id, ctx.lease,
                                                  _registration(entry, every_steps, on_completion))
    except Terminated as t:
        raise ctx.terminated(t) from None
    except ConflictError as e:
        stored, requested = e.details.get("stored"), e.details.get("requested")
        raise ValueError(f'resource "{entry.key}" is registered with {_described(stored)}; this call passes '
                         f"{_described(requested)} (keep driver_id, configuration and coverage_reuse stable "
                         "for each key)") from e
    ctx.resources.learn(entry.key, view.generation)
    return view


async def _first_use(ctx: ExecutionContext, entry: OpenedResource, policy: CheckpointPolicy) -> Any:
    rs = ctx.resources
    inside = current_mark(ctx)
    locked = False
    if inside is None:
        await rs.lock.acquire()
        locked = True
    try:
        ctx.check()
        view = await _register(ctx, entry, policy.every_steps, policy.on_completion)
        entry.registered_seq = view.registered_seq
        # The stored policy wins (docs/protocol/sdk.md §4.3): remember it, warn about a difference.
        entry.stored_every_steps, entry.stored_on_completion = view.every_steps, view.on_completion
        _warn_policy(entry, policy.every_steps, policy.on_completion)
        if view.binding is not None:
            return await call_off_loop(entry.driver.open, view.binding)
        try:
            if view.checkpoint_ref == "":
                created = await call_off_loop(entry.driver.create)
            else:
                created = await call_off_loop(entry.driver.create, view.checkpoint_ref)
        except CheckpointUnavailable as exc:
            await _fail_unavailable(ctx, entry.key, exc)
            raise
        handle, binding = _created(created)
        await ctx.outbox.flush()
        try:
            await ctx.kernel.bind_resource(ctx.execution_id, ctx.lease, entry.key, binding)
        except Terminated as t:
            raise ctx.terminated(t) from None
        entry.handle = handle
        if not view.covered:
            await _baseline(ctx, entry)
        return handle
    finally:
        if locked:
            rs.lock.release()


def _created(created: Any) -> tuple[Any, Any]:
    if not isinstance(created, (tuple, list)) or len(created) != 2:
        raise TypeError(f"create() must return (handle, binding), not {type(created).__name__}")
    handle, binding = created
    if binding is None:
        raise TypeError("create() returned a null binding")
    try:
        canonical_json(binding, lenient=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"create() returned a binding that is not JSON-serialisable: {e}") from None
    return handle, binding


async def _fail_unavailable(ctx: ExecutionContext, key: str, exc: CheckpointUnavailable) -> None:
    """Fail the execution at once and make the context terminal (docs/protocol/sdk.md §4.3)."""
    reason = f'checkpoint_unavailable: resource "{key}": {exc}'
    try:
        await ctx.finish(reason=reason)
    except Terminated as t:
        ctx.terminated(t)
    except APIError as e:
        log.warning("rebuno: could not fail execution %s (%s): %s", ctx.execution_id, reason, e)
    ctx.stop("execution_terminal")


async def _baseline(ctx: ExecutionContext, entry: OpenedResource) -> None:
    """Capture a freshly created, uncovered resource: now, or at the end of
    the outermost running body when `resource()` was called inside one."""
    inside = current_mark(ctx)
    root = inside.root() if inside is not None else None
    if root is not None:
        root.defer([entry.key])
        return
    captures, failures = await capture_entries(ctx, [entry], "baseline")
    await _publish(ctx, captures, failures)


async def _publish(ctx: ExecutionContext, captures: list[dict[str, Any]],
                   failures: list[dict[str, Any]]) -> None:
    if not captures and not failures:
        return
    await ctx.outbox.flush()
    try:
        await ctx.kernel.publish_checkpoints(ctx.execution_id, ctx.lease, captures=captures,
                                             capture_failures=failures)
    except Terminated as t:
        raise ctx.terminated(t) from None
    except APIError as e:
        log.warning("rebuno: could not publish the captures of %s: %s", ctx.execution_id, e)


# ----------------------------------------------------------------------- captures


def _capturing(ctx: ExecutionContext) -> bool:
    """No capture while the dispatch is being stopped or the execution is
    terminal: a newer dispatch may already run steps (docs/protocol/sdk.md §4.6)."""
    return not ctx.stopping and not isinstance(ctx.signal, Terminated)


async def capture_entries(ctx: ExecutionContext, entries: Sequence[OpenedResource],
                          what: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Call `checkpoint` for each resource, in order; return the captures and
    the capture failures to report. Each carries the newest generation the
    SDK held for the key when it called `checkpoint`."""
    captures: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    if not _capturing(ctx):
        return captures, failures
    for entry in entries:
        generation = ctx.resources.generations.get(entry.key, 0)
        try:
            ref = await call_off_loop(entry.driver.checkpoint, entry.handle)
            problem = _ref_problem(ref)
            if problem is not None:
                raise ValueError(problem)
        except Exception as exc:
            message = truncate_utf8(str(exc) or type(exc).__name__)
            log.warning('rebuno: capture of resource "%s" (%s) failed: %s', entry.key, what, message)
            failures.append({"key": entry.key, "generation": generation, "error": message})
            continue
        captures.append({"key": entry.key, "generation": generation, "checkpoint_ref": ref})
    return captures, failures


class StepGuard:
    """The resource side of one tool call or local step: the step lock, the
    declared-keys check, the body mark and the due captures (docs/protocol/sdk.md §4.4–§4.6)."""

    def __init__(self, ctx: ExecutionContext, declared: Sequence[str]) -> None:
        self.ctx = ctx
        self.declared = list(declared)
        self.enclosing = current_mark(ctx)
        self.mark: BodyMark | None = None
        self.due: list[str] = []
        self._locked = False

    @property
    def nested(self) -> bool:
        return self.enclosing is not None

    async def __aenter__(self) -> StepGuard:
        rs = self.ctx.resources
        if self.enclosing is None and rs.serialise:
            await rs.lock.acquire()
            self._locked = True
        try:
            for key in self.declared:
                if rs.opened(key) is None:
                    raise ValueError(f'resource "{key}" must be opened with resource() in this dispatch before '
                                     "a step declares it")
        except BaseException:
            self._release()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        if self._locked:
            self._locked = False
            self.ctx.resources.lock.release()

    def started(self, decision: Decision) -> None:
        """The start's answer: which declared keys are due, in declaration order."""
        due = {e.key for e in decision.resources or [] if e.due}
        self.due = [k for k in self.declared if k in due]

    @contextlib.contextmanager
    def body(self) -> Iterator[None]:
        """Mark the running body; calls made inside it re-enter the lock."""
        self.mark = BodyMark(self.ctx, parent=self.enclosing)
        token = set_mark(self.mark)
        try:
            yield
        finally:
            self.mark.active = False
            reset_mark(token)

    async def captures(self, what: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The captures to send with this step's outcome: its due keys, then
        the keys deferred to it by nested steps. A step nested in a running
        body defers them to the outermost one instead."""
        keys = list(self.due)
        if self.mark is not None:
            keys += [k for k in self.mark.deferred if k not in keys]
        if not keys or not _capturing(self.ctx):
            return [], []
        root = self.mark.root() if self.mark is not None else None
        if root is not None:
            root.defer(keys)
            return [], []
        rs = self.ctx.resources
        entries = [e for e in (rs.entries.get(k) for k in keys) if e is not None and e.handle is not None]
        return await capture_entries(self.ctx, entries, what)


async def completion_captures(ctx: ExecutionContext) -> None:
    """Before `complete` (docs/protocol/sdk.md §4.6): read the view of each resource opened in this
    dispatch by registering it again, and capture, in registration order, those
    that are uncovered and have `on_completion`. One publish carries them."""
    if not _capturing(ctx) or ctx.signal is not None:
        return
    rs = ctx.resources
    opened = [e for e in rs.entries.values() if e.done]
    never = [k for k in rs.initial_keys if rs.opened(k) is None]
    if never:
        log.warning("rebuno: execution %s completes without a completion capture of %s: resource() was not "
                    "called for them in this dispatch", ctx.execution_id, ", ".join(f'"{k}"' for k in never))
    due: list[tuple[int, OpenedResource]] = []
    for entry in opened:
        try:
            view = await _register(ctx, entry, entry.every_steps, entry.on_completion)
        except ValueError as e:  # cannot happen with the values this dispatch registered
            log.warning("rebuno: completion capture of resource %r skipped: %s", entry.key, e)
            continue
        except APIError as e:
            log.warning("rebuno: completion capture of resource %r skipped: %s", entry.key, e)
            continue
        if view.on_completion and not view.covered:
            due.append((view.registered_seq, entry))
    if not due:
        return
    due.sort(key=lambda item: item[0])
    captures, failures = await capture_entries(ctx, [e for _, e in due], "completion")
    await _publish(ctx, captures, failures)

