"""What a remote binding and a worker are configured with: ``[transport]`` in ``bls.toml``."""

from __future__ import annotations

import msgspec

__all__ = ["TransportConfig"]


class TransportConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``[transport]`` in ``bls.toml``: settings for remote bindings."""

    heartbeat_s: float = 0.25
    dead_after_s: float = 1.0  # a caller declares a silent worker lost after this
    caller_dead_after_s: float = 15.0  # a worker gives up on a silent caller after this
    connect_timeout_s: float = 5.0
    max_frame_bytes: int = 256 * 1024 * 1024
    curve_server_key: str | None = None
    curve_secret: str | None = None
    # Where stages bound with `discover = "NAME"` (or --bind NAME=etcd:NAME) find their
    # workers: etcd://HOST:2379 (also --discovery), under /NAMESPACE/stages/NAME/.
    discovery: str | None = None
    namespace: str = "bls"
