"""A script for the affinity tests (tests/e2e/test_affinity.py), in the README's untyped
style: which `whoami` replica served a session's call (its result a dict: the
worker's type is not one this script loads). The test's bls.toml binds the
stage to three worker replicas with `affinity = { field = "marker" }`."""

import bls
from bls import stage


@bls.script
async def which(req: dict) -> dict:
    served = await stage("whoami", {"marker": req["session"]})
    return {"session": req["session"], "pid": served["pid"]}
