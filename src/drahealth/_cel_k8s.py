"""The CEL environment of DRA device selectors, with the Kubernetes libraries.

Owns :func:`compile_selector` (parse and static checks, the errors the API server's
validation gives) and :class:`Selector` (evaluation against one device, raising
:class:`CELRuntimeError` for runtime errors such as a missing attribute). The engine
is cel-python; this module adds what Kubernetes adds to its base CEL environment for
device selectors (``k8s.io/apiserver/pkg/cel/environment``'s base set plus the DRA
compiler's ``device`` variable and ``cel.bind``):

* quantities: ``quantity()``, ``isQuantity()``, ``sign``, ``isInteger``,
  ``asInteger``, ``asApproximateFloat``, ``add``, ``sub``, ``compareTo``,
  ``isGreaterThan``, ``isLessThan``; device capacity values are quantities;
* semantic versions: ``semver()`` (with the normalising form), ``isSemver()``,
  ``major``, ``minor``, ``patch``, ``compareTo``, ``isGreaterThan``, ``isLessThan``;
  attributes of type version are semvers;
* lists: ``isSorted``, ``sum``, ``max``, ``min``, ``indexOf``, ``lastIndexOf``;
  sets: ``sets.contains``, ``sets.equivalent``, ``sets.intersects``;
* strings (extended library, version 2): ``charAt``, ``indexOf``, ``lastIndexOf``,
  ``lowerAscii``, ``upperAscii``, ``replace``, ``split``, ``substring``, ``trim``,
  ``join``, ``strings.quote``; regular expressions: ``find``, ``findAll``;
* URLs (``url()``, ``isURL()``, ``getScheme`` ...), IP addresses and CIDRs
  (``ip()``, ``cidr()``, ``family``, ``containsIP`` ...);
* ``cel.bind(name, value, expression)``.

Not modelled: optional types (``?.``, ``optional.of``), two-variable comprehensions,
the ``format`` and ``image`` libraries, and the static type checker (an expression is
rejected as non-boolean only when its outermost operation cannot yield a bool).

Cost, as upstream bounds DRA selectors (``resource.CELSelectorExpressionMaxLength``
10 Ki characters, ``resource.CELSelectorExpressionMaxCost`` 1,000,000): cel-python has
no cost tracking, so this module adds both halves itself.

* At compile, :func:`estimate_cost` walks the syntax tree for a worst-case cost from
  size bounds (literals, the ``device`` variable's limits: strings at most 64
  characters, at most 64 entries per map; ``split``/``replace``/``+`` results
  computed from their inputs; a comprehension costs its range's size times its
  body). Over the budget is :class:`CELCostError` (``too complex, exceeds cost
  limit``), as upstream's estimator refuses it at validation.
* At evaluation, a meter charges every operation (one unit, plus a tenth of the
  length of each string and the deep size of each list or map an operation creates)
  and, *before* an operator or function runs, what it will scan: its operands' sizes
  (deep, so lists of lists sharing one another are charged every leaf), the list's
  for ``in``, the product of both lists' lengths for the ``sets`` functions;
  ``replace`` and ``split`` are charged their result size before they build it, and
  long library calls look at the meter as they go. It stops the
  evaluation with ``operation cancelled: actual cost limit exceeded`` past the
  budget, or ``... timed out`` past the caller's deadline (cel-python is far slower
  per unit than cel-go, so callers bound wall time too).
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import celpy
import lark
import re2  # type: ignore[import-untyped]  # google-re2 ships no type information
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, Evaluator

__all__ = [
    "IP",
    "MAX_COST",
    "MAX_EXPRESSION_LENGTH",
    "CELCompileError",
    "CELCostError",
    "CELRuntimeError",
    "CELTimeout",
    "Quantity",
    "Selector",
    "Semver",
    "compile_selector",
    "device_value",
    "estimate_cost",
]

#: Upstream's limit on a selector expression (``CELSelectorExpressionMaxLength``).
MAX_EXPRESSION_LENGTH = 10 * 1024
#: Upstream's cost budget of one selector (``CELSelectorExpressionMaxCost``): the
#: static estimate at compile and the metered cost of each evaluation.
MAX_COST = 1_000_000


class CELCompileError(ValueError):
    """The expression does not compile; the text is what validation reports."""


class CELCostError(CELCompileError):
    """The expression's estimated worst-case cost exceeds :data:`MAX_COST`."""


class CELRuntimeError(RuntimeError):
    """Evaluating the expression failed for one device (e.g. ``no such key: model``)."""


class CELTimeout(CELRuntimeError):
    """The evaluation ran past the caller's deadline."""


# -- the runtime meter ----------------------------------------------------------------


class _Exceeded(Exception):
    """Raised inside the evaluator when the meter stops it."""


class _Meter:
    """Cost spent by one evaluation, its budget and its wall-clock deadline."""

    __slots__ = ("budget", "deadline", "spent", "stopped", "ticks", "weights")

    def __init__(self, budget: int, deadline: float | None) -> None:
        self.budget = budget
        self.deadline = deadline
        self.spent = 0
        self.ticks = 0
        self.stopped: CELRuntimeError | None = None
        #: id -> (value, deep weight) of the lists and maps weighed so far; the value is
        #: kept so that its id is not reused while this evaluation runs.
        self.weights: dict[int, tuple[Any, int]] = {}

    def charge(self, units: int) -> None:
        if self.stopped is not None:  # sticky: whatever swallowed it, stop again
            raise _Exceeded(str(self.stopped))
        self.spent += units
        if self.spent > self.budget:
            self.stopped = CELRuntimeError("operation cancelled: actual cost limit exceeded")
        elif (
            self.deadline is not None
            and (self.ticks % 64 == 0 or units >= 64)  # a big charge is a long operation
            and time.monotonic() > self.deadline
        ):
            self.stopped = CELTimeout("operation cancelled: evaluation timed out")
        self.ticks += 1
        if self.stopped is not None:
            raise _Exceeded(str(self.stopped))


_ACTIVE = threading.local()


