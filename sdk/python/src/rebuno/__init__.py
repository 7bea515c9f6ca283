"""Rebuno: durable execution for AI agents — the Python SDK.

    from rebuno import Agent, tool, step, http_client

    @tool("web_search")
    async def web_search(query: str) -> str:
        \"\"\"Search the web.\"\"\"
        ...

    async def process(prompt: str) -> dict:
        found = await web_search(prompt)
        return {"answer": found}

    Agent("researcher").run(process, port=5000)
"""

from .agent import Agent
from .client import Client
from .errors import (
    APIError,
    Blocked,
    CheckpointUnavailable,
    ConflictError,
    ExecutionFailedError,
    ExecutionTerminalError,
    ForbiddenError,
    InternalServerError,
    LeaseSupersededError,
    MethodNotAllowedError,
    NotFoundError,
    PayloadTooLargeError,
    PolicyError,
    RateLimited,
    RebunoError,
    Terminated,
    ToolError,
    UnauthorizedError,
    UnavailableError,
    UnsupportedMediaTypeError,
    ValidationError,
    raise_for_refusal,
)
from .execution import ExecutionContext, execution
from .http_client import RebunoTransport, http_client
from .resources import CheckpointPolicy, ResourceDriver, resource
from .step import step
from .tool import tool, wrap_tool
from .types import (AgentInfo, Approval, CoveragePoint, CoverageRanges, Decision, DecisionKind, Event, Execution,
                    ExecutionPage, Resource, ResourceCoverage, ResourceRanges, Step, StreamDelta)

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "Client",
    "tool",
    "wrap_tool",
    "step",
    "http_client",
    "RebunoTransport",
    "resource",
    "CheckpointPolicy",
    "ResourceDriver",
    "execution",
    "ExecutionContext",
    "raise_for_refusal",
    "RebunoError",
    "PolicyError",
    "RateLimited",
    "ToolError",
    "Blocked",
    "Terminated",
    "CheckpointUnavailable",
    "ExecutionFailedError",
    "APIError",
    "ValidationError",
    "UnauthorizedError",
    "ForbiddenError",
    "NotFoundError",
    "MethodNotAllowedError",
    "ConflictError",
    "ExecutionTerminalError",
    "LeaseSupersededError",
    "PayloadTooLargeError",
    "UnsupportedMediaTypeError",
    "InternalServerError",
    "UnavailableError",
    "Execution",
    "ExecutionPage",
    "Step",
    "Event",
    "Approval",
    "AgentInfo",
    "Decision",
    "DecisionKind",
    "StreamDelta",
    "Resource",
    "ResourceCoverage",
    "ResourceRanges",
    "CoveragePoint",
    "CoverageRanges",
    "__version__",
]
