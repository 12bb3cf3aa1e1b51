"""What engines print that a user need not read: their known-harmless warnings.

A normal run of a vLLM stage on a CPU prints a screenful before its first token: that
Triton is missing (it is not used on a CPU), that ``enforce_eager`` disables compilation
(as asked), that tcmalloc is not preloaded, a deprecated name in a library, progress
bars. None of it needs action, and all of it hides the one line that does. Those messages
are kept out of a normal run, in this process and in the engine's own (which vLLM starts
separately); ``--verbose`` on ``bls run``/``serve``/``worker`` (or ``BLS_VERBOSE=1``)
shows everything. A message not listed here is always shown.
"""

from __future__ import annotations

import json
import logging
import os
import re
import warnings
from pathlib import Path

__all__ = ["HARMLESS", "Harmless", "quiet_engines", "verbose"]

# Warnings that say nothing a user can act on, as vLLM 0.32 and torch 2.13 word them on
# a CPU (the tests check that a normal run prints none of them).
HARMLESS = re.compile(
    "|".join(
        [
            r"Triton is not installed",
            r"Triton not available",
            r"requires Triton",
            r"Enforce eager set",
            r"Inductor compilation was disabled",
            r"Reset SSM cache type",
            r"is not found in LD_PRELOAD",
            r"Passing raw prompts to InputProcessor is deprecated",
            r"NUMA binding",
        ]
    )
)
_DEPRECATED = r"`torch.distributed.reduce_op` is deprecated"  # from inside vLLM


def verbose() -> bool:
    """Whether the user asked to see everything (``--verbose``, ``BLS_VERBOSE=1``)."""
    return os.environ.get("BLS_VERBOSE", "") not in ("", "0")


class Harmless(logging.Filter):
    """Drops the records :data:`HARMLESS` matches (used in the engine's process too)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return HARMLESS.search(record.getMessage()) is None


def quiet_engines(private_dir: Path) -> None:
    """Before an engine starts: unless :func:`verbose`, keep its known-harmless output out
    of this process's stderr and out of the processes it starts (through the environment
    they inherit and a logging configuration file in ``private_dir``)."""
    if verbose():
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # all of it, through ours
        return
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, Harmless) for f in handler.filters):
            handler.addFilter(Harmless())
    logging.getLogger("torch._library.triton").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=_DEPRECATED, category=FutureWarning)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # C++ warnings (NUMA binding)
    extra = f"ignore:{_DEPRECATED}:FutureWarning"
    current = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = f"{current},{extra}" if current else extra
    config = private_dir / "vllm-logging.json"
    config.write_text(json.dumps(_LOGGING))
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
    os.environ.setdefault("VLLM_LOGGING_CONFIG_PATH", str(config))


# vLLM's loggers in every process it starts: bls's format, on stderr, warnings and up,
# the harmless ones dropped.
_LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"harmless": {"()": "bls.models.noise.Harmless"}},
    "formatters": {"bls": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {
        "stderr": {
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stderr",
            "formatter": "bls",
            "filters": ["harmless"],
        }
    },
    "loggers": {
        "vllm": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
        "torch._library.triton": {"level": "ERROR"},
    },
}
