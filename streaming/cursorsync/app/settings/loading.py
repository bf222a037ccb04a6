"""Reading a config: YAML (duplicate keys refused), ``${VAR}`` expansion, validation."""

from __future__ import annotations

import os
import re
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from cursorsync.app.settings.config import Config
from cursorsync.app.settings.messages import (
    ConfigValidationError,
    LineFinder,
    Loc,
    describe,
    format_loc,
    with_lines,
)
from cursorsync.errors import ConfigError


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read, expand ``${VARS}`` in, and validate one YAML config file."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"config file not found: {str(file)!r} (conf/embedded.yaml and "
            "conf/production.example.yaml in the source tree are examples)"
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {str(file)!r} is not UTF-8 text: byte {exc.start} is "
            f"{exc.object[exc.start]:#04x}"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"config path {str(file)!r} is a directory, not a YAML file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(file)!r}: {exc.strerror}") from None
    return load_config_text(text, source=str(file))


def load_config_text(text: str, *, source: str = "<string>") -> Config:
    """Validate YAML text; ``source`` names it in errors."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        what = "; ".join(p for p in (exc.context, exc.problem) if p)
        raise ConfigError(f"{where}: bad YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: bad YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source}: bad YAML: collections nested too deeply") from None
    if data is None:
        raise ConfigError(f"{source}: the file is empty; expected the sections {_SECTION_LIST}")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping of sections ({_SECTION_LIST}), "
            f"found a {type(data).__name__}"
        )
    return parse_config(data, source=source, lines=LineFinder(text))


def parse_config(
    data: Mapping[str, Any], *, source: str = "<dict>", lines: LineFinder | None = None
) -> Config:
    """Validate already-parsed data (after ``${VAR}`` expansion)."""
    env_problems: list[tuple[str, Loc]] = []
    expanded = _expand_env(data, (), env_problems)
    if env_problems:
        raise ConfigValidationError(source, with_lines(env_problems, lines))
    try:
        return Config.model_validate(expanded)
    except ValidationError as exc:
        problems = [(describe(err, Config), tuple(err["loc"])) for err in exc.errors()]
        raise ConfigValidationError(source, with_lines(problems, lines)) from None


_SECTION_LIST = ", ".join(
    (field.alias or name) for name, field in Config.model_fields.items()
)


_ENV_RE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand_env(value: Any, loc: Loc, problems: list[tuple[str, Loc]]) -> Any:
    if isinstance(value, str):
        return _expand_string(value, loc, problems)
    if isinstance(value, Mapping):
        return {k: _expand_env(v, (*loc, k if isinstance(k, str) else str(k)), problems)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, (*loc, i), problems) for i, v in enumerate(value)]
    return value


def _expand_string(text: str, loc: Loc, problems: list[tuple[str, Loc]]) -> str:
    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(2)
        found = os.environ.get(name)
        if found:
            return found
        if default is not None:
            return default
        # Set but empty is refused as unset is: an empty token or URL is never what a
        # deployment meant, and would fail later, far from the variable that caused it.
        state = "is not set" if found is None else "is set but empty"
        problems.append((
            f"{format_loc(loc)}: environment variable {name} {state} "
            f"(write ${{{name}:-default}} to give a default)",
            loc,
        ))
        return ""

    return _ENV_RE.sub(substitute, text)


class _StrictLoader(yaml.SafeLoader):  # type: ignore[misc]
    """SafeLoader that rejects a key given twice in one mapping (YAML would keep the last)."""


def _construct_unique_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark,
                f"found unhashable key (a {type(key).__name__}); keys are names",
                key_node.start_mark,
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(
                f"while reading a mapping (first {key!r} on line {seen[key]})",
                node.start_mark,
                f"key {key!r} is given twice",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line + 1
    loader.flatten_mapping(node)
    mapping: dict[Any, Any] = loader.construct_mapping(node, deep=True)
    return mapping


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping
)
