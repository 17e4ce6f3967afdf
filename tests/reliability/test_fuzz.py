"""Fuzz every decoder of untrusted input: a clear error or a clean result, never a crash.

Each target runs ``FUZZ_CASES`` (10,000) hypothesis examples of malformed input:
arbitrary bytes as protobuf messages (health stream, PodResources, registration), as the
agent's health log and claims checkpoint, as a policy file and as a vendor probe file.
The allowed outcomes per target are listed in its test; anything else fails. Runs in the
default suite (about a minute on two cores).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drahealth import api
from drahealth.core._health_cache import HealthCache
from drahealth.core._policy import PolicyError
from drahealth.node._claims import ClaimTracker
from drahealth.node._health_store import HealthStore
from drahealth.node._observer import PodDeviceMap
from drahealth.node._stream import _convert
from drahealth.node._types import RegistrationError
from drahealth.node._validation import validate_plugin_info
from drahealth.remedy._policy_load import parse_policy
from drahealth.sources import FileProbe

#: 10,000 cases per test take 10-30 s on 2 cores; a loaded machine needs more than the
#: suite's 60 s default
pytestmark = pytest.mark.timeout(240)

FUZZ_CASES = 10_000
fuzz = settings(
    max_examples=FUZZ_CASES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _encode(fields: list[tuple[int, int, Any]]) -> bytes:
    out = bytearray()
    for number, wire, value in fields:
        out += _varint(number << 3 | wire)
        out += _varint(value) if wire == 0 else _varint(len(value)) + value
    return bytes(out)


# bytes that are often valid protobuf: fields 1-5 with every wire type, nested
protobuf_bytes = st.recursive(
    st.binary(max_size=64),
    lambda inner: st.lists(
        st.one_of(
            st.tuples(st.integers(1, 6), st.just(0), st.integers(0, 2**64 - 1)),
            st.tuples(st.integers(1, 6), st.just(2), inner),
        ),
        max_size=8,
    ).map(_encode),
    max_leaves=20,
)


@pytest.mark.slow  # 30 s+ on 2 cores: CI runs it in its slow step
@fuzz
@given(protobuf_bytes)
def test_health_stream_messages(raw: bytes) -> None:
    cache = HealthCache(max_devices=1000)
    for module in (api.health_v1, api.health_v1alpha1):
        try:
            message = module.NodeWatchResourcesResponse.FromString(raw)
        except DecodeError:
            continue
        reports = _convert(message)  # enums out of range, odd strings: converted, never raised
        cache.update("fuzz.example.com", reports)  # bad entries are counted and skipped
        assert len(cache) <= 1000


@pytest.mark.slow  # 30 s+ on 2 cores: CI runs it in its slow step
@fuzz
@given(protobuf_bytes)
def test_podresources_answers(raw: bytes) -> None:
    try:
        message = api.podresources_v1.ListPodResourcesResponse.FromString(raw)
    except DecodeError:
        return
    devices = PodDeviceMap(max_tombstones=4)
    devices.replace(message)
    devices.replace(api.podresources_v1.ListPodResourcesResponse())
    assert len(devices.tombstones) <= 4


@pytest.mark.slow  # 30 s+ on 2 cores: CI runs it in its slow step
@fuzz
@given(
    protobuf_bytes, st.sampled_from(["/var/lib/kubelet/plugins_registry/x-reg.sock", "/tmp/r.sock"])
)
def test_registration_info(raw: bytes, socket: str) -> None:
    try:
        info = api.registration.PluginInfo.FromString(raw)
    except DecodeError:
        return
    try:
        validate_plugin_info(info, registration_socket=socket, allowed_roots=["/var/lib/kubelet"])
    except RegistrationError as exc:
        assert str(exc).startswith("RegisterPlugin error -- ")


_dir = tempfile.mkdtemp(prefix="dh-fuzz-")


@pytest.mark.slow  # 30 s+ on 2 cores: CI runs it in its slow step
@fuzz
@given(st.one_of(st.binary(max_size=400), st.text(max_size=400).map(str.encode)))
def test_health_log_files(raw: bytes) -> None:
    path = os.path.join(_dir, "health.log")
    with open(path, "wb") as f:
        f.write(
            b'{"format": "drahealth-health-log", "version": 1}\n' + raw if raw[:1] == b"x" else raw
        )
    store, entries, problem = HealthStore.open(path)
    store.close()
    assert problem is None or "moved it to" in problem
    assert all(e.device for e in entries)
    for name in os.listdir(_dir):
        os.unlink(os.path.join(_dir, name))


@pytest.mark.slow  # 30 s+ on 2 cores: CI runs it in its slow step
@fuzz
@given(st.one_of(st.binary(max_size=300), st.builds(lambda v: json.dumps(v).encode(), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=10,
))))  # fmt: skip
def test_claims_checkpoints(raw: bytes) -> None:
    with open(os.path.join(_dir, "claims.json"), "wb") as f:
        f.write(raw)
    tracker = ClaimTracker(_dir)
    problem = tracker.load()
    assert problem is None or isinstance(problem, str)
    for name in os.listdir(_dir):
        os.unlink(os.path.join(_dir, name))


_yaml_words = st.sampled_from([
    "apiVersion: drahealth.io/v1\n", "kind: RemediationPolicy\n", "rules:\n", "- name: r\n",
    "  match: {message: '(' }\n", "  action: {effect: NoExecute, gracePeriod: 5x}\n",
    "  hysteresis: {transitions: 1}\n", "dryRun: maybe\n", "eviction: {mode: evict}\n",
    "  recovery: {healthyFor: -1}\n", ": :\n", "- [\n", "\t", "&a *a\n", "rules: 5\n",
])  # fmt: skip


@pytest.mark.slow  # 15 s+ on 2 cores: CI runs it in its slow step
@fuzz
@given(st.one_of(st.text(max_size=200), st.lists(_yaml_words, max_size=10).map("".join)))
def test_policy_files(text: str) -> None:
    try:
        parse_policy(text, "fuzz.yaml")
    except PolicyError as exc:
        assert str(exc).startswith("fuzz.yaml: ")


_probe_entries = st.lists(
    st.dictionaries(
        st.sampled_from(["device", "pool", "health", "message", "time"]),
        st.none() | st.integers() | st.text(max_size=6) | st.sampled_from(["Healthy", "gpu-0"]),
    ),
    max_size=4,
)


@pytest.mark.slow  # 30 s+ on 2 cores: CI runs it in its slow step
@fuzz
@given(
    st.one_of(
        st.binary(max_size=300),
        st.builds(lambda v: json.dumps({"devices": v}).encode(), _probe_entries),
    )
)
def test_probe_files(raw: bytes) -> None:
    path = os.path.join(_dir, "probe.json")
    with open(path, "wb") as f:
        f.write(raw)
    reports = FileProbe(path, [("p", "gpu-0")], max_age=10**9).poll()
    assert [(r.pool, r.device) for r in reports] == [("p", "gpu-0")]
    os.unlink(path)
