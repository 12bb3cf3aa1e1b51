"""bench/compare_peers.py's Ray Serve contender (runs in its own virtual environment): the same
echo and the same two-deployment chain through DeploymentHandles, Ray on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parent))
import ray
from measure import PAYLOAD, measure
from ray import serve


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
        run = measure(lambda: echo.remote(PAYLOAD), lambda: chain.remote(PAYLOAD), calls, inflight)
        print(json.dumps(asyncio.run(run)), flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
