"""Typed configuration: pydantic models that reject unknown keys, loaded with the precedence
defaults < file (YAML/JSON) < environment (BRORL_ prefixed) < command-line overrides.

Overrides are ``dotted.key=value`` strings; values are parsed as YAML scalars/lists, so
``learner.lr=1e-4`` and ``sampling.stop=["\\n"]`` work.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from brorl.errors import InvalidArgument


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are an error, values are validated on
    assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


M = TypeVar("M", bound=BaseModel)


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[keys[-1]] = value


MAX_FLOW_DEPTH = 64


def _check_depth(text: str, source: str) -> None:
    """Refuse deeply nested [ / { before YAML sees them: PyYAML spends seconds on a few kB of
    them before it fails with RecursionError (a cheap way to tie up a service's thread). Brackets
    inside quoted strings count too: no real config nests anywhere near this deep."""
    depth = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            if depth > MAX_FLOW_DEPTH:
                raise InvalidArgument(source, f"nests [ or {{ deeper than {MAX_FLOW_DEPTH} levels")
        elif ch in "]}":
            depth = max(depth - 1, 0)


def parse_text(text: str, source: str = "config") -> dict:
    """Parse YAML (a superset of JSON) into a mapping, or raise InvalidArgument."""
    _check_depth(text, source)
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise InvalidArgument(source, f"not valid YAML/JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:  # an int of > 4300 digits, nesting too deep
        raise InvalidArgument(source, f"cannot be read: {type(exc).__name__}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidArgument(
            source, f"must be a mapping of keys to values, got {type(data).__name__}"
        )
    return data


def parse_overrides(overrides: Sequence[str]) -> dict:
    tree: dict = {}
    for item in overrides:
        if "=" not in item:
            raise InvalidArgument("override", f"{item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        _set_dotted(tree, key.strip(), value)
    return tree


def env_overrides(prefix: str, environ: Mapping[str, str] | None = None) -> dict:
    """``BRORL_LEARNER__LR=1e-4`` → ``{"learner": {"lr": 1e-4}}`` (double underscore nests)."""
    environ = os.environ if environ is None else environ
    items = [
        f"{k[len(prefix) :].lower().replace('__', '.')}={v}"
        for k, v in environ.items()
        if k.startswith(prefix) and len(k) > len(prefix)
    ]
    return parse_overrides(items)


def deep_merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def validate(cls: type[M], data: dict) -> M:
    """Build ``cls`` from ``data``; a validation error becomes InvalidArgument naming the field."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "config"
            msg = (
                "unknown key (check the spelling)"
                if err["type"] == "extra_forbidden"
                else err["msg"]
            )
            problems.append((field, msg))
        first_field = problems[0][0]
        detail = "; ".join(f"{f}: {m}" for f, m in problems)
        raise InvalidArgument(
            first_field, detail if len(problems) > 1 else problems[0][1]
        ) from None


def load_config(
    cls: type[M],
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    env_prefix: str | None = "BRORL_",
    environ: Mapping[str, str] | None = None,
) -> M:
    data: dict = {}
    if path:
        p = Path(path)
        if not p.is_file():
            raise InvalidArgument("config", f"file {p} does not exist")
        data = parse_text(p.read_text(), source=str(p))
    if env_prefix:
        data = deep_merge(data, _known_env(cls, env_overrides(env_prefix, environ)))
    data = deep_merge(data, parse_overrides(overrides))
    return validate(cls, data)


def _known_env(cls: type[BaseModel], env: dict) -> dict:
    """Keep only environment keys whose top level is a field of ``cls`` (BRORL_ is shared)."""
    return {k: v for k, v in env.items() if k in cls.model_fields}


def dump(model: BaseModel) -> str:
    return yaml.safe_dump(json.loads(model.model_dump_json()), sort_keys=False)
