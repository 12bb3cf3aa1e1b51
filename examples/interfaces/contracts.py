"""The interfaces: what a worker and a router take and give, declared once as typed stages.

A script calls ``worker(...)`` or ``router(...)`` and never names an implementation; the
configuration picks one. Binding a stage to something whose types do not match its
declaration is refused when the pipeline starts, naming the stage and both types.
"""

import bls


class Prompt(bls.Message):
    text: str


class Token(bls.Message):
    text: str


# The worker interface: a prompt in, its words out one at a time.
worker = bls.StreamStage("worker", Prompt, Token)
# The router interface: the same contract, in front of some worker.
router = bls.StreamStage("router", Prompt, Token)
