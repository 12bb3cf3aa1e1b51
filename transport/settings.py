"""What a remote binding and a worker are configured with: ``[transport]`` in ``bls.toml``."""

from __future__ import annotations

from typing import Annotated

import msgspec

__all__ = ["TransportConfig"]

# Every number is checked as the file is read, so a 0 or a negative is refused at start-up
# naming its key (a heartbeat of 0 would spin; a bound of 0 would call every peer dead).
_Seconds = Annotated[float, msgspec.Meta(gt=0)]
_Bytes = Annotated[int, msgspec.Meta(ge=1, le=2**62)]


class TransportConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``[transport]`` in ``bls.toml``: settings for remote bindings."""

    heartbeat_s: _Seconds = 0.25
    dead_after_s: _Seconds = 1.0  # a caller declares a silent worker lost after this
    caller_dead_after_s: _Seconds = 15.0  # a worker gives up on a silent caller after this
    connect_timeout_s: _Seconds = 5.0
    max_frame_bytes: _Bytes = 256 * 1024 * 1024
    curve_server_key: str | None = None
    curve_secret: str | None = None
    # Where stages bound with `discover = "NAME"` (or --bind NAME=etcd:NAME) find their
    # workers: etcd://HOST:2379 (also --discovery), under /NAMESPACE/stages/NAME/.
    discovery: str | None = None
    namespace: str = "bls"
