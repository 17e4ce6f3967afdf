"""Sans-I/O domain logic: device ids, health values and the rules built on them.

Nothing in this package performs I/O or reads a clock on its own; time is always
passed in. It imports no other drahealth package and no I/O library (no grpc,
asyncio, aiohttp, lightkube or httpx).
"""

from drahealth.core._checks import positive_seconds
from drahealth.core._health import HEALTH_MESSAGE_MAX_BYTES, DeviceKey, Health, truncate_message
from drahealth.core._health_cache import HealthCache
from drahealth.core._policy import (
    DEFAULT_TAINT_KEY,
    EFFECT_ORDER,
    Action,
    AttributeValue,
    DeviceFacts,
    Eviction,
    Hysteresis,
    Match,
    MessagePattern,
    PatternError,
    Policy,
    PolicyError,
    Recovery,
    Rule,
    Step,
    Validate,
    match_text,
)
from drahealth.core._records import (
    ChangeReason,
    ClaimInfo,
    DeviceEntry,
    HealthChange,
    PreparedDeviceInfo,
    ReportedDevice,
)
from drahealth.core._remedy_engine import RemedyEngine, Want
from drahealth.core._status import (
    CLAIM_PREFIX,
    ClaimLookup,
    HealthLookup,
    StatusBuilder,
    StatusInputError,
    StatusOptions,
    entry_name,
    resolve_claim_name,
)
from drahealth.core._taints import (
    NOW,
    Taint,
    eviction_due,
    request_tolerations,
    selects,
    tolerated,
)

__all__ = [
    "CLAIM_PREFIX",
    "DEFAULT_TAINT_KEY",
    "EFFECT_ORDER",
    "HEALTH_MESSAGE_MAX_BYTES",
    "NOW",
    "Action",
    "AttributeValue",
    "ChangeReason",
    "ClaimInfo",
    "ClaimLookup",
    "DeviceEntry",
    "DeviceFacts",
    "DeviceKey",
    "Eviction",
    "Health",
    "HealthCache",
    "HealthChange",
    "HealthLookup",
    "Hysteresis",
    "Match",
    "MessagePattern",
    "PatternError",
    "Policy",
    "PolicyError",
    "PreparedDeviceInfo",
    "Recovery",
    "RemedyEngine",
    "ReportedDevice",
    "Rule",
    "StatusBuilder",
    "StatusInputError",
    "StatusOptions",
    "Step",
    "Taint",
    "Validate",
    "Want",
    "entry_name",
    "eviction_due",
    "match_text",
    "positive_seconds",
    "request_tolerations",
    "resolve_claim_name",
    "selects",
    "tolerated",
    "truncate_message",
]