def _charge(units: int) -> None:
    meter: _Meter | None = getattr(_ACTIVE, "meter", None)
    if meter is not None:
        meter.charge(units)


#: Operations that create a value (charged its size); lookups are charged one unit.
_CREATORS = frozenset({"list_lit", "map_lit", "member_dot_arg", "ident_arg", "dot_ident_arg",
                       "addition"})  # fmt: skip


def _size_cost(value: Any) -> int:
    """What holding or scanning ``value`` costs: a tenth of a string's length, and for
    a list or map its *deep* size (every item of every nested list or map, each time it
    occurs), so that lists of lists sharing one another cannot hide an exponential
    amount of work from the meter behind a few cheap literals."""
    if isinstance(value, (str, bytes)):
        return len(value) // 10
    if not isinstance(value, (list, dict)):
        return 0
    meter: _Meter | None = getattr(_ACTIVE, "meter", None)
    memo = meter.weights if meter is not None else {}
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:  # post-order without recursion: nesting depth is the caller's to choose
        node, children_done = stack.pop()
        if id(node) in memo:
            continue
        items = list(node.keys()) + list(node.values()) if isinstance(node, dict) else node
        if not children_done:
            stack.append((node, True))
            stack.extend((c, False) for c in items if isinstance(c, (list, dict)))
            continue
        total = len(node)
        for c in items:
            if isinstance(c, (list, dict)):
                total += memo[id(c)][1]
            elif isinstance(c, (str, bytes)):
                total += len(c) // 10
        memo[id(node)] = (node, min(total, _UNBOUNDED))
    return memo[id(value)][1]


#: Operators and functions whose work does not grow with their operands.
_CONSTANT_TIME = frozenset({"_[_]", "size", "_&&_", "_||_", "!_", "-_", "_?_:_", "has", "dyn",
                            "_*_", "_/_", "_%_", "_-_"})  # fmt: skip


def _input_cost(name: str, args: tuple[Any, ...]) -> int:
    """What a call must pay *before* it runs, from what it will scan: its operands'
    sizes, the container's for ``in`` (a map lookup is constant), and the product of
    both lists' lengths for the ``sets`` functions (each item of one is looked for in
    the other)."""
    if name in _CONSTANT_TIME:
        return 0
    if name == "_in_" and len(args) == 2:
        return 0 if isinstance(args[1], dict) else _size_cost(args[1])
    cost = sum(_size_cost(a) for a in args)
    if name.startswith("sets.") and len(args) == 2:
        sizes = [len(a) if isinstance(a, (list, dict)) else 1 for a in args]
        cost += sizes[0] * sizes[1]
    return cost


