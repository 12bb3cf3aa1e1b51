"""bls.serve: the HTTP frontend of ``bls serve``.

``app`` (the ASGI application and its routes), ``admission`` and ``tenants`` (who runs, who
waits, whose a request is), ``intake`` (limits, the request's scope,
its body and deadline), ``framing`` (JSON, SSE and NDJSON bytes, error answers), ``chat``
(the OpenAI-compatible endpoint's shapes), ``openapi``, ``pages`` (the request timelines),
``metrics``, ``otel`` (trace export) and ``server`` (the Uvicorn and Hypercorn runners).
"""
