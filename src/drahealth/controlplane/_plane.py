"""The embedded API server with the stand-in controllers, started and stopped as one.

Owns :class:`ControlPlane` (an :class:`APIServer`, a client of its own and, unless turned
off, the :class:`~drahealth.standins.StandIns`: the parts of a cluster that a driver
needs besides its node) and :func:`serve_forever`, which runs one until SIGINT/SIGTERM for
``drahealth apiserver [--with-controllers]``. ``drahealth demo`` starts its control plane
through :class:`ControlPlane` too, so the command and the demo run the same controllers.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drahealth._aio import on_stop_signals
from drahealth.core import KubeProfile
from drahealth.kube import make_client

from ._server import APIServer

if TYPE_CHECKING:
    from lightkube import AsyncClient

    from drahealth.standins import StandIns

__all__ = ["ControlPlane", "serve_forever"]

_ANY_ADDRESS = ("0.0.0.0", "::", "")


class ControlPlane:
    """``server`` (not yet started) and, with ``controllers``, the stand-ins on it.

    ``start()`` starts the server, then the stand-ins on :attr:`client` (a client of the
    plane's own, for the caller's use too); ``stop()`` stops the stand-ins, closes the
    client and stops the server. The stand-ins follow the server's release profile.
    """

    def __init__(self, server: APIServer, *, controllers: bool = True) -> None:
        self.server = server
        self.controllers = controllers
        self.client: AsyncClient | None = None
        #: the running stand-ins (None before ``start()`` or without ``controllers``)
        self.standins: StandIns | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        await self.server.start(host=host, port=port)
        try:
            url = self.server.url
            if host in _ANY_ADDRESS:  # the stand-ins reach it on loopback
                url = f"http://127.0.0.1:{self.server.port}"
            self.client = make_client(server_url=url)
            if self.controllers:
                from drahealth.standins import StandIns  # imported on use

                self.standins = StandIns(self.client, self.server.profile)
                await self.standins.start()
        except BaseException:
            await self.stop()
            raise

    def running(self) -> list[str]:
        """What runs besides the server, one phrase per controller."""
        return self.standins.describe() if self.standins is not None else []

    async def stop(self) -> None:
        if self.standins is not None:
            await self.standins.stop()
            self.standins = None
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()
            self.client = None
        await self.server.stop()


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def serve_forever(
    port: int = 0,
    kubeconfig_out: Path | None = None,
    data: Path | None = None,
    host: str = "127.0.0.1",
    allowed_hosts: tuple[str, ...] = (),
    profile: KubeProfile | None = None,
    with_controllers: bool = False,
) -> None:
    """Run an API server until SIGINT/SIGTERM; prints ``listening on URL`` once ready.

    ``profile``: the release to serve (None: the newest with its default gates).
    ``with_controllers``: also run the stand-in controllers, and say on stderr which run
    and where the kubeconfig is (without ``kubeconfig_out``, one is written to a
    temporary directory that is removed at exit).
    """
    plane = ControlPlane(
        APIServer(data_file=data, allowed_hosts=allowed_hosts, profile=profile),
        controllers=with_controllers,
    )
    scratch: Any = None
    if with_controllers and kubeconfig_out is None:
        scratch = tempfile.TemporaryDirectory(prefix="drahealth-apiserver-")
        kubeconfig_out = Path(scratch.name) / "kubeconfig"
    stop = asyncio.Event()
    try:
        with on_stop_signals(stop.set):
            await plane.start(host=host, port=port)
            try:
                if kubeconfig_out is not None:
                    plane.server.write_kubeconfig(kubeconfig_out)
                if with_controllers:
                    _say("controllers: " + "; ".join(plane.running()))
                    _say(f"kubeconfig: {kubeconfig_out}")
                    _say(f"  (try: kubectl --kubeconfig {kubeconfig_out} get nodes)")
                print(f"listening on {plane.server.url}", flush=True)
                await stop.wait()
            finally:
                await plane.stop()
    finally:
        if scratch is not None:
            scratch.cleanup()
