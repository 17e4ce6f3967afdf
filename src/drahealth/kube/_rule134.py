"""The 1.34 alpha DeviceTaintRule's spec (``resource.k8s.io/v1alpha3``), as on the wire.

In 1.34 the rule's device selector also has ``deviceClassName`` and CEL ``selectors``
(removed in 1.35). The models lightkube ships describe the 1.35+ shape, so
:class:`DeviceTaintRuleSpec134` describes the 1.34 one: the API server decode-validates
a 1.34 rule with it, and clients read one with it. Models only; no I/O.
"""

from __future__ import annotations

import msgspec
from lightkube.models import resource_v1, resource_v1alpha3

__all__ = ["DeviceTaintRuleSpec134", "DeviceTaintSelector134"]


class DeviceTaintSelector134(msgspec.Struct, omit_defaults=True):
    device: str | None = None
    deviceClassName: str | None = None
    driver: str | None = None
    pool: str | None = None
    selectors: list[resource_v1.DeviceSelector] | None = None


class DeviceTaintRuleSpec134(msgspec.Struct, omit_defaults=True):
    taint: resource_v1alpha3.DeviceTaint
    deviceSelector: DeviceTaintSelector134 | None = None
