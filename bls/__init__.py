"""bls: imperative business-logic scripts for multi-stage ML inference.

Write the pipeline as a plain async function; every ``await stage("name", req)`` goes
to whatever the configuration binds that name to, in process or over ZeroMQ.

This namespace is the API scripts and programs use. Code that implements a new kind of
binding uses :mod:`bls.bindings` (``Binding``, ``InlineBinding``) and
:mod:`bls.runtime` (``StageStream``).
"""

from importlib.metadata import PackageNotFoundError, version

from .batching import batch
from .cache import CacheReport, cache_report
from .chat_request import ChatRequest
from .constraints import Constraint, Grammar, Regex
from .conversation import ChatMessage
from .entry import Script, script
from .errors import DeadlineExceeded, InvalidRequest, StageError, StageNotBound
from .flow import beside, collect, gather, map, race
from .llm import ask
from .messages import Message
from .priorities import current_priority, priority
from .runtime import BindingError, Runtime
from .stages import Stage, StreamStage, stage
from .timeouts import remaining, timeout
from .tools import Tool, ToolCall
from .worker import Worker

try:
    __version__ = version("bls-pipelines")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "BindingError",
    "CacheReport",
    "ChatMessage",
    "ChatRequest",
    "Constraint",
    "DeadlineExceeded",
    "Grammar",
    "InvalidRequest",
    "Message",
    "Regex",
    "Runtime",
    "Script",
    "Stage",
    "StageError",
    "StageNotBound",
    "StreamStage",
    "Tool",
    "ToolCall",
    "Worker",
    "__version__",
    "ask",
    "batch",
    "beside",
    "cache_report",
    "collect",
    "current_priority",
    "gather",
    "map",
    "priority",
    "race",
    "remaining",
    "script",
    "stage",
    "timeout",
]
