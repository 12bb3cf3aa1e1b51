from remote_stages import Mark, Served

import bls


@bls.script
async def one_slow(req: Mark) -> Served:
    return await bls.stage("slow", req)
