"""bench/peers.py's Ray Serve contender (runs in its own virtual environment): the same
echo and the same two-deployment chain through DeploymentHandles, Ray on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
import ray
from ray import serve

PAYLOAD = {"data": "x" * 100}


# No CPU reserved (2 cores); as many calls at once as a `bls worker` takes by default.
@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=256)
class Echo:
    async def __call__(self, req: dict) -> dict:
        return req


# No CPU reserved (2 cores); as many calls at once as a `bls worker` takes by default.
@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=256)
class First:
    def __init__(self, second) -> None:  # type: ignore[no-untyped-def]
        self.second = second

    async def __call__(self, req: dict) -> dict:
        return await self.second.remote(req)


async def measure(echo, chain, calls: int, inflight: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    for _ in range(200):
        await echo.remote(PAYLOAD)
    lat = []
    for _ in range(calls):
        t = time.perf_counter()
        await echo.remote(PAYLOAD)
        lat.append(time.perf_counter() - t)
    lat.sort()

    async def lane(n: int) -> None:
        for _ in range(n):
            await chain.remote(PAYLOAD)

    await lane(100)
    per = max(1, calls // inflight)
    t = time.perf_counter()
    await asyncio.gather(*(lane(per) for _ in range(inflight)))
    rps = per * inflight / (time.perf_counter() - t)
    return {
        "unary_p50_us": statistics.median(lat) * 1e6,
        "unary_p99_us": lat[int(len(lat) * 0.99)] * 1e6,
        "chain_rps": rps,
    }


def main() -> None:
    calls, inflight = int(sys.argv[1]), int(sys.argv[2])
    ray.init(
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        logging_level="ERROR",
        log_to_driver=False,
    )
    serve.start(
        http_options={"host": "127.0.0.1", "port": 0}, logging_config={"log_level": "ERROR"}
    )
    echo = serve.run(Echo.bind(), name="echo", route_prefix=None)
    chain = serve.run(First.bind(Echo.bind()), name="chain", route_prefix=None)
    try:
        print(json.dumps(asyncio.run(measure(echo, chain, calls, inflight))), flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
