"""bls.transport: the ZeroMQ wire protocol (``wire``), the caller's side (``client``), the
worker server (``worker``), their settings, sockets, liveness and CURVE keys."""
