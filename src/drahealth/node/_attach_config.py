"""The agent's attached-sources file (``drahealth agent --attach FILE``) and the source kinds.

Owns the file's schema (YAML, camelCase, checked field by field: every error is an
:class:`AttachConfigError` reading ``<file>: <field path>: <problem>``), the parsed
settings (:class:`AttachConfig`, :class:`DriverAttach`, :class:`SourceSettings`) and
:data:`SOURCE_KINDS`, the table ``kind -> builder`` that turns one source entry into an
:class:`~drahealth.sources.AttachedSource`. A source kind is added with one line::

    SOURCE_KINDS["smi"] = constructs("SmiSource")

A builder gets the entry's :class:`SourceSettings`; :func:`constructs` builds the named
class of :mod:`drahealth.sources` (imported on first use, so an agent without the
``nvml`` extra never loads NVML) with the entry's kind-specific fields as keyword
arguments (``xidIgnore`` becomes ``xid_ignore``), plus ``interval`` and ``timeout``
when the entry sets them and the class takes them.

The format (docs/agent.md, "Attached sources")::

    drivers:                         # or one driver's fields at the top level
      - driver: gpu.nvidia.com       # whose ResourceSlices (for this node) name the devices
        key: {attribute: pcieBusID}  # or "key: pcieBusID"; optional; matchAll: false
        sources:
          - kind: kmsg               # a key of SOURCE_KINDS
            name: kmsg               # default: the kind; unique within the driver
            interval: 1s             # default: the source's own; number (s) or 500ms/2s/1m/1h
            timeout: 30s             # its lease; at least the interval
            match: {attribute: ...}  # optional: the attribute this source's signals are
                                     # matched on, whatever they say (same form as key)
            unlisted: ignore         # or unknown: a device it does not list reads Unknown
            path: /dev/kmsg          # anything else goes to the source's builder

A mapping given for a field the class takes as a settings object (``thresholds``) is
built into that class first (:func:`constructs`' ``settings`` argument).
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import msgspec
import yaml

from drahealth._yaml import YAMLLimits, load_bounded
from drahealth.core import UNLISTED_CHOICES, KeySpec, driver_name_problem
from drahealth.kube import read_bounded
from drahealth.sources import AttachedSource

__all__ = [
    "MAX_DRIVERS",
    "MAX_SOURCES",
    "SOURCE_KINDS",
    "AttachConfig",
    "AttachConfigError",
    "Builder",
    "DriverAttach",
    "SourceSettings",
    "build_source",
    "constructs",
    "load_attach_config",
    "parse_attach_config",
]

#: Drivers one file may watch, and sources one driver may have.
MAX_DRIVERS: Final = 16
MAX_SOURCES: Final = 16
#: Longest file read.
MAX_FILE_BYTES: Final = 1024 * 1024
#: Bounds on the YAML (an attach file is a few drivers of a few flat sources).
ATTACH_YAML: Final = YAMLLimits(
    max_chars=MAX_FILE_BYTES, max_depth=32, max_aliases=100, max_nodes=100_000
)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_ATTRIBUTE = re.compile(r"^[^\s]{1,320}$")
_COMMON = ("kind", "name", "interval", "timeout", "match", "unlisted")
_API_VERSION = "drahealth.io/v1"
_KIND = "AttachedSources"


class AttachConfigError(ValueError):
    """A bad attached-sources file; the text names the file and the field."""


@dataclass(frozen=True, slots=True)
class SourceSettings:
    """One ``sources[]`` entry: the fields every kind has, and the kind's own."""

    kind: str
    name: str
    #: seconds; None: the source's own
    interval: float | None = None
    timeout: float | None = None
    #: the attribute its signals are matched on (overrides the driver's key and the
    #: signals' own ``by``)
    match: KeySpec | None = None
    unlisted: Literal["ignore", "unknown"] = "ignore"
    #: the kind's own fields, names in snake_case
    options: Mapping[str, Any] = field(default_factory=dict)
    #: where it is in the file (``drivers[0].sources[1]``), for errors
    where: str = ""


@dataclass(frozen=True, slots=True)
class DriverAttach:
    """One watched driver and its sources."""

    driver: str
    sources: tuple[SourceSettings, ...]
    key: KeySpec | None = None
    where: str = ""


@dataclass(frozen=True, slots=True)
class AttachConfig:
    """The whole file."""

    drivers: tuple[DriverAttach, ...]
    #: the file it came from (named in errors)
    source: str = "<attach>"


#: Turns one entry into a source; raises ValueError or TypeError naming the problem.
Builder = Callable[[SourceSettings], AttachedSource]


