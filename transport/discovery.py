"""Discovery through etcd: workers register under their stage name, callers watch.

Talks to a real etcd v3 server through its JSON gateway (``/v3/...``) with httpx, which
runs on asyncio and on trio alike. Nothing here is a registry of its own: etcd's leases
decide liveness.

- A worker (``bls worker --discovery etcd://HOST:2379 --advertise tcp://HOST:PORT``) puts
  ``/NAMESPACE/stages/STAGE/INSTANCE`` = ``{"address": ..., "instance": ...}`` under a
  lease of a few seconds that it keeps alive while it runs. A clean shutdown revokes the
  lease first (callers stop sending), then drains; a killed worker's lease expires.
- A caller (a stage bound to ``etcd:STAGE``) lists the prefix, then watches it from the
  next revision: a PUT is a replica joining, a DELETE one leaving. When etcd is away it
  retries, and lists again once it is back (nothing is missed: the list is the truth).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpx

__all__ = ["DEFAULT_NAMESPACE", "Etcd", "Registration", "watch_replicas"]

log = logging.getLogger("bls.discovery")

DEFAULT_NAMESPACE = "bls"
LEASE_TTL_S = 3  # a killed worker disappears from callers within this (plus a watch event)
RETRY_S = 0.5  # between attempts while etcd is away
# What etcd being away or answering oddly looks like: retried, never fatal.
_ETCD_ERRORS = (OSError, httpx.HTTPError, ValueError, KeyError)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _text(b64: str) -> str:
    return base64.b64decode(b64).decode()


def _prefix_end(prefix: str) -> str:
    """The key just past every key that starts with ``prefix`` (etcd's range_end)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


def stage_prefix(namespace: str, stage: str) -> str:
    return f"/{namespace}/stages/{stage}/"


class Etcd:
    """The few etcd v3 calls discovery needs, over the JSON gateway."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("etcd", "http", "https") or not parts.hostname:
            raise ValueError(f"--discovery must look like etcd://HOST:2379, got {url!r}")
        scheme = "https" if parts.scheme == "https" else "http"
        self.url = url
        self.base = f"{scheme}://{parts.hostname}:{parts.port or 2379}"
        self._http = httpx.AsyncClient(base_url=self.base, timeout=httpx.Timeout(5.0))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = await self._http.post(path, json=body)
        if r.status_code != 200:
            raise OSError(f"etcd at {self.base}: {path}: {r.status_code} {r.text[:200]}")
        result: dict[str, Any] = r.json()
        return result

    async def grant(self, ttl: int) -> str:
        return str((await self._post("/v3/lease/grant", {"TTL": ttl}))["ID"])

    async def keepalive(self, lease: str) -> bool:
        """Refresh the lease; False when etcd no longer knows it (it expired)."""
        got = await self._post("/v3/lease/keepalive", {"ID": lease})
        return int(got.get("result", {}).get("TTL", 0)) > 0

    async def revoke(self, lease: str) -> None:
        await self._post("/v3/lease/revoke", {"ID": lease})

    async def put(self, key: str, value: str, lease: str | None = None) -> None:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease is not None:
            body["lease"] = lease
        await self._post("/v3/kv/put", body)

    async def list(self, prefix: str) -> tuple[dict[str, str], int]:
        """Every key under ``prefix`` with its value, and the revision they were read at."""
        got = await self._post(
            "/v3/kv/range", {"key": _b64(prefix), "range_end": _prefix_end(prefix)}
        )
        kvs = {_text(kv["key"]): _text(kv.get("value", "")) for kv in got.get("kvs", [])}
        return kvs, int(got["header"]["revision"])

    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[tuple[str, str, str]]:
        """(PUT|DELETE, key, value) for each change under ``prefix`` from the revision on."""
        body = {
            "create_request": {
                "key": _b64(prefix),
                "range_end": _prefix_end(prefix),
                "start_revision": start_revision,
            }
        }
        async with self._http.stream("POST", "/v3/watch", json=body, timeout=None) as r:
            if r.status_code != 200:
                raise OSError(f"etcd at {self.base}: watch: {r.status_code}")
            async for line in r.aiter_lines():
                if not line.strip():
                    continue
                result = json.loads(line).get("result", {})
                if result.get("canceled"):
                    raise OSError(f"etcd cancelled the watch: {result.get('cancel_reason', '')}")
                for event in result.get("events", []):
                    kv = event.get("kv", {})
                    yield (
                        event.get("type", "PUT"),
                        _text(kv.get("key", "")),
                        _text(kv.get("value", "")),
                    )


class Registration:
    """A worker's entry under its stage, alive while :meth:`run` runs."""

    def __init__(self, etcd: Etcd, namespace: str, stage: str, address: str, instance: str) -> None:
        self.etcd = etcd
        self.key = f"{stage_prefix(namespace, stage)}{instance}"
        self.value = json.dumps({"address": address, "instance": instance, "stage": stage})
        self.stage = stage
        self.lease: str | None = None
        self._scope: anyio.CancelScope | None = None

    async def run(self) -> None:
        """Register, then keep the lease alive; register again whenever etcd forgot it
        (it was away longer than the lease). Runs until :meth:`withdraw`."""
        with anyio.CancelScope() as self._scope:
            while True:
                try:
                    self.lease = await self.etcd.grant(LEASE_TTL_S)
                    await self.etcd.put(self.key, self.value, self.lease)
                    log.info("stage %r: registered in etcd as %s", self.stage, self.key)
                    while True:
                        if not await self.etcd.keepalive(self.lease):
                            break
                        await anyio.sleep(LEASE_TTL_S / 3)
                    log.warning(
                        "stage %r: etcd forgot the registration; registering again", self.stage
                    )
                except _ETCD_ERRORS as exc:
                    log.warning("stage %r: etcd: %s (retrying)", self.stage, _why(exc))
                    await anyio.sleep(RETRY_S)

    async def withdraw(self) -> None:
        """Leave: stop the keep-alive and revoke the lease, which deletes the key (callers
        stop sending new calls)."""
        if self._scope is not None:
            self._scope.cancel()
        if self.lease is None:
            return
        with anyio.move_on_after(2):
            try:
                await self.etcd.revoke(self.lease)
                log.info("stage %r: withdrawn from etcd", self.stage)
            except _ETCD_ERRORS as exc:
                log.warning("stage %r: could not withdraw from etcd: %s", self.stage, _why(exc))


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def watch_replicas(
    etcd: Etcd,
    namespace: str,
    stage: str,
    on_change: Callable[[set[str]], None],
) -> None:
    """Keep ``on_change(addresses)`` told of the stage's registered replicas, until
    cancelled: the full set after the first listing, after every change, and again after
    each reconnection to etcd."""
    prefix = stage_prefix(namespace, stage)
    while True:
        try:
            kvs, revision = await etcd.list(prefix)
            replicas = {key: json.loads(value)["address"] for key, value in kvs.items()}
            on_change(set(replicas.values()))
            async for kind, key, value in etcd.watch(prefix, revision + 1):
                if kind == "DELETE":
                    replicas.pop(key, None)
                else:
                    replicas[key] = json.loads(value)["address"]
                on_change(set(replicas.values()))
            raise OSError("the watch ended")
        except _ETCD_ERRORS as exc:
            log.warning("stage %r: watching etcd: %s (retrying)", stage, _why(exc))
            await anyio.sleep(RETRY_S)
