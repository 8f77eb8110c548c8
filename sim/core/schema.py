"""Declarative input schemas: what every input model shares, and errors that name their path.

Input models derive from `Strict`: unknown keys are refused (with a "did you mean" when a known
key is close), types are strict (no bool where a number goes, no "3" for 3, no 1.5 for an
integer), and numbers are finite unless a field says otherwise. `check` runs a model over raw
data and turns every problem of the file into one line:
`config.yaml: costs.roofline.flops_efficiency: must be <= 1, got 5; nodes: ...`.
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim.core.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

# Finite numbers with ranges, as used across the input models.
PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]  # (0, 1]


class Strict(BaseModel):
    model_config = ConfigDict(
        extra="forbid", strict=True, allow_inf_nan=False, frozen=True, populate_by_name=True
    )


def check(model: type[M], raw: Any, source: str, prefix: str = "") -> M:
    """`raw` validated against `model`; every error of it in one ConfigError line."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        problems = [_describe(err, model, prefix) for err in e.errors(include_url=False)]
        raise ConfigError(f"{source}: " + "; ".join(problems)) from None


def _describe(err: dict[str, Any], model: type[BaseModel], prefix: str) -> str:
    loc = [str(x) for x in err["loc"] if not str(x).startswith("function-")]
    # union members and tagged choices add their own names to the location; keep the path
    loc = [x for x in loc if not _is_union_tag(x)]
    path = ".".join(([prefix] if prefix else []) + loc) or "(top level)"
    kind, value = err["type"], err.get("input")
    if kind == "extra_forbidden":
        known = _known_keys(model, loc[:-1])
        close = difflib.get_close_matches(loc[-1], known, n=1) if loc else []
        close = close or [k for k in known if loc and k.startswith(loc[-1])][:1]
        hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {sorted(known)})"
        return f"{path}: unknown key{hint}"
    if kind == "missing":
        return f"{path}: required"
    return f"{path}: {_message(err)}, got {_short(value)}"


def _is_union_tag(part: str) -> bool:
    return part[:1].isupper() or part in ("int", "float", "str", "bool", "list", "dict", "none")


def _message(err: dict[str, Any]) -> str:
    msg = str(err["msg"])
    ctx = err.get("ctx") or {}
    if err["type"] in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<"}.get(
            err["type"], "<="
        )
        bound = next(iter(ctx.values()), "")
        return f"must be {op} {bound:g}" if isinstance(bound, float) else f"must be {op} {bound}"
    if err["type"] == "finite_number":
        return "must be a finite number"
    if err["type"] in ("model_type", "dict_type", "model_attributes_type"):
        return "expected a mapping"
    if msg.startswith("Input should be "):
        msg = "expected " + msg[len("Input should be ") :]
    return msg[0].lower() + msg[1:] if msg else "invalid"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _known_keys(model: type[BaseModel], loc: list[str]) -> list[str]:
    """Field names (and aliases) of the model at `loc`, following nested models."""
    current: Any = model
    for part in loc:
        fields = getattr(current, "model_fields", None)
        if not fields:
            return []
        field = fields.get(part) or next(
            (f for f in fields.values() if f.alias == part), None
        )
        if field is None:
            return []
        current = _model_in(field.annotation)
    fields = getattr(current, "model_fields", None) or {}
    return [f.alias or name for name, f in fields.items()]


def _model_in(annotation: Any) -> Any:
    """The BaseModel inside an annotation such as `Model | None` or `dict[str, Model]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def json_schema(model: type[BaseModel], title: str) -> dict[str, Any]:
    """JSON Schema of an input model, for editors (`moesim schema ...`)."""
    schema = model.model_json_schema()
    schema["title"] = title
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema
