"""Decoding of the few Kubernetes protobuf request bodies kubectl sends.

kubectl's typed clients (``kubectl create namespace``, ``create configmap``,
``drain``'s evictions) send ``application/vnd.kubernetes.protobuf`` bodies: the magic
``k8s\\x00`` followed by a ``runtime.Unknown`` envelope. This module turns those into
the JSON dicts the rest of the server uses, for Namespace, ConfigMap, Eviction (with
ObjectMeta and DeleteOptions) and SelfSubjectAccessReview (``kubectl auth can-i``).
Other kinds raise ``UnsupportedKind`` (the server answers 415); a malformed message
(truncated, invalid UTF-8 in a string, a timestamp outside 0001-9999) raises
``ProtobufError`` naming the field (400). Responses are always JSON: clients list
``application/json`` as an acceptable alternative. Field numbers follow k8s.io/api
``generated.proto``.
"""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

JSON = dict[str, Any]
MAGIC = b"k8s\x00"

# field number -> (json name, kind, sub-schema name or None, repeated)
Schema = dict[int, tuple[str, str, str | None, bool]]

_SCHEMAS: dict[str, Schema] = {
    "Unknown": {
        1: ("typeMeta", "msg", "TypeMeta", False),
        2: ("raw", "bytes", None, False),
        3: ("contentEncoding", "str", None, False),
        4: ("contentType", "str", None, False),
    },
    "TypeMeta": {1: ("apiVersion", "str", None, False), 2: ("kind", "str", None, False)},
    "ObjectMeta": {
        1: ("name", "str", None, False),
        2: ("generateName", "str", None, False),
        3: ("namespace", "str", None, False),
        4: ("selfLink", "str", None, False),
        5: ("uid", "str", None, False),
        6: ("resourceVersion", "str", None, False),
        7: ("generation", "int", None, False),
        8: ("creationTimestamp", "time", None, False),
        9: ("deletionTimestamp", "time", None, False),
        10: ("deletionGracePeriodSeconds", "int", None, False),
        11: ("labels", "map", None, False),
        12: ("annotations", "map", None, False),
        13: ("ownerReferences", "msg", "OwnerReference", True),
        14: ("finalizers", "str", None, True),
    },
    "OwnerReference": {
        1: ("kind", "str", None, False),
        3: ("name", "str", None, False),
        4: ("uid", "str", None, False),
        5: ("apiVersion", "str", None, False),
        6: ("controller", "bool", None, False),
        7: ("blockOwnerDeletion", "bool", None, False),
    },
    "Time": {1: ("seconds", "int", None, False), 2: ("nanos", "int", None, False)},
    "ConfigMap": {
        1: ("metadata", "msg", "ObjectMeta", False),
        2: ("data", "map", None, False),
        3: ("binaryData", "mapbytes", None, False),
        4: ("immutable", "bool", None, False),
    },
    "Namespace": {
        1: ("metadata", "msg", "ObjectMeta", False),
        2: ("spec", "msg", "NamespaceSpec", False),
        3: ("status", "msg", "NamespaceStatus", False),
    },
    "NamespaceSpec": {1: ("finalizers", "str", None, True)},
    "NamespaceStatus": {1: ("phase", "str", None, False)},
    "Eviction": {
        1: ("metadata", "msg", "ObjectMeta", False),
        2: ("deleteOptions", "msg", "DeleteOptions", False),
    },
    "DeleteOptions": {
        1: ("gracePeriodSeconds", "int", None, False),
        2: ("preconditions", "msg", "Preconditions", False),
        3: ("orphanDependents", "bool", None, False),
        4: ("propagationPolicy", "str", None, False),
        5: ("dryRun", "str", None, True),
    },
    "Preconditions": {1: ("uid", "str", None, False), 2: ("resourceVersion", "str", None, False)},
    "MapEntry": {1: ("key", "str", None, False), 2: ("value", "bytes", None, False)},
    # authorization/v1 (``kubectl auth can-i``); selector attributes are left out.
    "SelfSubjectAccessReview": {
        1: ("metadata", "msg", "ObjectMeta", False),
        2: ("spec", "msg", "SelfSubjectAccessReviewSpec", False),
    },
    "SelfSubjectAccessReviewSpec": {
        1: ("resourceAttributes", "msg", "ResourceAttributes", False),
        2: ("nonResourceAttributes", "msg", "NonResourceAttributes", False),
    },
    "ResourceAttributes": {
        1: ("namespace", "str", None, False),
        2: ("verb", "str", None, False),
        3: ("group", "str", None, False),
        4: ("version", "str", None, False),
        5: ("resource", "str", None, False),
        6: ("subresource", "str", None, False),
        7: ("name", "str", None, False),
    },
    "NonResourceAttributes": {1: ("path", "str", None, False), 2: ("verb", "str", None, False)},
}

