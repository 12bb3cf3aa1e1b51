"""CURVE keys: ``bls keygen`` and applying keys to sockets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import zmq
import zmq.auth

__all__ = ["client_curve", "generate", "load_public", "load_secret", "server_curve"]


def generate(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write ``NAME.key`` (public) and ``NAME.key_secret`` (secret, readable by its
    owner only: mode 0600) into ``directory``."""
    import os

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    secret_path = directory / f"{name}.key_secret"
    # Create the secret file 0600 before anything is written into it: no moment when
    # another user could read it.
    secret_path.unlink(missing_ok=True)
    os.close(os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    public, secret = zmq.auth.create_certificates(str(directory), name)
    os.chmod(secret, 0o600)
    return Path(public), Path(secret)


def load_public(path: str | Path) -> bytes:
    public, _ = zmq.auth.load_certificate(str(path))
    return public


def load_secret(path: str | Path) -> tuple[bytes, bytes]:
    public, secret = zmq.auth.load_certificate(str(path))
    if secret is None:
        raise ValueError(f"{path} holds no secret key (use the .key_secret file)")
    return public, secret


def server_curve(sock: zmq.Socket[Any], secret_file: str | Path) -> None:
    """Make ``sock`` a CURVE server with the key pair in ``secret_file``."""
    public, secret = load_secret(secret_file)
    sock.curve_publickey = public
    sock.curve_secretkey = secret
    sock.curve_server = True


def client_curve(sock: zmq.Socket[Any], settings: Any) -> None:
    """Apply ``[transport] curve_server_key``/``curve_secret`` to a client socket."""
    server_key = getattr(settings, "curve_server_key", None)
    if not server_key:
        return
    secret_file = getattr(settings, "curve_secret", None)
    if not secret_file:
        raise ValueError("curve_server_key is set but curve_secret (the caller's key) is not")
    public, secret = load_secret(secret_file)
    sock.curve_serverkey = load_public(server_key)
    sock.curve_publickey = public
    sock.curve_secretkey = secret
