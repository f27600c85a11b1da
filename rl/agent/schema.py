"""A small JSON-schema subset for tool arguments: checked at registration, applied to every call.

Supported keywords (JSON Schema draft 2020-12 meaning): the top level is ``{"type": "object",
"properties": {...}, "required": [...], "additionalProperties": bool}`` (extra arguments are an error
unless ``additionalProperties`` is true); a property has ``type`` (integer, number, string, boolean,
array), and optionally ``enum``, ``minimum``, ``maximum``, ``items``, ``minItems``, ``maxItems``,
``description``. One extension: ``"x-image": true`` on an integer marks a note image index, checked
to lie in 1..n_images. Other keywords are rejected at registration, so a schema never silently means
less than it says.
"""

from __future__ import annotations

from typing import Any

from rl.agent.parse import ParseError

TYPES = {"integer", "number", "string", "boolean", "array"}
VALUE_KEYS = {"type", "enum", "minimum", "maximum", "items", "minItems", "maxItems", "description", "x-image"}
OBJECT_KEYS = {"type", "properties", "required", "additionalProperties", "description"}


def check_schema(schema: dict[str, Any], *, where: str = "schema") -> None:
    """Raise ``ValueError`` (saying which key) unless ``schema`` is an object schema of the subset."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ValueError(f'{where}: a tool schema must be a dict with "type": "object"')
    unknown = set(schema) - OBJECT_KEYS
    if unknown:
        raise ValueError(f"{where}: unsupported keys {sorted(unknown)}; supported: {sorted(OBJECT_KEYS)}")
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise ValueError(f"{where}: properties must be a dict of name -> schema")
    if "name" in props:
        raise ValueError(f'{where}: "name" is reserved for the tool name; rename the argument')
    missing = [r for r in schema.get("required", []) if r not in props]
    if missing:
        raise ValueError(f"{where}: required {missing} are not in properties")
    for key, sub in props.items():
        _check_value_schema(sub, f"{where}.properties.{key}")


def _check_value_schema(schema: Any, where: str) -> None:
    if not isinstance(schema, dict) or schema.get("type") not in TYPES:
        raise ValueError(f"{where}: needs a type in {sorted(TYPES)}")
    unknown = set(schema) - VALUE_KEYS
    if unknown:
        raise ValueError(f"{where}: unsupported keys {sorted(unknown)}; supported: {sorted(VALUE_KEYS)}")
    if schema.get("x-image") and schema["type"] != "integer":
        raise ValueError(f"{where}: x-image marks an integer image index, got type {schema['type']!r}")
    if schema["type"] == "array":
        if "items" not in schema:
            raise ValueError(f"{where}: an array needs an items schema")
        _check_value_schema(schema["items"], f"{where}.items")


def validate_args(schema: dict[str, Any], args: dict[str, Any], *, n_images: int) -> ParseError | None:
    """The first problem of ``args`` under ``schema`` (checked by :func:`check_schema`), or None."""
    props = schema.get("properties", {})
    missing = [k for k in schema.get("required", []) if k not in args]
    if missing:
        return ParseError("missing_arg", f"missing argument(s) {missing}; expected {sorted(props)}")
    if not schema.get("additionalProperties", False):
        extra = sorted(set(args) - set(props))
        if extra:
            return ParseError("extra_arg", f"unexpected argument(s) {extra}; expected {sorted(props)}")
    for key, value in args.items():
        if key in props:
            problem = _validate_value(props[key], value, key, n_images)
            if problem is not None:
                return problem
    return None


def _is_type(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, {"string": str, "boolean": bool, "array": list}[kind])


def _validate_value(schema: dict[str, Any], value: Any, path: str, n_images: int) -> ParseError | None:
    kind = schema["type"]
    if not _is_type(value, kind):
        return ParseError("bad_type", f"{path} must be a JSON {kind}, got {json_type(value)}")
    if "enum" in schema and value not in schema["enum"]:
        return ParseError("bad_value", f"{path} must be one of {schema['enum']}, got {value!r}")
    if schema.get("x-image") and not 1 <= value <= n_images:
        return ParseError("image_out_of_range", f"{path}={value} but the note has images 1..{n_images}")
    if "minimum" in schema and value < schema["minimum"]:
        return ParseError("bad_value", f"{path} must be >= {schema['minimum']}, got {value}")
    if "maximum" in schema and value > schema["maximum"]:
        return ParseError("bad_value", f"{path} must be <= {schema['maximum']}, got {value}")
    if kind == "array":
        lo, hi = schema.get("minItems", 0), schema.get("maxItems")
        if len(value) < lo or (hi is not None and len(value) > hi):
            want = f"{lo}" if hi == lo else f"{lo}..{hi if hi is not None else 'any'}"
            return ParseError("bad_value", f"{path} must have {want} items, got {len(value)}")
        for i, item in enumerate(value):
            problem = _validate_value(schema["items"], item, f"{path}[{i}]", n_images)
            if problem is not None:
                return problem
    return None


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type."""
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return {int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )
