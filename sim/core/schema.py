"""Declarative input schemas: what every input model shares, and errors that name their path.

Input models derive from `Strict`: unknown keys are refused (with a "did you mean" when a known
key is close), types are strict (no bool where a number goes, no "3" for 3, no 1.5 for an
integer), and numbers are finite unless a field says otherwise. `check` runs a model over raw
data and turns every problem of the file into one line:
`config.yaml: costs.roofline.flops_efficiency: must be <= 1, got 5; nodes: ...`.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from sim.core.errors import ConfigError, MoesimError

M = TypeVar("M", bound=BaseModel)
MAX_PROBLEMS = 12  # problems listed in one error line; the rest are counted

# Finite numbers with ranges, as used across the input models.
PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]  # (0, 1]


class Strict(BaseModel):
    # defer_build: a model's validator is built when it is first used, not when its module is
    # imported: a run validates two of the ~30 input models (its config and its topology), each
    # built with the models inside it, and building every model at import was a tenth of a
    # small `moesim simulate`
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        frozen=True,
        populate_by_name=True,
        defer_build=True,
    )


def check(
    model: type[M] | TypeAdapter[Any],
    raw: Any,
    source: str,
    prefix: str = "",
    error: type[MoesimError] = ConfigError,
    locate: Callable[[Sequence[Any]], tuple[str, list[str]]] | None = None,
    known: Callable[[list[str]], list[str]] | None = None,
) -> Any:
    """`raw` validated against `model` (a pydantic model or a TypeAdapter); every error of it
    (up to MAX_PROBLEMS, then a count) in one `error` line. `locate` may name the start of a
    location (`tasks.3` -> `task 'x'`): it returns the name and the rest of the path; `known`
    lists the keys allowed at a path, for the "did you mean" of an unknown key."""
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_python(raw)
        return model.model_validate(raw)
    except ValidationError as e:
        if known is None and isinstance(model, type):
            known = lambda loc: _known_keys(model, loc)  # noqa: E731
        # a union's members each report a mismatch at the same path: one problem per path
        by_path: dict[str, list[tuple[str, str]]] = {}
        for err in e.errors(include_url=False):
            path, text, got = _describe(err, prefix, locate, known)
            by_path.setdefault(path, []).append((text, got))
        problems = [_merge(path, found) for path, found in by_path.items()]
        shown = problems[:MAX_PROBLEMS]
        if len(problems) > MAX_PROBLEMS:
            shown.append(f"... and {len(problems) - MAX_PROBLEMS} more")
        raise error(f"{source}: " + "; ".join(shown)) from None


def _merge(path: str, found: list[tuple[str, str]]) -> str:
    texts = list(dict.fromkeys(t for t, _ in found))
    got = found[0][1]
    if len(texts) > 1 and all(t.startswith("expected ") for t in texts):
        texts = ["expected " + " or ".join(t.removeprefix("expected ") for t in texts)]
    return f"{path}: {'; '.join(texts)}" + (f", got {got}" if got else "")


def _describe(
    err: ErrorDetails,
    prefix: str,
    locate: Callable[[Sequence[Any]], tuple[str, list[str]]] | None,
    known_keys: Callable[[list[str]], list[str]] | None,
) -> tuple[str, str, str]:
    """(path, what is wrong, the value shown after "got" or "")."""
    raw_loc = [x for x in err["loc"] if not str(x).startswith("function-")]
    # union members and tagged choices add their own names to the location; keep the path
    raw_loc = [x for x in raw_loc if not _is_union_tag(str(x))]
    loc = [str(x) for x in raw_loc]
    head = [prefix] if prefix else []
    rest = loc
    if locate is not None:
        name, rest = locate(raw_loc)
        if name:  # `task 'x': shape.m`
            head = [f"{name}: {'.'.join(rest)}" if rest else name]
            rest = []
    path = ".".join(head + rest) or "(top level)"
    kind, value = err["type"], err.get("input")
    if kind == "extra_forbidden":
        import difflib  # here, not at the top: only a refused key needs it (start-up)

        known = known_keys(loc[:-1]) if known_keys else []
        close = difflib.get_close_matches(loc[-1], known, n=1) if loc else []
        close = close or [k for k in known if loc and k.startswith(loc[-1])][:1]
        hint = (
            f" (did you mean {close[0]!r}?)"
            if close
            else f" (known: {', '.join(sorted(known))})"
            if known
            else ""
        )
        return path, f"unknown key{hint}", ""
    if kind == "missing":
        return path, "required", ""
    if kind in ("value_error", "assertion_error"):  # a validator's sentence says it all
        return path, _message(err), ""
    # the input's spelling: a YAML/JSON null, not Python's None
    return path, _message(err), "null" if value is None else short(value)


_PRIMITIVES = frozenset({"int", "float", "str", "bool", "list", "dict", "none", "nullable"})


def _is_union_tag(part: str) -> bool:
    """Whether a location part is a union member's tag that pydantic adds ('AlphaBeta',
    'list[CollectiveFit]', 'str') rather than a key of the input (a link class 'NVLink')."""
    return "[" in part or part in _PRIMITIVES or part in _model_names()


def _model_names() -> set[str]:
    names: set[str] = set()
    todo: list[type[BaseModel]] = [BaseModel]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__name__ not in names:
                names.add(sub.__name__)
                todo.append(sub)
    return names


def _message(err: ErrorDetails) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
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


_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlevel = 40, 40, 3


def short(value: Any) -> str:
    """A value as the error shows it: bounded, so that a huge input (an expanded alias, a
    10^6-element list) costs nothing to describe."""
    text = _REPR.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _known_keys(model: type[BaseModel], loc: list[str]) -> list[str]:
    """Field names (and aliases) of the model at `loc`, following nested models."""
    current: Any = model
    for part in loc:
        fields = getattr(current, "model_fields", None)
        if not fields:
            return []
        field = fields.get(part) or next((f for f in fields.values() if f.alias == part), None)
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


def json_schema(model: type[BaseModel] | TypeAdapter[Any], title: str) -> dict[str, Any]:
    """JSON Schema of an input model, for editors (`moesim schema ...`)."""
    schema = (
        model.json_schema(by_alias=True)
        if isinstance(model, TypeAdapter)
        else model.model_json_schema(by_alias=True)
    )
    schema["title"] = title
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema
