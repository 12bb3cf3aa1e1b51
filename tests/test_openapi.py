"""The OpenAPI document `bls serve` publishes, generated from the message types."""

from __future__ import annotations

from collections.abc import AsyncIterator

import bls
from bls.serve import openapi


class Order(bls.Message):
    customer: str
    quantity: int = 1


class Receipt(bls.Message):
    total: float


@bls.script
async def buy(req: Order) -> Receipt:
    """Place an order."""
    return Receipt(total=req.quantity * 2.5)


@bls.script
async def track(req: Order) -> AsyncIterator[Receipt]:
    yield Receipt(total=0)


def test_each_entry_is_a_post_route_with_its_request_and_answers() -> None:
    doc = openapi.document({"buy": buy, "track": track}, "shop")
    assert doc["openapi"].startswith("3.1") and doc["info"]["title"] == "shop"
    post = doc["paths"]["/v1/scripts/buy"]["post"]
    assert post["summary"] == "Place an order."
    request = post["requestBody"]["content"]["application/json"]["schema"]
    assert request == {"$ref": "#/components/schemas/Order"}
    schemas = doc["components"]["schemas"]
    assert schemas["Order"]["required"] == ["customer"]
    assert set(schemas["Order"]["properties"]) == {"customer", "quantity"}
    ok = post["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/Receipt"}
    # Every documented error status answers with the one error shape.
    for code in ("400", "404", "408", "413", "422", "429", "502", "503", "504"):
        error = post["responses"][code]["content"]["application/json"]["schema"]
        assert error == {"$ref": "#/components/schemas/Error"}
    assert {p["name"] for p in post["parameters"]} == {"X-Request-Timeout", "X-Request-Id"}


def test_a_streaming_entry_is_documented_as_sse_and_ndjson_of_its_items() -> None:
    doc = openapi.document({"track": track}, "shop")
    content = doc["paths"]["/v1/scripts/track"]["post"]["responses"]["200"]["content"]
    item = {"$ref": "#/components/schemas/Receipt"}
    assert content["text/event-stream"]["x-item-schema"] == item
    assert content["application/x-ndjson"]["schema"] == item
