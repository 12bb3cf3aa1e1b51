"""A real etcd server for the discovery tests: loopback, free ports, a temporary data dir."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from .procs import wait_for

ETCD = shutil.which("etcd")


def require_etcd() -> None:
    """Skip the calling module without an etcd binary; CI sets BLS_REQUIRE_ETCD=1 (and
    installs Debian's etcd-server), and there a missing one fails."""
    if ETCD is None:
        if os.environ.get("BLS_REQUIRE_ETCD"):
            raise RuntimeError("BLS_REQUIRE_ETCD is set but no etcd is installed")
        pytest.skip(
            "etcd is not installed (Debian: apt install etcd-server)", allow_module_level=True
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EtcdServer:
    def __init__(self, data: Path) -> None:
        self.data = data
        self.client_port, self.peer_port = _free_port(), _free_port()
        self.url = f"etcd://127.0.0.1:{self.client_port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert ETCD is not None
        client = f"http://127.0.0.1:{self.client_port}"
        self.proc = subprocess.Popen(
            [ETCD, "--data-dir", str(self.data), "--listen-client-urls", client,
             "--advertise-client-urls", client,
             "--listen-peer-urls", f"http://127.0.0.1:{self.peer_port}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_port}",
             "--initial-cluster", f"default=http://127.0.0.1:{self.peer_port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

        def healthy() -> bool:
            try:
                return httpx.get(f"{client}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, timeout=20, interval=0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def keys(self, prefix: str = "/bls/stages/") -> dict[str, str]:
        """The registered keys under ``prefix`` and their values."""
        import base64

        end = bytearray(prefix.encode())
        end[-1] += 1
        r = httpx.post(
            f"http://127.0.0.1:{self.client_port}/v3/kv/range",
            json={
                "key": base64.b64encode(prefix.encode()).decode(),
                "range_end": base64.b64encode(bytes(end)).decode(),
            },
            timeout=5,
        )
        return {
            base64.b64decode(kv["key"]).decode(): base64.b64decode(kv["value"]).decode()
            for kv in r.json().get("kvs", [])
        }
