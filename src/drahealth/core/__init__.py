"""Sans-I/O domain logic: device ids, health values and the rules built on them.

Nothing in this package performs I/O or reads a clock on its own; time is always
passed in. It imports no other drahealth package and no I/O library (no grpc,
asyncio, aiohttp, lightkube or httpx).
"""

from drahealth.core._health import HEALTH_MESSAGE_MAX_BYTES, DeviceKey, Health, truncate_message

__all__ = ["HEALTH_MESSAGE_MAX_BYTES", "DeviceKey", "Health", "truncate_message"]
