"""The OpenAPI document of a served script (``GET /openapi.json``), from its msgspec types."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from ..entry import Script
from ..messages import json_schema

__all__ = ["document", "entry_schemas"]

_REF = "#/components/schemas/{name}"

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {
                "type": {"type": "string"},
                "message": {"type": "string"},
                "stage": {"type": ["string", "null"]},
                "path": {"type": ["string", "null"]},
                "kind": {"type": "string"},
            },
        }
    },
}

_ERRORS = {
    "400": "the X-Request-Timeout header is not a positive number of seconds",
    "404": "no such entry",
    "408": "the body did not arrive within the body timeout",
    "413": "the body is over the size limit",
    "422": "the body is not valid JSON or not of the request type (error.path names the field)",
    "429": "over the in-flight limit; retry after Retry-After seconds",
    "502": "a stage failed",
    "503": "a stage is unavailable, or the server is shutting down",
    "504": "the request's deadline passed",
}


def entry_schemas(entry: Script) -> tuple[dict[str, Any], dict[str, Any]]:
    """Self-contained JSON schemas of an entry's request and response (or item)."""
    return json_schema(entry.signature.request), json_schema(entry.signature.response)


def _components(entries: Mapping[str, Script]) -> tuple[list[Any], dict[str, Any]]:
    types: list[Any] = []
    for entry in entries.values():
        types += [entry.signature.request, entry.signature.response]
    try:
        refs, components = msgspec.json.schema_components(types, ref_template=_REF)
        return list(refs), dict(components)
    except (TypeError, ValueError):  # a type msgspec cannot describe: leave it open
        return [{} for _ in types], {}


def document(entries: Mapping[str, Script], title: str) -> dict[str, Any]:
    refs, components = _components(entries)
    components["Error"] = _ERROR
    error_ref = {"$ref": _REF.format(name="Error")}
    paths: dict[str, Any] = {}
    for i, entry in enumerate(entries.values()):
        request, response = refs[2 * i], refs[2 * i + 1]
        if entry.streaming:
            content = {
                "text/event-stream": {
                    "schema": {"type": "string"},
                    "x-item-schema": response,
                },
                "application/x-ndjson": {"schema": response},
            }
            ok = "one event per item, then `event: end` (or one JSON line per item)"
        else:
            content = {"application/json": {"schema": response}}
            ok = "the result"
        responses: dict[str, Any] = {"200": {"description": ok, "content": content}}
        for code, why in _ERRORS.items():
            responses[code] = {
                "description": why,
                "content": {"application/json": {"schema": error_ref}},
            }
        paths[f"/v1/scripts/{entry.name}"] = {
            "post": {
                "operationId": entry.name,
                "summary": (entry.fn.__doc__ or "").strip().split("\n")[0] or entry.name,
                "parameters": [
                    {
                        "name": "X-Request-Timeout",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "number"},
                        "description": "deadline for the request in seconds",
                    },
                    {
                        "name": "X-Request-Id",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "string"},
                    },
                ],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": request}},
                },
                "responses": responses,
            }
        }
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1"},
        "paths": paths,
        "components": {"schemas": components},
    }