def constructs(class_name: str, **settings_types: str) -> Builder:
    """A builder of ``drahealth.sources.<class_name>`` (imported when first built).

    The entry's own fields are its keyword arguments; ``name``, ``interval`` and
    ``timeout`` are passed too when the entry sets them and the class takes them.
    ``settings_types`` maps an argument to the ``drahealth.sources`` class a mapping
    given for it is built into (``thresholds="DcgmThresholds"``).
    """

    def build(settings: SourceSettings) -> AttachedSource:
        import drahealth.sources as sources

        cls = getattr(sources, class_name, None)
        if cls is None:
            raise ValueError(f"this drahealth has no {class_name} (source kind {settings.kind})")
        kwargs = dict(settings.options)
        for argument, type_name in settings_types.items():
            value = kwargs.get(argument)
            if isinstance(value, Mapping):
                kind = getattr(sources, type_name)
                try:
                    kwargs[argument] = kind(**{_snake(str(k)): v for k, v in value.items()})
                except TypeError as exc:
                    raise ValueError(f"{argument}: {exc}") from exc
        params: Mapping[str, inspect.Parameter]
        try:
            params = inspect.signature(cls).parameters
        except (TypeError, ValueError):
            params = {}
        open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        for name in ("name", "interval", "timeout"):
            value = getattr(settings, name)
            if value is not None and name not in kwargs and (name in params or open_ended):
                kwargs[name] = value
        source: AttachedSource = cls(**kwargs)
        return source

    build.__qualname__ = f"constructs({class_name!r})"
    return build


#: Source kinds: ``kind`` -> builder. Add a kind with one line (see the module docstring).
SOURCE_KINDS: dict[str, Builder] = {
    "kmsg": constructs("KmsgSource"),
    "dcgm": constructs("DcgmExporterSource", thresholds="DcgmThresholds"),
    "nvml": constructs("NvmlAttachedSource", thresholds="NvmlThresholds"),
    "pci": constructs("PciAttachedSource", aer="AerThresholds"),
    "exec": constructs("ExecAttachedProbe"),
    "file": constructs("FileAttachedProbe"),
}


# --------------------------------------------------------------------------- schema


