"""A real etcd server for the discovery tests: loopback, free ports, a temporary data dir."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from .procs import free_port, wait_for

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


class EtcdServer:
    """etcd on ``host`` (loopback, or a namespaced host's address with ``run`` the prefix
    that runs a program there)."""

    def __init__(self, data: Path, host: str = "127.0.0.1", run: list[str] | None = None) -> None:
        self.data = data
        self.host = host
        self.run = run or []
        self.client_port, self.peer_port = free_port(), free_port()
        self.url = f"etcd://{host}:{self.client_port}"
        self.http = f"http://{host}:{self.client_port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert ETCD is not None
        peer = f"http://{self.host}:{self.peer_port}"
        self.proc = subprocess.Popen(
            [*self.run, ETCD, "--data-dir", str(self.data), "--listen-client-urls", self.http,
             "--advertise-client-urls", self.http, "--listen-peer-urls", peer,
             "--initial-advertise-peer-urls", peer, "--initial-cluster", f"default={peer}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

        def healthy() -> bool:
            try:
                return self._get("/health").get("health") == "true"
            except (httpx.HTTPError, ValueError, subprocess.SubprocessError):
                return False

        wait_for(healthy, timeout=20, interval=0.05)

    def _get(self, path: str) -> dict[str, Any]:
        if not self.run:
            return dict(httpx.get(f"{self.http}{path}", timeout=1).json())
        out = subprocess.run(
            [*self.run, "curl", "-s", "-m", "1", f"{self.http}{path}"],
            capture_output=True, text=True, timeout=5,
        )  # fmt: skip
        return dict(json.loads(out.stdout))

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if not self.run:
            return dict(httpx.post(f"{self.http}{path}", json=body, timeout=5).json())
        out = subprocess.run(
            [*self.run, "curl", "-s", "-m", "5", "-X", "POST", "-d", json.dumps(body),
             f"{self.http}{path}"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        return dict(json.loads(out.stdout))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def keys(self, prefix: str = "/bls/stages/") -> dict[str, str]:
        """The registered keys under ``prefix`` and their values."""
        import base64

        end = bytearray(prefix.encode())
        end[-1] += 1
        got = self._post(
            "/v3/kv/range",
            {
                "key": base64.b64encode(prefix.encode()).decode(),
                "range_end": base64.b64encode(bytes(end)).decode(),
            },
        )
        return {
            base64.b64decode(kv["key"]).decode(): base64.b64decode(kv["value"]).decode()
            for kv in got.get("kvs", [])
        }