_KINDS = {
    ("v1", "ConfigMap"),
    ("v1", "Namespace"),
    ("policy/v1", "Eviction"),
    ("policy/v1beta1", "Eviction"),
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"),
}


class ProtobufError(ValueError):
    """The body is not a well-formed protobuf message (the server answers 400)."""


class UnsupportedKind(ProtobufError):
    """A well-formed envelope for a kind this server cannot read as protobuf (415)."""


# metav1.Time range, as protobuf's Timestamp: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z
_MIN_SECONDS = -62135596800
_MAX_SECONDS = 253402300799


def _text(value: bytes, name: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtobufError(f"{name}: invalid UTF-8 in a string field (byte {e.start})") from e


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if pos >= len(buf):
            raise ProtobufError("truncated varint")
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, pos
        shift += 7
        if shift > 63:
            raise ProtobufError("varint too long")


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            out.append((number, value))
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise ProtobufError("truncated field")
            out.append((number, buf[pos : pos + length]))
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
    return out


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _time(raw: bytes, name: str) -> str:
    seconds = _signed(int(_message(raw, "Time").get("seconds", 0)))
    if not _MIN_SECONDS <= seconds <= _MAX_SECONDS:
        raise ProtobufError(
            f"{name}: timestamp {seconds} s is out of range (0001-01-01 to 9999-12-31)"
        )
    when = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=seconds)
    return f"{when.year:04d}-{when:%m-%dT%H:%M:%S}Z"


def _message(buf: bytes, schema_name: str) -> JSON:
    schema = _SCHEMAS[schema_name]
    out: JSON = {}
    for number, value in _fields(buf):
        if number not in schema:
            continue
        name, kind, sub, repeated = schema[number]
        decoded: Any
        if kind in ("map", "mapbytes"):
            if not isinstance(value, bytes):
                raise ProtobufError(f"{name}: expected a map entry")
            entry = _message(value, "MapEntry")
            raw = entry.get("value", b"")
            if not isinstance(raw, bytes):
                raise ProtobufError(f"{name}: expected length-delimited data")
            text = base64.b64encode(raw).decode() if kind == "mapbytes" else _text(raw, name)
            out.setdefault(name, {})[entry.get("key", "")] = text
            continue
        if kind in ("int", "bool"):
            if not isinstance(value, int):
                raise ProtobufError(f"{name}: expected a varint")
            decoded = bool(value) if kind == "bool" else _signed(value)
        else:
            if not isinstance(value, bytes):
                raise ProtobufError(f"{name}: expected length-delimited data")
            if kind == "str":
                decoded = _text(value, name)
                if not decoded and not repeated:
                    continue  # Go writes unset strings as empty: the same as absent
            elif kind == "bytes":
                decoded = value
            elif kind == "time":
                decoded = _time(value, name)
            else:
                assert sub is not None
                decoded = _message(value, sub)
        if repeated:
            out.setdefault(name, []).append(decoded)
        else:
            out[name] = decoded
    return out


def decode(body: bytes) -> JSON:
    """Decode a ``k8s\\x00``-prefixed protobuf body into a JSON-shaped dict."""
    if not body.startswith(MAGIC):
        raise ProtobufError("missing the k8s protobuf magic prefix")
    envelope = _message(body[len(MAGIC) :], "Unknown")
    meta = envelope.get("typeMeta") or {}
    api_version, kind = str(meta.get("apiVersion", "")), str(meta.get("kind", ""))
    if (api_version, kind) not in _KINDS:
        raise UnsupportedKind(
            "protobuf bodies are supported for ConfigMap, Namespace, Eviction and "
            "SelfSubjectAccessReview only, "
            f"not {api_version} {kind}; send application/json"
        )
    raw = envelope.get("raw", b"")
    if not isinstance(raw, bytes):  # pragma: no cover - schema guarantees bytes
        raise ProtobufError("bad raw payload")
    obj = _message(raw, kind)
    return {"apiVersion": api_version, "kind": kind, **obj}
