"""The admin API's OpenAPI 3 description, served at ``/admin/openapi.json``."""

from __future__ import annotations

from typing import Any

from gateway.config.catalog import MODEL_PROCESSORS

_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
_ERROR = {"$ref": "#/components/schemas/Error"}
_SERVICE_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/ServiceSpec"}},
        "application/yaml": {"schema": {"$ref": "#/components/schemas/ServiceSpec"}},
    },
}


def _answer(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _json_body(**properties: dict[str, Any]) -> dict[str, Any]:
    """A required JSON request body: an object with these properties."""
    return {"required": True, "content": {"application/json": {"schema": {"properties": properties}}}}


def _errors(*statuses: int) -> dict[str, Any]:
    text = {
        400: "a body the call cannot use (not a service description, or a body on a call that takes "
        "none), an invalid name, or a config file that does not load",
        401: "missing or wrong admin token",
        404: "no such service",
        409: "the service exists already; for a canary: one is under way (start), none is (abort)",
        422: "the new version did not start; the running one serves on",
        507: "the queue store refused the write (disk full, read-only)",
    }
    return {str(s): _answer(text[s], _ERROR) for s in (401, *statuses)}


_SERVICE = {"$ref": "#/components/schemas/Service"}

OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "eas-gateway admin API", "version": "1"},
    "components": {
        "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": {
                "type": "object",
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "request_id": {}},
            },
            "ServiceSpec": {
                "type": "object",
                "description": "A services: entry of the config file (see docs/configuration.md)",
                "required": ["name", "processor"],
                "properties": {
                    "name": {"type": "string"},
                    "processor": {"type": "string", "enum": [*MODEL_PROCESSORS, "python"]},
                    "model": {"type": "string"},
                    "entry": {"type": "string"},
                    "workers": {"type": "integer", "minimum": 1, "maximum": 64},
                    "placement": {"type": "string", "enum": ["auto", "process", "thread"]},
                    "token": {"type": "string"},
                    "timeout_ms": {"type": "integer"},
                    "max_pending": {"type": "integer"},
                },
                "additionalProperties": True,
            },
            "Service": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "spec": {"$ref": "#/components/schemas/ServiceSpec"},
                    "managed": {"type": "boolean", "description": "changed through this API"},
                    "ready": {"type": "boolean"},
                    "placement": {"type": "string", "enum": ["process", "thread"]},
                    "placement_reason": {
                        "type": "string",
                        "description": "why placement: auto chose it; absent where the spec names it",
                    },
                    "reason": {"type": "string", "description": "why it is not ready"},
                    "workers": {"type": "array", "items": {"type": "object"}},
                    "restarts": {"type": "integer"},
                    "in_flight": {"type": "integer"},
                    "queue_depth": {"type": "integer"},
                    "desired_workers": {
                        "type": "integer",
                        "description": "with autoscale: the workers its load asks for",
                    },
                    "requests": {"type": "integer"},
                    "latency_sum_s": {"type": "number"},
                    "rollout": {
                        "type": "object",
                        "description": "only while a rolling update runs: phase (starting, draining), "
                        "new_workers, new_ready, old_workers, old_in_flight, elapsed_s",
                    },
                },
            },
        },
    },
    "security": [{"token": []}],
    "paths": {
        "/admin/services": {
            "get": {
                "summary": "List services with their live state",
                "responses": {"200": _answer("services", {"type": "object"}), **_errors(400)},
            },
            "post": {
                "summary": "Create a service",
                "requestBody": _SERVICE_BODY,
                "responses": {"201": _answer("created", _SERVICE), **_errors(400, 409)},
            },
        },
        "/admin/services/{name}": {
            "parameters": [_NAME],
            "get": {
                "summary": "One service",
                "responses": {"200": _answer("the service", _SERVICE), **_errors(400, 404)},
            },
            "put": {
                "summary": "Update a service (rolling: the new version is ready before the old one drains)",
                "requestBody": _SERVICE_BODY,
                "responses": {"200": _answer("updated", _SERVICE), **_errors(400, 404, 422)},
            },
            "delete": {
                "summary": "Delete a service (drained, then stopped)",
                "responses": {"200": _answer("deleted", {"type": "object"}), **_errors(400, 404)},
            },
        },
        "/admin/services/{name}/scale": {
            "parameters": [_NAME],
            "post": {
                "summary": "Change the number of workers",
                "requestBody": _json_body(workers={"type": "integer"}),
                "responses": {"200": _answer("scaled", _SERVICE), **_errors(400, 404)},
            },
        },
        "/admin/services/{name}/traffic": {
            "parameters": [_NAME],
            "put": {
                "summary": "Split the calls that name no version between the service's versions "
                "(percents adding up to 100), in place",
                "requestBody": _json_body(
                    traffic={"type": "object", "additionalProperties": {"type": "integer"}}
                ),
                "responses": {"200": _answer("the new split", _SERVICE), **_errors(400, 404)},
            },
        },
        "/admin/services/{name}/canary": {
            "parameters": [_NAME],
            "post": {
                "summary": "Move the calls to a new version step by step, rolled back by itself when it does "
                "worse than the old one (steps [100]: blue-green); progress in the service's canary",
                "requestBody": _json_body(
                    version={"type": "string"},
                    steps={"type": "array", "items": {"type": "integer"}},
                    interval_s={"type": ["number", "string"]},
                    max_error_increase={"type": "number"},
                    max_p99_ratio={"type": "number"},
                    min_calls={"type": "integer"},
                ),
                "responses": {"202": _answer("started", _SERVICE), **_errors(400, 404, 409)},
            },
            "delete": {
                "summary": "Abort the canary under way: the split goes back to what it was",
                "responses": {"200": _answer("aborted", _SERVICE), **_errors(400, 404, 409)},
            },
        },
        "/admin/services/{name}/groups": {
            "parameters": [_NAME],
            "get": {
                "summary": "Consumer groups of the service's queues: cursor, pending, lag, consumers, idle",
                "responses": {"200": _answer("groups per queue", {"type": "object"}), **_errors(400, 404)},
            },
        },
        "/admin/services/{name}/groups/{group}": {
            "parameters": [
                _NAME,
                {"name": "group", "in": "path", "required": True, "schema": {"type": "string"}},
                {"name": "queue", "in": "query", "required": False, "schema": {"type": "string"}},
            ],
            "delete": {
                "summary": "Delete a consumer group and the records only it still needed",
                "responses": {"200": _answer("deleted", {"type": "object"}), **_errors(400, 404, 409, 507)},
            },
        },
        "/admin/status": {
            "get": {
                "summary": "The status page's snapshot (what eas-gateway status prints): the gateway's "
                "version, pid and uptime, and every service's readiness (with the reason), rates, latency "
                "and workers",
                "responses": {"200": _answer("status", {"type": "object"}), **_errors(400)},
            },
        },
        "/admin/reload": {
            "post": {
                "summary": "Reload the config file (as SIGHUP does); 400 with SIGHUP's message when it does "
                "not load, the running services kept",
                "responses": {"200": _answer("what changed", {"type": "object"}), **_errors(400)},
            },
        },
    },
}

__all__ = ["OPENAPI"]
