"""bench/compare_peers.py's Dynamo contender (runs in its own virtual environment): the same echo
and the same two-component chain on the Dynamo runtime, with file discovery and the TCP
request plane (no etcd, no NATS), on this host."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from dynamo.runtime import DistributedRuntime, UnaryClient, serve_unary_endpoint

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import PAYLOAD, measure


def runtime() -> DistributedRuntime:
    return DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")


async def serve(name: str) -> None:
    rt = runtime()
    endpoint = rt.endpoint(f"bench.{name}.generate")
    if name == "first":
        second = UnaryClient(await rt.endpoint("bench.second.generate").client())

        async def handler(request: Any, *, context: Any) -> Any:
            return await second.complete(request, context=context)
    else:

        async def handler(request: Any, *, context: Any) -> Any:
            return request

    print("ready", name, flush=True)
    await serve_unary_endpoint(endpoint, handler)


async def client(name: str) -> UnaryClient:
    c = await runtime().endpoint(f"bench.{name}.generate").client()
    await c.wait_for_instances()
    return UnaryClient(c)


async def both(calls: int, inflight: int) -> dict[str, float]:
    echo, chain = await client("echo"), await client("first")
    return await measure(
        lambda: echo.complete(PAYLOAD), lambda: chain.complete(PAYLOAD), calls, inflight
    )


def main() -> None:
    if sys.argv[1] == "--serve":
        asyncio.run(serve(sys.argv[2]))
        return
    calls, inflight = int(sys.argv[1]), int(sys.argv[2])
    procs = []
    try:
        for name in ("echo", "second", "first"):
            proc = subprocess.Popen(
                [sys.executable, __file__, "--serve", name],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
            procs.append(proc)
            assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        print(json.dumps(asyncio.run(both(calls, inflight))), flush=True)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
