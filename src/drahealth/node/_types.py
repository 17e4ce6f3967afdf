"""Registration-side types shared by the plugin watcher and the plugin registry.

Owns :class:`PluginInfo` (what a plugin's ``GetInfo`` said, after validation),
:class:`RegistrationError` (a refusal whose text goes back to the plugin in
``NotifyRegistrationStatus``) and the :class:`RegistrationHandler` protocol the
watcher calls. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["PluginInfo", "RegistrationError", "RegistrationHandler"]


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """One registered plugin instance."""

    #: DRA driver name (``PluginInfo.name``).
    driver: str
    #: Absolute path of the DRA service socket (the registration socket when the
    #: plugin sent an empty endpoint).
    endpoint: str
    #: ``supported_versions`` in the plugin's order.
    versions: tuple[str, ...]
    #: Path of the registration socket the watcher found.
    registration_socket: str


class RegistrationError(Exception):
    """A registration was refused; ``str(exc)`` is sent to the plugin verbatim."""


class RegistrationHandler(Protocol):
    """What the watcher calls for a validated ``DRAPlugin`` registration."""

    async def register(self, info: PluginInfo) -> None:
        """Accept ``info`` or raise :class:`RegistrationError`."""

    async def deregister(self, info: PluginInfo) -> None:
        """Forget ``info`` (its socket was removed, recreated or stopped answering)."""