class _Base(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    pass


class _Key(_Base):
    attribute: str
    match_all: bool = False


class _Common(_Base):
    kind: str
    name: str | None = None
    interval: float | int | str | None = None
    timeout: float | int | str | None = None
    match: str | _Key | None = None
    unlisted: str = "ignore"


class _Driver(_Base):
    driver: str
    sources: list[dict[str, Any]]
    key: str | _Key | None = None


class _File(_Base):
    drivers: list[dict[str, Any]]
    api_version: str | None = None
    kind: str | None = None


def _error(source: str, where: str, problem: str) -> AttachConfigError:
    return AttachConfigError(f"{source}: {where or '(top level)'}: {problem}")


def _convert(raw: object, kind: type[Any], source: str, where: str) -> Any:
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        problem, _, path = str(exc).rpartition(" - at `")
        if not problem:
            raise _error(source, where, str(exc)) from exc
        inner = path.rstrip("`").removeprefix("$")
        inner = inner.removeprefix(".") if not where else inner
        raise _error(source, f"{where}{inner}", problem) from exc


def _seconds(value: float | int | str | None, source: str, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m is None:
            raise _error(source, where, f"{value!r} is not a duration (500ms, 2s, 1m, 1h, 1.5)")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0 or seconds > 24 * 3600:
        raise _error(source, where, f"must be more than 0 and at most 24h, got {value!r}")
    return seconds


def _key(raw: str | _Key | None, source: str, where: str) -> KeySpec | None:
    if raw is None:
        return None
    attribute, match_all = (raw, False) if isinstance(raw, str) else (raw.attribute, raw.match_all)
    at = where if isinstance(raw, str) else f"{where}.attribute"
    if not _ATTRIBUTE.match(attribute):
        raise _error(
            source,
            at,
            f"{attribute!r} is not an attribute name (uuid, pcieBusID, "
            "resource.kubernetes.io/pciBusID, index, name)",
        )
    return KeySpec(attribute, match_all)


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def _source(raw: object, source: str, where: str) -> SourceSettings:
    if not isinstance(raw, dict):
        raise _error(source, where, f"expected a mapping, got {type(raw).__name__}")
    bad = [k for k in raw if not isinstance(k, str)]
    if bad:
        raise _error(source, where, f"field names must be strings, got {bad[0]!r}")
    common = _convert({k: v for k, v in raw.items() if k in _COMMON}, _Common, source, where)
    if common.kind not in SOURCE_KINDS:
        raise _error(
            source,
            f"{where}.kind",
            f"unknown source kind {common.kind!r}; expected one of "
            f"{', '.join(sorted(SOURCE_KINDS))}",
        )
    name = common.name if common.name is not None else common.kind
    if not _NAME.match(name):
        raise _error(
            source,
            f"{where}.name",
            f"{name!r} is not a name (lowercase letters, digits and '-', at most 63)",
        )
    if common.unlisted not in UNLISTED_CHOICES:
        raise _error(
            source,
            f"{where}.unlisted",
            f"{common.unlisted!r}: expected one of {', '.join(UNLISTED_CHOICES)}",
        )
    interval = _seconds(common.interval, source, f"{where}.interval")
    timeout = _seconds(common.timeout, source, f"{where}.timeout")
    if interval is not None and timeout is not None and timeout < interval:
        raise _error(
            source,
            f"{where}.timeout",
            f"{timeout:g} s is shorter than the interval ({interval:g} s): every device would "
            "read Unknown between two polls",
        )
    options = {_snake(k): v for k, v in raw.items() if k not in _COMMON}
    return SourceSettings(
        kind=common.kind,
        name=name,
        interval=interval,
        timeout=timeout,
        match=_key(common.match, source, f"{where}.match"),
        unlisted=common.unlisted,
        options=options,
        where=where,
    )


def _driver(raw: object, source: str, where: str) -> DriverAttach:
    spec = _convert(raw, _Driver, source, where)
    at = f"{where}." if where else ""
    problem = driver_name_problem(spec.driver)
    if problem:
        raise _error(source, f"{at}driver", problem)
    if not spec.sources:
        raise _error(source, f"{at}sources", "at least one source is needed")
    if len(spec.sources) > MAX_SOURCES:
        raise _error(source, f"{at}sources", f"{len(spec.sources)} sources, at most {MAX_SOURCES}")
    sources = [_source(s, source, f"{at}sources[{i}]") for i, s in enumerate(spec.sources)]
    seen: dict[str, int] = {}
    for i, settings in enumerate(sources):
        if settings.name in seen:
            raise _error(
                source,
                f"{at}sources[{i}].name",
                f"{settings.name!r} is also sources[{seen[settings.name]}]'s name; "
                "give one of them a name",
            )
        seen[settings.name] = i
    return DriverAttach(spec.driver, tuple(sources), _key(spec.key, source, f"{at}key"), where)


def parse_attach_config(text: str, source: str = "<attach>") -> AttachConfig:
    """Validate the YAML ``text``; errors name ``source`` and the field."""
    try:
        raw = load_bounded(text, ATTACH_YAML)  # safe, duplicate keys refused, bounded
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise _error(source, where, f"not valid YAML: {problem}") from exc
    if not isinstance(raw, dict):
        got = "nothing" if raw is None else type(raw).__name__
        raise _error(source, "", f"expected a mapping with drivers (or a driver), got {got}")
    if "drivers" not in raw:
        return AttachConfig((_driver(raw, source, ""),), source)
    spec = _convert(raw, _File, source, "")
    if spec.api_version not in (None, _API_VERSION):
        raise _error(source, "apiVersion", f"{spec.api_version!r}: expected {_API_VERSION}")
    if spec.kind not in (None, _KIND):
        raise _error(source, "kind", f"{spec.kind!r}: expected {_KIND}")
    if not spec.drivers:
        raise _error(source, "drivers", "at least one driver is needed")
    if len(spec.drivers) > MAX_DRIVERS:
        raise _error(source, "drivers", f"{len(spec.drivers)} drivers, at most {MAX_DRIVERS}")
    drivers = [_driver(d, source, f"drivers[{i}]") for i, d in enumerate(spec.drivers)]
    seen: dict[str, int] = {}
    for i, d in enumerate(drivers):
        if d.driver in seen:
            raise _error(
                source,
                f"drivers[{i}].driver",
                f"{d.driver} is also drivers[{seen[d.driver]}]; put its sources in one entry",
            )
        seen[d.driver] = i
    return AttachConfig(tuple(drivers), source)


def load_attach_config(path: str) -> AttachConfig:
    """Read and validate the file at ``path``."""
    try:
        data = read_bounded(Path(path), MAX_FILE_BYTES, "attach file")
    except OSError as exc:
        raise AttachConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # not a regular file, or too big: the text names the file
        raise AttachConfigError(str(exc)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AttachConfigError(f"{path}: not UTF-8 text: {exc}") from exc
    return parse_attach_config(text, path)


def build_source(
    settings: SourceSettings, source: str = "<attach>"
) -> tuple[AttachedSource, float, float]:
    """Build the entry's source; returns it with its interval and timeout (the entry's,
    else the source's own). Errors name the file and the entry."""
    builder = SOURCE_KINDS.get(settings.kind)
    if builder is None:
        raise _error(source, f"{settings.where}.kind", f"unknown source kind {settings.kind!r}")
    try:
        built = builder(settings)
    except (ValueError, TypeError, ImportError, OSError) as exc:
        raise _error(
            source, settings.where, f"cannot build the {settings.kind} source: {exc}"
        ) from exc
    if not callable(getattr(built, "poll", None)):
        raise _error(source, settings.where, f"the {settings.kind} builder made no source")
    interval = (
        settings.interval if settings.interval is not None else getattr(built, "interval", None)
    )
    timeout = settings.timeout if settings.timeout is not None else getattr(built, "timeout", None)
    for what, value in (("interval", interval), ("timeout", timeout)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise _error(
                source,
                f"{settings.where}.{what}",
                f"the {settings.kind} source has no {what} of its own; set one",
            )
    assert interval is not None and timeout is not None
    if timeout < interval:
        raise _error(
            source,
            f"{settings.where}.timeout",
            f"{timeout:g} s is shorter than the interval ({interval:g} s)",
        )
    return built, float(interval), float(timeout)
