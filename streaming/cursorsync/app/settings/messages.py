"""Validation problems as one line each: the full key path, what is wrong, what is valid,
and the line in the YAML file."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel

from cursorsync.errors import ConfigError, show_name

#: A key path inside the config: section and field names, list indexes.
Loc = tuple[str | int, ...]


class ConfigValidationError(ConfigError):
    """Every problem in a config, one line each; ``problems`` holds the lines."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = tuple(problems)
        count = len(self.problems)
        header = f"invalid configuration {source}: {count} problem{'s' if count != 1 else ''}"
        super().__init__("\n".join([header, *(f"  {p}" for p in self.problems)]))


def format_loc(loc: Sequence[str | int]) -> str:
    """``topics[0].subscriptions`` for a key path; a key that would not show (empty, blank,
    control characters) is quoted."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{show_name(part)}" if out else show_name(part)
    return out or "(top level)"


#: How a field's values are named in "X is not a valid <noun>" messages.
_NOUNS = {
    "strategies": "evidence strategy",
    "identity_fields": "identity field",
    "subscription_type": "subscription type",
    "rewind_policy": "rewind policy",
    "backend": "table backend",
    "level": "log level",
}


def _unwrap(annotation: Any) -> Any:
    """Strip Annotated[...] and Optional[...] down to the interesting type."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            rest = [a for a in get_args(annotation) if a is not type(None)]
            if len(rest) != 1:
                return annotation
            annotation = rest[0]
        else:
            return annotation


def _field_for(model: type[BaseModel], key: str) -> tuple[str, Any] | None:
    for name, field in model.model_fields.items():
        if (field.alias or name) == key:
            return name, field.annotation
    return None


def _walk(root: type[BaseModel], loc: Sequence[str | int],
          ) -> tuple[type[BaseModel] | None, Any, bool]:
    """(model holding the last key, annotation at loc, whether every key was known)."""
    model: type[BaseModel] | None = root
    parent: type[BaseModel] | None = None
    annotation: Any = root
    for part in loc:
        annotation = _unwrap(annotation)
        if isinstance(part, int):
            args = get_args(annotation)
            annotation = args[0] if get_origin(annotation) is list and args else None
        else:
            model = annotation if isinstance(annotation, type) and issubclass(
                annotation, BaseModel) else None
            if model is None:
                return parent, None, get_origin(annotation) is dict
            parent = model
            found = _field_for(model, part)
            if found is None:
                return parent, None, False
            annotation = found[1]
    return parent, _unwrap(annotation), True


def _valid_keys(model: type[BaseModel]) -> str:
    return ", ".join(sorted((f.alias or n) for n, f in model.model_fields.items()))


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _yaml_word(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


def describe(err: Mapping[str, Any], root: type[BaseModel], prefix: Loc = ()) -> str:
    """One line for one pydantic error of ``root``'s validation: the key path, then what is
    wrong and what is valid."""
    loc = (*prefix, *err["loc"])
    path = format_loc(loc)
    kind = err["type"]
    given = err.get("input")
    parent, annotation, _ = _walk(root, loc)
    if kind == "extra_forbidden":
        valid = f". Valid keys are: {_valid_keys(parent)}" if parent is not None else ""
        return f"{path}: unknown key{valid}"
    if kind == "missing":
        return f"{path}: required key is missing"
    if kind == "invalid_key":
        key = "null" if loc[-1] is None else _yaml_word(loc[-1])
        return f"{format_loc(loc[:-1])}: key {key} is not a string; keys are names"
    if kind == "literal_error" and get_origin(annotation) is Literal:
        key = next((p for p in reversed(loc) if isinstance(p, str)), "value")
        noun = _NOUNS.get(key, key.replace("_", " "))
        valid = ", ".join(_yaml_word(a) for a in get_args(annotation))
        return f"{path}: {_show(given)} is not a valid {noun}. Valid values are: {valid}"
    if kind == "cursorsync":
        return f"{path}: {err['msg']}"
    if kind == "too_short" and isinstance(given, list | dict | str):
        return f"{path}: must not be empty"
    if kind in ("model_type", "model_attributes_type"):
        return f"{path}: expected a mapping of keys, got {_show(given)}"
    msg = str(err["msg"])
    msg = msg.removeprefix("Value error, ")
    msg = msg[:1].lower() + msg[1:]
    msg = msg.replace("input should be", "should be")
    return f"{path}: {msg}, got {_show(given)}"


def with_lines(problems: Sequence[tuple[str, Loc]], lines: LineFinder | None) -> list[str]:
    """Each problem with `` (line N)`` of its key in the YAML text, when known."""
    if lines is None:
        return [text for text, _ in problems]
    out = []
    for text, loc in problems:
        line = lines.line_of(loc)
        out.append(f"{text} (line {line})" if line else text)
    return out


class LineFinder:
    """Maps a key path back to its line in the YAML text (only computed on error)."""

    def __init__(self, text: str) -> None:
        self._text = text

    def line_of(self, loc: Loc) -> int | None:
        try:
            node = yaml.compose(self._text, Loader=yaml.SafeLoader)
        except yaml.YAMLError:
            return None
        line = node.start_mark.line + 1 if node is not None else None
        for part in loc:
            if isinstance(node, yaml.MappingNode) and isinstance(part, str):
                match = next(((k, v) for k, v in node.value if k.value == part), None)
                if match is None:
                    return line
                line = match[0].start_mark.line + 1
                node = match[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                if part >= len(node.value):
                    return line
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                return line
        return line
