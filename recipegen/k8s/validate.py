"""Validate rendered Kubernetes manifests against real schemas.

- Core kinds (Service, ConfigMap, …): `kubernetes-validate` (PyPI), which carries the upstream
  Kubernetes OpenAPI schemas; strict, so a misspelt field is an error.
- LeaderWorkerSet: the CRD's own OpenAPI v3 schema, vendored from kubernetes-sigs/lws
  (`schemas/leaderworkerset-v1.json`, source and commit inside). The API server prunes unknown
  fields of a CRD silently; `kubectl --validate=strict` rejects them. We do the latter: every
  object schema that lists its properties (and does not preserve unknown fields) is closed.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

from recipegen.common.errors import RecipegenError

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
LWS_SCHEMA_FILE = SCHEMA_DIR / "leaderworkerset-v1.json"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
# The Kubernetes schema version core kinds are checked against (kubernetes-validate ships it).
KUBERNETES_VERSION = "1.33.0"


@functools.lru_cache(maxsize=1)
def lws_schema() -> dict[str, Any]:
    """The vendored LeaderWorkerSet v1 schema, made strict (closed objects)."""
    vendored = json.loads(LWS_SCHEMA_FILE.read_text(encoding="utf-8"))
    return _closed(copy.deepcopy(vendored["openAPIV3Schema"]))


def lws_schema_source() -> dict[str, str]:
    return json.loads(LWS_SCHEMA_FILE.read_text(encoding="utf-8"))["source"]


def _closed(node: Any) -> Any:
    if isinstance(node, dict):
        for value in node.values():
            _closed(value)
        if (node.get("type") == "object" and "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
    elif isinstance(node, list):
        for item in node:
            _closed(item)
    return node


def _path(error: Any) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "(document)"


def _optional(module: str) -> Any:
    """The validators are an optional extra (kubernetes-validate bundles ~100 MB of schemas)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise RecipegenError(f"validating Kubernetes manifests needs {exc.name}: "
                             "pip install 'recipegen[k8s]'") from None


def validate_manifest(doc: dict[str, Any]) -> list[str]:
    """Every problem of one manifest document, as `kind name: path: message` lines."""
    kind = doc.get("kind", "?")
    name = (doc.get("metadata") or {}).get("name", "?")
    where = f"{kind} {name}"
    if doc.get("apiVersion") == LWS_API_VERSION and kind == "LeaderWorkerSet":
        jsonschema = _optional("jsonschema")

        validator = jsonschema.Draft7Validator(lws_schema())
        return [f"{where}: {_path(e)}: {e.message}"
                for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]
    kubernetes_validate = _optional("kubernetes_validate")
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{where}: {'.'.join(str(p) for p in exc.path) or '(document)'}: {exc.message}"]
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as exc:
        return [f"{where}: no schema to validate against: {exc}"]
    return []


def validate_manifests(docs: list[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    for doc in docs:
        problems.extend(validate_manifest(doc))
    return problems
