"""The stages of examples/hello.py: plain async functions, inline or behind `bls worker`."""

from hello import Draft, Verdict

import bls


async def draft(req: Draft) -> str:
    """Each attempt is a little more enthusiastic than the last."""
    text = req.prompt.strip()
    if req.attempt > 1:
        text = text[:1].upper() + text[1:]
    return text + "!" * (req.attempt - 1)


async def judge(text: str) -> Verdict:
    """Accept a reply that starts with a capital and ends with an exclamation mark."""
    if not text[:1].isupper():
        return Verdict(ok=False, reason="should start with a capital letter")
    if not text.endswith("!"):
        return Verdict(ok=False, reason="should sound enthusiastic")
    return Verdict(ok=True, reason="fine")


async def llm_judge(text: str) -> Verdict:
    """The judge as an LLM: a typed Verdict from whatever the `generator` stage runs (a
    vLLM engine decodes under the Verdict's JSON schema). Swap it in with
    `--bind judge=examples/hello_stages.py:llm_judge --bind generator=...`."""
    prompt = f"Is this reply polite and enthusiastic? Say why in a few words.\n\n{text}"
    verdict: Verdict = await bls.ask("generator", prompt, Verdict, max_tokens=128)
    return verdict
