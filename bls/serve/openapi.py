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


_RUN = {
    "type": "object",
    "required": ["id", "object", "entry", "status", "created"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "run"},
        "entry": {"type": "string"},
        "status": {"enum": ["queued", "running", "succeeded", "failed", "cancelled"]},
        "created": {"type": "number"},
        "started": {"type": ["number", "null"]},
        "ended": {"type": ["number", "null"]},
        "deadline": {"type": ["number", "null"]},
        "result": {"description": "what a synchronous request answers (a stream: its items)"},
        "error": {"type": ["object", "null"], "description": "the error body's `error`"},
    },
}


def document(entries: Mapping[str, Script], title: str, runs: bool = False) -> dict[str, Any]:
    """The document; ``runs``: background runs are offered (``Prefer: respond-async``
    and the ``/v1/runs`` routes, docs/runs.md)."""
    refs, components = _components(entries)
    components["Error"] = _ERROR
    error_ref = {"$ref": _REF.format(name="Error")}
    run_ref = {"$ref": _REF.format(name="Run")}
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
        if runs:
            responses["202"] = {
                "description": "with Prefer: respond-async: the run, at /v1/runs/ID (Location)",
                "content": {"application/json": {"schema": run_ref}},
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
                    *(_PREFER if runs else []),
                ],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": request}},
                },
                "responses": responses,
            }
        }
    if runs:
        components["Run"] = _RUN
        paths.update(_run_paths(run_ref, error_ref))
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1"},
        "paths": paths,
        "components": {"schemas": components},
    }


_PREFER = [
    {
        "name": "Prefer",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": "respond-async: answer 202 at once, run in the background",
    }
]


_LAST_EVENT_ID = {
    "name": "Last-Event-ID",
    "in": "header",
    "description": "the last event the client saw: the stream goes on after it",
    "schema": {"type": "integer", "minimum": 0},
}


def _run_paths(run_ref: dict[str, Any], error_ref: dict[str, Any]) -> dict[str, Any]:
    """The routes of background runs."""
    run = {"application/json": {"schema": run_ref}}
    missing = {"description": "no such run", "content": {"application/json": {"schema": error_ref}}}
    one = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]
    listing = {
        "type": "object",
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": run_ref},
            "has_more": {"type": "boolean"},
        },
    }
    query = [
        {"name": "status", "in": "query", "schema": _RUN["properties"]["status"]},  # type: ignore[index]
        {
            "name": "limit",
            "in": "query",
            "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
        },
        {"name": "before", "in": "query", "schema": {"type": "string"}},
    ]
    return {
        "/v1/runs": {
            "get": {
                "operationId": "list_runs",
                "summary": "background runs, newest first",
                "parameters": query,
                "responses": {
                    "200": {
                        "description": "a page",
                        "content": {"application/json": {"schema": listing}},
                    },
                    "400": {"description": "a parameter out of range, or not one of these"},
                },
            }
        },
        "/v1/runs/{id}": {
            "get": {
                "operationId": "get_run",
                "summary": "a background run: its status, result or error",
                "parameters": one,
                "responses": {"200": {"description": "the run", "content": run}, "404": missing},
            },
            "delete": {
                "operationId": "cancel_run",
                "summary": "cancel a background run and every call under it",
                "parameters": one,
                "responses": {
                    "200": {"description": "the run, ended", "content": run},
                    "202": {"description": "its frontend was asked to cancel it", "content": run},
                    "404": missing,
                },
            },
        },
        "/v1/runs/{id}/events": {
            "get": {
                "operationId": "run_events",
                "summary": "SSE of the run's status changes and items, then end (Last-Event-ID)",
                "parameters": [*one, _LAST_EVENT_ID],
                "responses": {
                    "200": {
                        "description": "events",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    },
                    "204": {"description": "the run ended, and Last-Event-ID was its end"},
                    "400": {"description": "Last-Event-ID is not an event's id"},
                    "404": missing,
                },
            }
        },
    }
