"""Sans-I/O domain logic: device ids, health values and the rules built on them.

Nothing in this package performs I/O or reads a clock on its own; time is always
passed in. It imports only ``drahealth.api`` constants.
"""

from drahealth.core._health import DeviceKey, Health, truncate_message

__all__ = ["DeviceKey", "Health", "truncate_message"]