def _metered(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` charged :func:`_input_cost` before it runs: a single call (``in`` on a
    long list, ``sets.intersects`` of two) cannot outrun the budget or the deadline."""

    def call(*args: Any) -> Any:
        _charge(_input_cost(name, args))
        return fn(*args)

    return call


class _Fail(Exception):
    """A library function's error, turned into a CEL error value."""


# -- quantities ----------------------------------------------------------------------

_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eEinumkKMGTP]*[-+]?[0-9]*)$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
}  # fmt: skip


def parse_quantity(text: str) -> Fraction:
    """The exact value of a Kubernetes quantity (``4Gi``, ``500m``, ``1e3``)."""
    match = _QUANTITY.match(text.strip()) if len(text) <= 128 else None
    if not match:
        raise ValueError(
            f"quantities must match the regular expression '{_QUANTITY.pattern}': {text[:64]!r}"
        )
    number, suffix = match.groups()
    try:
        value = Fraction(Decimal(number))
    except InvalidOperation as exc:  # pragma: no cover - the pattern admits only numbers
        raise ValueError(f"invalid quantity {text!r}") from exc
    if suffix in _BINARY:
        return value * _BINARY[suffix]
    if suffix in _DECIMAL:
        return value * _DECIMAL[suffix]
    exp = re.fullmatch(r"[eE]([-+]?[0-9]{1,3})", suffix)
    if exp:
        return value * Fraction(10) ** int(exp[1])
    raise ValueError(f"unable to parse quantity's suffix: {text[:64]!r}")


class Quantity:
    """A ``resource.Quantity`` in CEL: compared by value, printed as given."""

    __slots__ = ("text", "value")

    def __init__(self, text: str, value: Fraction | None = None) -> None:
        self.text = text
        self.value = parse_quantity(text) if value is None else value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self.value)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Quantity({self.text!r})"


def _q(value: Fraction) -> Quantity:
    text = str(value.numerator) if value.denominator == 1 else str(float(value))
    return Quantity(text, value)


def _as_quantity(value: Any, fn: str) -> Quantity:
    if isinstance(value, Quantity):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return _q(Fraction(int(value)))
    raise _Fail(f"no such overload: {fn} on {type(value).__name__}")


# -- semantic versions --------------------------------------------------------------

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


class Semver:
    """A semantic version (2.0.0); equality and order ignore build metadata."""

    __slots__ = ("build", "major", "minor", "patch", "pre", "text")

    def __init__(self, text: str, normalize: bool = False) -> None:
        raw = _normalize(text) if normalize else text
        match = _SEMVER.match(raw) if len(raw) <= 256 else None
        if not match:
            raise ValueError(f"invalid semver: {text[:64]}")
        self.text = raw
        self.major, self.minor, self.patch = (int(match[i]) for i in (1, 2, 3))
        self.pre = tuple(match[4].split(".")) if match[4] else ()
        self.build = match[5] or ""

    def _key(self) -> tuple[Any, ...]:
        pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre)
        # A release sorts after its pre-releases.
        return (self.major, self.minor, self.patch, not self.pre, pre)

    def compare(self, other: Semver) -> int:
        a, b = self._key(), other._key()
        return (a > b) - (a < b)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.compare(other) == 0

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Semver({self.text!r})"


def _normalize(text: str) -> str:
    """Upstream's lenient form: a leading ``v``, missing minor/patch, leading zeros."""
    value = text.removeprefix("v")
    core, sep, rest = _split_core(value)
    parts = core.split(".")
    if len(parts) > 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"invalid semver: {text[:64]}")
    parts += ["0"] * (3 - len(parts))
    return ".".join(str(int(p)) for p in parts) + sep + rest


def _split_core(value: str) -> tuple[str, str, str]:
    match = re.search(r"[-+]", value)
    if not match:
        return value, "", ""
    return value[: match.start()], value[match.start()], value[match.start() + 1 :]


# -- IP addresses and CIDRs ---------------------------------------------------------


class IP:
    __slots__ = ("addr",)

    def __init__(self, addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
        self.addr = addr

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IP) and self.addr == other.addr

    def __hash__(self) -> int:
        return hash(self.addr)

    def __str__(self) -> str:
        return str(self.addr)


class CIDR:
    __slots__ = ("addr", "net")

    def __init__(self, text: str) -> None:
        iface = ipaddress.ip_interface(text)
        if "/" not in text:
            raise ValueError(f"network address parse error during conversion from string: {text}")
        self.addr = iface.ip
        self.net = iface.network

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CIDR) and (self.addr, self.net) == (other.addr, other.net)

    def __hash__(self) -> int:
        return hash((self.addr, self.net))

    def __str__(self) -> str:
        return f"{self.addr}/{self.net.prefixlen}"


def _parse_ip(text: str) -> IP:
    if "%" in text:
        raise ValueError(f"IP address with zone value is not allowed: {text}")
    try:
        addr = ipaddress.ip_address(text)
    except ValueError as exc:
        raise ValueError(f"IP Address {text!r} parse error during conversion from string") from exc
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        raise ValueError(f"IPv4-mapped IPv6 address is not allowed: {text}")
    return IP(addr)


class URL:
    __slots__ = ("parts",)

    def __init__(self, text: str) -> None:
        parts = urlsplit(text)
        if not parts.scheme and not text.startswith("/"):
            raise ValueError(f"URL {text!r} must be an absolute URI or an absolute path")
        self.parts = parts

    def __str__(self) -> str:
        return self.parts.geturl()


# -- the function table --------------------------------------------------------------

_S = celtypes.StringType
_I = celtypes.IntType
_B = celtypes.BoolType


def _cmp(fn: str, a: Any, b: Any) -> int:
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a.compare(b)
    if isinstance(a, Quantity):
        qb = _as_quantity(b, fn)
        return (a.value > qb.value) - (a.value < qb.value)
    raise _Fail(f"no such overload: {fn} on {type(a).__name__}, {type(b).__name__}")


def _index_of(fn: str, last: bool) -> Callable[..., Any]:
    def index(target: Any, needle: Any, start: Any = None) -> Any:
        if isinstance(target, str):
            if not isinstance(needle, str):
                raise _Fail(f"no such overload: {fn}")
            if last:
                end = len(target) if start is None else int(start) + len(needle)
                return _I(target.rfind(needle, 0, end))
            return _I(target.find(needle, 0 if start is None else int(start)))
        if isinstance(target, list):
            items = list(enumerate(target))
            for i, v in reversed(items) if last else items:
                if v == needle:
                    return _I(i)
            return _I(-1)
        raise _Fail(f"no such overload: {fn} on {type(target).__name__}")

    return index


def _sum(items: Any) -> Any:
    if not isinstance(items, list):
        raise _Fail("no such overload: sum")
    if not items:
        return _I(0)
    if all(isinstance(v, Quantity) for v in items):
        return _q(sum((v.value for v in items), Fraction(0)))
    total = items[0]
    for v in items[1:]:
        total = total + v
    return total


def _max(items: Any) -> Any:
    if not isinstance(items, list):
        raise _Fail("no such overload: max")
    if not items:
        raise _Fail("max called on empty list")
    return max(items, key=_order_key)


def _order_key(v: Any) -> Any:
    if isinstance(v, Quantity):
        return v.value
    if isinstance(v, Semver):
        return v._key()
    return v


def _is_sorted(items: Any) -> Any:
    keys = [_order_key(v) for v in items]
    return _B(all(a <= b for a, b in itertools.pairwise(keys)))


def _ip(value: Any) -> Any:
    if isinstance(value, CIDR):
        return IP(value.addr)
    return _parse_ip(str(value))


def _family(value: Any) -> Any:
    addr = value.addr
    return _I(4 if isinstance(addr, ipaddress.IPv4Address) else 6)


def _contains_ip(cidr: CIDR, value: Any) -> Any:
    ip = value if isinstance(value, IP) else _parse_ip(str(value))
    return _B(ip.addr in cidr.net)


def _contains_cidr(cidr: CIDR, value: Any) -> Any:
    other = value if isinstance(value, CIDR) else CIDR(str(value))
    return _B(
        other.net.version == cidr.net.version and other.net.subnet_of(cidr.net)  # type: ignore[arg-type]
    )


def _is(parse: Callable[[str], Any]) -> Callable[..., Any]:
    def check(text: Any, *args: Any) -> Any:
        try:
            parse(str(text), *args)
        except (ValueError, _Fail):
            return _B(False)
        return _B(True)

    return check


def _url_query(u: URL) -> Any:
    return celtypes.MapType(
        {_S(k): celtypes.ListType([_S(x) for x in v]) for k, v in parse_qs(u.parts.query).items()}
    )


def _split(text: str, sep: str, limit: Any = None) -> Any:
    n = -1 if limit is None else int(limit)
    if n == 0:
        return celtypes.ListType()
    count = len(text) if sep == "" else text.count(sep) + 1
    _charge(count if n < 0 else min(count, n))  # the items, before they are built
    parts = (list(text) if sep == "" else text.split(sep)) if n < 0 else text.split(sep, n - 1)
    out = []
    for i in range(0, len(parts), _CHUNK):  # the deadline is checked as they are built
        _charge(min(_CHUNK, len(parts) - i) // 64)
        out += [_S(p) for p in parts[i : i + _CHUNK]]
    return celtypes.ListType(out)


#: Items built between two looks at the meter in a long library call.
_CHUNK = 4096


def _substring(text: str, start: Any, end: Any = None) -> Any:
    s, e = int(start), len(text) if end is None else int(end)
    if not 0 <= s <= e <= len(text):
        raise _Fail(f"index out of range: {s}, {e}")
    return _S(text[s:e])


def _replace(text: str, old: str, new: str, limit: Any = None) -> Any:
    count = text.count(old) if old else len(text) + 1
    if limit is not None and int(limit) >= 0:
        count = min(count, int(limit))
    _charge((len(text) + count * max(len(new) - len(old), 0)) // 10)  # before it is built
    return _S(text.replace(old, new, -1 if limit is None else int(limit)))


def _char_at(text: str, index: Any) -> Any:
    i = int(index)
    if not 0 <= i <= len(text):
        raise _Fail(f"index out of range: {i}")
    return _S(text[i : i + 1])


def _join(items: Any, sep: str = "") -> Any:
    if not all(isinstance(v, str) for v in items):  # list(string) only, as upstream
        raise _Fail("no such overload: join on a list that is not list(string)")
    return _S(sep.join(items))


_RE2_OPTIONS: Any = re2.Options()
_RE2_OPTIONS.log_errors = False  # errors come back as exceptions, not on stderr


def _regexp(pattern: str) -> Any:
    """RE2, as CEL's regex library uses: linear time, so a selector's pattern cannot
    stall the scheduler with backtracking."""
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None


def _find(text: str, pattern: str) -> Any:
    match = _regexp(pattern).search(text)
    return _S(match.group(0) if match else "")


def _find_all(text: str, pattern: str, limit: Any = None) -> Any:
    most = int(limit) if limit is not None and int(limit) >= 0 else len(text) + 1
    found: list[str] = []
    for m in _regexp(pattern).finditer(text):
        if len(found) >= most:
            break
        _charge(1)  # each match as it is found, not after all of them are
        found.append(m.group(0))
    return celtypes.ListType([_S(f) for f in found])


def _quote(text: str) -> Any:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return _S(f'"{escaped}"')


def _sets_contains(a: Any, b: Any) -> Any:
    return _B(all(x in a for x in b))


def _asint(q: Quantity) -> Any:
    if q.value.denominator != 1 or not -(2**63) <= q.value.numerator < 2**63:
        raise _Fail("cannot convert value to integer")
    return _I(q.value.numerator)


def _method(fn: str, kind: type, impl: Callable[..., Any]) -> Callable[..., Any]:
    def call(target: Any, *args: Any) -> Any:
        if not isinstance(target, kind):
            raise _Fail(f"no such overload: {fn} on {type(target).__name__}")
        return impl(target, *args)

    return call


_LINK_LOCAL_MULTICAST = {
    4: ipaddress.ip_network("224.0.0.0/24"),
    6: ipaddress.ip_network("ff02::/16"),
}

_FUNCTIONS: dict[str, Callable[..., Any]] = {
    # quantity
    "quantity": lambda s: Quantity(str(s)),
    "isQuantity": _is(Quantity),
    "sign": _method("sign", Quantity, lambda q: _I((q.value > 0) - (q.value < 0))),
    "isInteger": _method("isInteger", Quantity, lambda q: _B(q.value.denominator == 1)),
    "asInteger": _method("asInteger", Quantity, _asint),
    "asApproximateFloat": _method(
        "asApproximateFloat", Quantity, lambda q: celtypes.DoubleType(float(q.value))
    ),
    "add": _method("add", Quantity, lambda q, o: _q(q.value + _as_quantity(o, "add").value)),
    "sub": _method("sub", Quantity, lambda q, o: _q(q.value - _as_quantity(o, "sub").value)),
    "compareTo": lambda a, b: _I(_cmp("compareTo", a, b)),
    "isGreaterThan": lambda a, b: _B(_cmp("isGreaterThan", a, b) > 0),
    "isLessThan": lambda a, b: _B(_cmp("isLessThan", a, b) < 0),
    # semver
    "semver": lambda s, normalize=False: Semver(str(s), bool(normalize)),
    "isSemver": _is(Semver),
    "major": _method("major", Semver, lambda v: _I(v.major)),
    "minor": _method("minor", Semver, lambda v: _I(v.minor)),
    "patch": _method("patch", Semver, lambda v: _I(v.patch)),
    # lists
    "isSorted": _method("isSorted", list, _is_sorted),
    "sum": _sum,
    "max": _max,
    "indexOf": _index_of("indexOf", last=False),
    "lastIndexOf": _index_of("lastIndexOf", last=True),
    # strings
    "charAt": _method("charAt", str, _char_at),
    "lowerAscii": _method("lowerAscii", str, lambda s: _S(s.lower())),
    "upperAscii": _method("upperAscii", str, lambda s: _S(s.upper())),
    "replace": _method("replace", str, _replace),
    "split": _method("split", str, _split),
    "substring": _method("substring", str, _substring),
    "trim": _method("trim", str, lambda s: _S(s.strip())),
    "join": _method("join", list, _join),
    "strings.quote": _quote,
    # regex
    "find": _method("find", str, _find),
    "findAll": _method("findAll", str, _find_all),
    # sets
    "sets.contains": _sets_contains,
    "sets.equivalent": lambda a, b: _B(_sets_contains(a, b) and _sets_contains(b, a)),
    "sets.intersects": lambda a, b: _B(any(x in a for x in b)),
    # URLs
    "url": lambda s: URL(str(s)),
    "isURL": _is(URL),
    "getScheme": _method("getScheme", URL, lambda u: _S(u.parts.scheme)),
    "getHost": _method("getHost", URL, lambda u: _S(u.parts.netloc.rpartition("@")[2])),
    "getHostname": _method("getHostname", URL, lambda u: _S(u.parts.hostname or "")),
    "getPort": _method(
        "getPort", URL, lambda u: _S(str(u.parts.port) if u.parts.port is not None else "")
    ),
    "getEscapedPath": _method("getEscapedPath", URL, lambda u: _S(u.parts.path)),
    "getQuery": _method("getQuery", URL, _url_query),
    # IP and CIDR
    "ip": _ip,
    "isIP": _is(_parse_ip),
    "ip.isCanonical": lambda s: _B(str(_parse_ip(str(s)).addr) == str(s)),
    "family": _family,
    "isUnspecified": _method("isUnspecified", IP, lambda i: _B(i.addr.is_unspecified)),
    "isLoopback": _method("isLoopback", IP, lambda i: _B(i.addr.is_loopback)),
    "isLinkLocalMulticast": _method(
        "isLinkLocalMulticast",
        IP,
        lambda i: _B(i.addr.is_multicast and i.addr in _LINK_LOCAL_MULTICAST[i.addr.version]),
    ),
    "isLinkLocalUnicast": _method(
        "isLinkLocalUnicast", IP, lambda i: _B(i.addr.is_link_local and not i.addr.is_multicast)
    ),
    "isGlobalUnicast": _method(
        "isGlobalUnicast",
        IP,
        lambda i: _B(
            not (
                i.addr.is_unspecified
                or i.addr.is_loopback
                or i.addr.is_multicast
                or i.addr.is_link_local
                or i.addr == ipaddress.IPv4Address("255.255.255.255")
            )
        ),
    ),
    "cidr": lambda s: CIDR(str(s)),
    "isCIDR": _is(CIDR),
    "containsIP": _method("containsIP", CIDR, _contains_ip),
    "containsCIDR": _method("containsCIDR", CIDR, _contains_cidr),
    "masked": _method("masked", CIDR, lambda c: CIDR(str(c.net))),
    "prefixLength": _method("prefixLength", CIDR, lambda c: _I(c.net.prefixlen)),
}


#: Namespaced functions: ``<namespace>.<name>(...)``.
_NAMESPACES = ("sets", "strings", "ip")


def _wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        for a in args:
            if isinstance(a, CELEvalError):
                return a
        _charge(_input_cost(name, args))
        try:
            return fn(*args)
        except (_Fail, ValueError, TypeError, re.error, ZeroDivisionError) as exc:
            return CELEvalError(f"{name}: {exc}", type(exc), exc.args)

    return call


_WRAPPED = {name: _wrap(name, fn) for name, fn in _FUNCTIONS.items()}
#: What a program resolves: celpy's operators and functions metered (types such as
#: ``string`` stay types, as ``type(x) == string`` compares them), then this module's.
_PROGRAM_FUNCTIONS = {
    **{
        name: _metered(name, fn)
        for name, fn in celpy.evaluation.base_functions.items()
        if not isinstance(fn, type)
    },
    **_WRAPPED,
}
#: Functions celpy itself provides (global or method form).
_BUILTIN = frozenset(celpy.evaluation.base_functions) | {
    "has", "map", "filter", "all", "exists", "exists_one", "size", "min", "dyn",
}  # fmt: skip
_KNOWN = frozenset(_FUNCTIONS) | _BUILTIN


def _ident_of(tree: Any) -> str | None:
    """The identifier a ``member`` subtree is, if it is a bare identifier."""
    while isinstance(tree, lark.Tree) and tree.data in ("member", "primary") and tree.children:
        if len(tree.children) != 1:
            return None
        tree = tree.children[0]
    if isinstance(tree, lark.Tree) and tree.data == "ident":
        return str(tree.children[0])
    return None


class _K8sEvaluator(Evaluator):
    """celpy's evaluator plus ``cel.bind`` and namespaced functions."""

    def member_dot_arg(self, tree: lark.Tree[Any]) -> Any:
        member_tree, method = tree.children[0], str(tree.children[1])
        namespace = _ident_of(member_tree)
        if namespace == "cel" and method == "bind":
            args = cast(lark.Tree[Any], tree.children[2]).children
            if len(args) != 3:
                return CELEvalError("cel.bind takes a name, a value and an expression")
            name = _ident_of(_expr_member(args[0]))
            if name is None:
                return CELEvalError("cel.bind: the first argument must be a simple name")
            value = self.visit(args[1])
            if isinstance(value, CELEvalError):
                return value
            return self.sub_evaluator(ast=cast(lark.Tree[Any], args[2])).evaluate({name: value})
        if namespace in _NAMESPACES and f"{namespace}.{method}" in _WRAPPED:
            if _resolves(self, namespace):
                return super().member_dot_arg(tree)
            args = (
                [self.visit(a) for a in cast(lark.Tree[Any], tree.children[2]).children]
                if len(tree.children) > 2 and tree.children[2] is not None
                else []
            )
            return _WRAPPED[f"{namespace}.{method}"](*args)
        return super().member_dot_arg(tree)

    def sub_evaluator(self, ast: lark.Tree[Any]) -> Evaluator:
        return _K8sEvaluator(ast, activation=self.activation)

    def _visit_tree(self, tree: lark.Tree[Any]) -> Any:
        result = super()._visit_tree(tree)
        children = tree.children
        if len(children) != 1 or not isinstance(children[0], lark.Tree):  # not a pass-through
            extra = _size_cost(result) if tree.data in _CREATORS else 0
            _charge(1 + extra)
        return result


def _resolves(ev: Evaluator, name: str) -> bool:
    try:
        ev.activation.resolve_variable(name)
    except (KeyError, NameError):
        return False
    return True


def _expr_member(expr: Any) -> Any:
    """The single ``member`` below an ``expr`` chain with no operators, else None."""
    node = expr
    while isinstance(node, lark.Tree) and node.data != "member":
        if len(node.children) != 1:
            return None
        node = node.children[0]
    return node


class _Runner(celpy.InterpretedRunner):
    def evaluate(self, context: Any) -> Any:
        ev = _K8sEvaluator(ast=self.ast, activation=self.new_activation())
        return ev.evaluate(context)


_ENV = celpy.Environment(runner_class=_Runner)

# -- static checks ------------------------------------------------------------------

_NOT_BOOL_LITERALS = ("STRING_LIT", "MLSTRING_LIT", "BYTES_LIT", "INT_LIT", "UINT_LIT", "FLOAT_LIT")


def _static_checks(ast: lark.Tree[Any]) -> None:
    """The errors a type checker would find that are cheap to find without one."""
    bound = {"device"}
    for node in ast.iter_subtrees():
        if node.data == "member_dot_arg":
            method = str(node.children[1])
            args = node.children[2] if len(node.children) > 2 else None
            if method in ("map", "filter", "all", "exists", "exists_one") or (
                method == "bind" and _ident_of(node.children[0]) == "cel"
            ):
                if isinstance(args, lark.Tree) and args.children:
                    var = _ident_of(_expr_member(args.children[0]))
                    if var:
                        bound.add(var)
                continue
            ns = _ident_of(node.children[0])
            if ns in _NAMESPACES and f"{ns}.{method}" in _FUNCTIONS:
                continue
            if method not in _KNOWN:
                raise CELCompileError(f"undeclared reference to '{method}' (in container '')")
        elif node.data == "ident_arg":
            name = str(node.children[0])
            if name not in _KNOWN:
                raise CELCompileError(f"undeclared reference to '{name}' (in container '')")
    for node in ast.iter_subtrees():
        if node.data == "ident":
            name = str(node.children[0])
            if name not in bound and name not in ("cel", *_NAMESPACES, "null_type"):
                raise CELCompileError(f"undeclared reference to '{name}' (in container '')")
    for node in ast.iter_subtrees():
        if node.data == "member_dot" and _ident_of(node.children[0]) == "device":
            name = str(node.children[1])
            if name not in _DEVICE_FIELDS:
                raise CELCompileError(f"undefined field '{name}'")
        elif node.data == "relation" and len(node.children) == 2:
            op = node.children[0]
            if isinstance(op, lark.Tree) and op.data in _RELATIONS and op.children:
                left, right = _simple_type(op.children[0]), _simple_type(node.children[1])
                if left and right and _FAMILY[left] != _FAMILY[right]:
                    raise CELCompileError(
                        f"found no matching overload for '{_RELATIONS[op.data]}' applied to "
                        f"'({left}, {right})'"
                    )
    kind = _outer_kind(ast)
    if kind is not None:
        raise CELCompileError(f"must evaluate to bool or the unknown type, not {kind}")


#: The fields of the ``device`` variable (upstream's DRA CEL environment).
_DEVICE_FIELDS = frozenset({"driver", "attributes", "capacity", "allowMultipleAllocations"})
_RELATIONS = {
    "relation_eq": "_==_", "relation_ne": "_!=_", "relation_lt": "_<_",
    "relation_le": "_<=_", "relation_gt": "_>_", "relation_ge": "_>=_",
}  # fmt: skip
#: Types whose values never compare with one another's (numbers compare across types).
_FAMILY = {"string": "string", "bool": "bool", "bytes": "bytes", "null_type": "null",
           "int": "number", "uint": "number", "double": "number"}  # fmt: skip
_LITERAL_TYPES = {"STRING_LIT": "string", "MLSTRING_LIT": "string", "BYTES_LIT": "bytes",
                  "INT_LIT": "int", "UINT_LIT": "uint", "FLOAT_LIT": "double",
                  "BOOL_LIT": "bool", "NULL": "null_type"}  # fmt: skip


def _simple_type(tree: Any) -> str | None:
    """The static type of a literal or of ``device.driver``, else None (not known here)."""
    node = tree
    while isinstance(node, lark.Tree):
        if node.data == "literal":
            token = node.children[0]
            return _LITERAL_TYPES.get(token.type) if isinstance(token, lark.Token) else None
        if node.data == "member_dot":
            if _ident_of(node.children[0]) == "device" and str(node.children[1]) == "driver":
                return "string"
            return None
        if len(node.children) != 1:
            return None
        node = node.children[0]
    return None


def _outer_kind(ast: lark.Tree[Any]) -> str | None:
    """The type of the outermost operation when it certainly is not bool, else None."""
    node: Any = ast
    while isinstance(node, lark.Tree):
        if node.data in ("addition", "multiplication") and len(node.children) > 1:
            return "int, double, string or list"
        if node.data in ("addition_add", "addition_sub", "multiplication_mul",
                         "multiplication_div", "multiplication_mod", "unary_neg"):  # fmt: skip
            return "int, double, string or list"
        if node.data == "list_lit":
            return "list"
        if node.data == "map_lit":
            return "map"
        if node.data == "member_dot":
            base = _ident_of(node.children[0])
            if base == "device" and str(node.children[1]) == "driver":
                return "string"
            return None
        if node.data == "member_dot_arg":
            method = str(node.children[1])
            if method in ("compareTo", "size", "indexOf", "lastIndexOf", "major", "minor",
                          "patch", "sign", "asInteger"):  # fmt: skip
                return "int"
            if method in ("lowerAscii", "upperAscii", "replace", "substring", "trim",
                          "join", "find", "charAt"):  # fmt: skip
                return "string"
            return None
        if node.data == "ident_arg":
            name = str(node.children[0])
            return {"quantity": "Quantity", "semver": "Semver", "url": "URL",
                    "cidr": "net.CIDR", "size": "int"}.get(name)  # fmt: skip
        if node.data == "literal":
            token = node.children[0]
            if isinstance(token, lark.Token) and token.type in _NOT_BOOL_LITERALS:
                return token.type.removesuffix("_LIT").lower().replace("mlstring", "string")
            if isinstance(token, lark.Token) and token.type == "NULL":
                return "null_type"
            return None
        if len(node.children) != 1:
            return None
        node = node.children[0]
    return None


class Selector:
    """One compiled selector expression and its estimated worst-case cost."""

    __slots__ = ("expression", "max_cost", "program")

    def __init__(self, expression: str, program: Any, max_cost: int = 0) -> None:
        self.expression = expression
        self.program = program
        self.max_cost = max_cost

    def matches(
        self,
        device: Mapping[str, Any],
        *,
        budget: int = MAX_COST,
        deadline: float | None = None,
    ) -> bool:
        """Whether the expression is true for ``device`` (see :func:`device_value`).

        The evaluation is metered: past ``budget`` cost units it fails with
        ``operation cancelled: actual cost limit exceeded``, past ``deadline`` (a
        ``time.monotonic()`` value) with :class:`CELTimeout`.
        """
        meter = _Meter(budget, deadline)
        outer = getattr(_ACTIVE, "meter", None)
        _ACTIVE.meter = meter
        try:
            result = self.program.evaluate({"device": device})
        except _Exceeded:
            result = None
        except CELEvalError as exc:
            if meter.stopped is None:
                raise CELRuntimeError(_message(exc)) from None
            result = None
        except (RecursionError, ValueError, TypeError, ArithmeticError, MemoryError) as exc:
            if meter.stopped is None:
                raise CELRuntimeError(str(exc) or type(exc).__name__) from None
            result = None
        finally:
            _ACTIVE.meter = outer
        if meter.stopped is not None:
            raise meter.stopped
        if isinstance(result, CELEvalError):
            raise CELRuntimeError(_message(result))
        if not isinstance(result, (bool, celtypes.BoolType)):
            raise CELRuntimeError(
                f"CEL result of type {type(result).__name__} could not be converted to bool"
            )
        return bool(result)


def _message(exc: CELEvalError) -> str:
    text, args = exc.args[0] if exc.args else str(exc), exc.args[2] if len(exc.args) > 2 else ()
    if text == "no such key" and args:
        return f"no such key: {args[0]}"
    member = re.fullmatch(r"no such member in mapping: '(.*)'", str(text))
    return f"no such key: {member[1]}" if member else str(text)


@functools.lru_cache(maxsize=512)
def compile_selector(expression: str) -> Selector:
    """The compiled selector, or :class:`CELCompileError` with upstream's wording."""
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CELCompileError(
            f"may not be longer than {MAX_EXPRESSION_LENGTH} bytes (got {len(expression)})"
        )
    try:
        ast = _ENV.compile(expression)
        _static_checks(ast)
        cost = estimate_cost(ast)
    except CELParseError as exc:
        raise CELCompileError(f"compilation failed: {exc}") from None
    except RecursionError:
        raise CELCompileError("compilation failed: the expression is nested too deeply") from None
    if cost > MAX_COST:
        raise CELCostError(
            f"too complex, exceeds cost limit (estimated cost {cost} exceeds limit {MAX_COST})"
        )
    return Selector(expression, _ENV.program(ast, functions=_PROGRAM_FUNCTIONS), cost)


class _Domains(celtypes.MapType):
    """``device.attributes``/``device.capacity``: an unknown domain is an empty map."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType()


def _cel(value: Any) -> Any:
    if isinstance(value, bool):
        return _B(value)
    if isinstance(value, int):
        return _I(value)
    if isinstance(value, str):
        return _S(value)
    return value


def device_value(
    driver: str,
    attributes: Mapping[str, Mapping[str, Any]],
    capacity: Mapping[str, Mapping[str, Any]],
    *,
    allow_multiple_allocations: bool | None = None,
) -> Any:
    """The ``device`` variable: attributes by domain (versions as :class:`Semver`),
    capacity by domain as :class:`Quantity`; ``allowMultipleAllocations`` where served."""
    value: dict[Any, Any] = {
        _S("driver"): _S(driver),
        _S("attributes"): _Domains(
            {
                _S(dom): celtypes.MapType({_S(k): _cel(v) for k, v in attrs.items()})
                for dom, attrs in attributes.items()
            }
        ),
        _S("capacity"): _Domains(
            {
                _S(dom): celtypes.MapType(
                    {
                        _S(k): v if isinstance(v, Quantity) else Quantity(str(v))
                        for k, v in caps.items()
                    }
                )
                for dom, caps in capacity.items()
            }
        ),
    }
    if allow_multiple_allocations is not None:
        value[_S("allowMultipleAllocations")] = _B(allow_multiple_allocations)
    return celtypes.MapType(value)


# -- the static cost estimate -----------------------------------------------------

_UNBOUNDED = 1 << 40


class _Size:
    """Upper bound of a value's length (characters, items or entries; 0 for scalars)
    and of its elements' (list items, map values)."""

    __slots__ = ("elem", "n")

    def __init__(self, n: int, elem: _Size | None = None) -> None:
        self.n = min(n, _UNBOUNDED)
        self.elem = elem

    def item(self) -> _Size:
        return self.elem if self.elem is not None else _UNKNOWN


_SCALAR = _Size(0)
_UNKNOWN = _Size(_UNBOUNDED)
_UNKNOWN.elem = _UNKNOWN
#: ``device``: driver, attributes and capacity by domain; names and strings are at most
#: 64 characters, a device has at most 32 attributes and capacities (64 is generous).
_DEVICE = _Size(64, _Size(64, _Size(64, _Size(64))))

_Env = dict[str, _Size]
_MACROS = frozenset({"map", "filter", "all", "exists", "exists_one"})
#: Functions whose work grows with their string or list argument.
_SCANNING = frozenset({
    "contains", "startsWith", "endsWith", "matches", "find", "findAll", "indexOf",
    "lastIndexOf", "lowerAscii", "upperAscii", "trim", "split", "join", "replace",
    "substring", "charAt", "quote", "isSorted", "sum", "max", "min", "size", "string",
    "equivalent", "intersects", "url", "ip", "cidr", "semver", "quantity",
    "isURL", "isIP", "isCIDR", "isSemver", "isQuantity", "bytes",
})  # fmt: skip


def _bigger(a: _Size | None, b: _Size | None) -> _Size | None:
    if a is None or b is None:
        return a or b
    return _Size(max(a.n, b.n), _bigger(a.elem, b.elem))


def _tenth(n: int) -> int:
    return math.ceil(n / 10)


def estimate_cost(ast: lark.Tree[Any]) -> int:
    """The worst-case cost of evaluating ``ast`` for any device (see the module doc)."""
    return _est(ast, {"device": _DEVICE})[0]


def _kids(node: lark.Tree[Any]) -> list[Any]:
    return [c for c in node.children if c is not None]


def _args(node: Any) -> list[Any]:
    return _kids(node) if isinstance(node, lark.Tree) and node.data == "exprlist" else []


def _est(node: Any, env: _Env) -> tuple[int, _Size]:
    if not isinstance(node, lark.Tree):
        return 0, _SCALAR
    data, ch = node.data, _kids(node)
    if data == "literal":
        token = ch[0] if ch else None
        if isinstance(token, lark.Token) and token.type in (
            "STRING_LIT", "MLSTRING_LIT", "BYTES_LIT",
        ):  # fmt: skip
            return 0, _Size(len(token))
        return 0, _SCALAR
    if data in ("ident", "dot_ident"):
        return 1, env.get(str(ch[-1]), _UNKNOWN) if ch else _UNKNOWN
    if data == "list_lit":
        items = [_est(i, env) for i in (_args(ch[0]) if ch else [])]
        elem: _Size | None = None
        for _, size in items:
            elem = _bigger(elem, size)
        return 10 + sum(c for c, _ in items), _Size(len(items), elem)
    if data == "map_lit":
        inits = _kids(ch[0]) if ch else []
        pairs = [_est(i, env) for i in inits]
        value: _Size | None = None
        for _, size in pairs[1::2]:
            value = _bigger(value, size)
        return 30 + sum(c for c, _ in pairs), _Size(len(inits) // 2, value)
    if data == "member_dot":
        cost, size = _est(ch[0], env)
        return cost + 1, size.item()
    if data == "member_index":
        cost, size = _est(ch[0], env)
        index, _ = _est(ch[1], env)
        return cost + index + 1, size.item()
    if data == "member_dot_arg":
        return _call(str(ch[1]), ch[0], _args(ch[2]) if len(ch) > 2 else [], env)
    if data in ("ident_arg", "dot_ident_arg"):
        return _call(str(ch[0]), None, _args(ch[1]) if len(ch) > 1 else [], env)
    if len(ch) == 1:
        return _est(ch[0], env)
    if data == "addition" and len(ch) == 2:
        (lc, ls), (rc, rs) = _est(_kids(ch[0])[0], env), _est(ch[1], env)
        if ch[0].data == "addition_add":
            size = _Size(ls.n + rs.n, _bigger(ls.elem, rs.elem))
            return lc + rc + 1 + _tenth(size.n) + (ls.n + rs.n if ls.elem or rs.elem else 0), size
        return lc + rc + 1, _SCALAR
    if data == "relation" and len(ch) == 2:
        (lc, ls), (rc, rs) = _est(_kids(ch[0])[0], env), _est(ch[1], env)
        scan = rs.n if ch[0].data == "relation_in" else _tenth(min(ls.n, rs.n))
        return lc + rc + 1 + scan, _SCALAR
    if data == "multiplication" and len(ch) == 2:
        (lc, _), (rc, _) = _est(_kids(ch[0])[0], env), _est(ch[1], env)
        return lc + rc + 1, _SCALAR
    if data == "expr" and len(ch) == 3:
        (cc, _), (tc, ts), (fc, fs) = (_est(c, env) for c in ch)
        return cc + max(tc, fc) + 1, _bigger(ts, fs) or _SCALAR
    total, size = 0, _SCALAR
    for c in ch:
        cost, size = _est(c, env)
        total += cost
    return total + 1, size if len(ch) == 1 else _SCALAR


def _call(name: str, target: Any, args: list[Any], env: _Env) -> tuple[int, _Size]:
    namespace = _ident_of(target) if target is not None else None
    if namespace == "cel" and name == "bind" and len(args) == 3:
        var = _ident_of(_expr_member(args[0])) or ""
        vc, vs = _est(args[1], env)
        bc, bs = _est(args[2], {**env, var: vs})
        return vc + bc + 1, bs
    if target is not None and namespace is None and name in _MACROS and len(args) in (2, 3):
        rc, rs = _est(target, env)
        var = _ident_of(_expr_member(args[0])) or ""
        inner = {**env, var: rs.item()}
        steps = [_est(a, inner) for a in args[1:]]
        per_item = sum(c for c, _ in steps) + 1
        cost = rc + rs.n * per_item
        if name == "map":
            return cost + rs.n, _Size(rs.n, steps[-1][1])
        if name == "filter":
            return cost + rs.n, _Size(rs.n, rs.elem)
        return cost, _SCALAR
    if name == "has":
        return (_est(args[0], env)[0] if args else 0) + 1, _SCALAR
    parts: list[tuple[int, _Size]] = []
    if target is not None and namespace not in _NAMESPACES:
        parts.append(_est(target, env))
    parts += [_est(a, env) for a in args]
    cost = sum(c for c, _ in parts) + 1
    first = parts[0][1] if parts else _SCALAR
    if name in _SCANNING:
        cost += sum(_tenth(s.n) if s.elem is None else s.n for _, s in parts)
    if namespace == "sets" and len(parts) == 2:  # each item of one looked for in the other
        cost += parts[0][1].n * parts[1][1].n
    if name in ("split", "findAll"):
        return cost + first.n + 1, _Size(first.n + 1, _Size(first.n))
    if name == "replace":
        new = parts[2][1].n if len(parts) > 2 else 0
        size = first.n + (first.n + 1) * new
        return cost + _tenth(size), _Size(size)
    if name == "join":
        sep = parts[1][1].n if len(parts) > 1 else 0
        size = first.n * (first.item().n + sep)
        return cost + _tenth(size), _Size(size)
    if name in ("lowerAscii", "upperAscii", "trim", "substring", "find", "charAt"):
        return cost, _Size(first.n)
    if name == "quote":
        return cost, _Size(first.n * 2 + 2)
    if name == "string":
        return cost, _Size(max(first.n, 64))
    return cost, _SCALAR
