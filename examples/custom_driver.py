"""A complete custom DRA driver with device health, in one file.

Four FPGA cards; a card is faulty while the file ``<base>/faults/<card>`` exists.
Prepare hands the allocated cards to the container (the toolkit writes CDI specs and
the checkpoint); a health source probes the fault files once a second and feeds the
HealthHub, which serves dra-health v1/v1alpha1 to the kubelet.

    python examples/custom_driver.py --base /tmp/fpga       # no API access
    touch /tmp/fpga/faults/fpga-2                            # fault: Unhealthy (latched)
    rm /tmp/fpga/faults/fpga-2                               # probe Healthy clears it
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Mapping, Sequence

from drahealth.core import Health
from drahealth.driver import (
    ClaimError,
    ClaimRef,
    DeviceReport,
    ErrorKind,
    HealthHub,
    PluginOptions,
    PreparedClaimRequest,
    PreparedDevice,
    PrepareResult,
    install_signal_handlers,
    start,
)
from drahealth.kube import make_client

DRIVER = "fpga.example.com"
CARDS = [f"fpga-{i}" for i in range(4)]


class FpgaDriver:
    """Prepare/unprepare: the Driver protocol. Both must answer every claim by UID."""

    def __init__(self, hub: HealthHub) -> None:
        self.hub = hub

    async def prepare(self, claims: Sequence[PreparedClaimRequest]) -> Mapping[str, PrepareResult]:
        out = {}
        for claim in claims:
            try:
                out[claim.uid] = PrepareResult.ok(
                    [self._prepare(r.pool, r.device, r.request) for r in claim.results]
                )
            except ClaimError as err:
                out[claim.uid] = PrepareResult(error=err)
        return out

    def _prepare(self, pool: str, card: str, request: str) -> PreparedDevice:
        try:
            health = self.hub.state(pool, card).health
        except ValueError:  # not one of our cards
            raise ClaimError(f"unknown device {pool}/{card}", ErrorKind.PERMANENT_CONFIG) from None
        if health is Health.UNHEALTHY:
            # a permanent device error: the plugin calls on_device_fault (taint it)
            raise ClaimError(f"{card} is faulty", ErrorKind.PERMANENT_DEVICE, device=(pool, card))
        return PreparedDevice(requests=[request], pool=pool, device=card)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Exception | None]:
        return {c.uid: None for c in claims}  # nothing to undo; unknown claims succeed


def probe(pool: str, faults: str) -> list[DeviceReport]:
    """Blocking hardware probe (here: fault files), so it runs in a worker thread."""
    return [
        DeviceReport(pool, card, Health.UNHEALTHY, f"fault file {faults}/{card}")
        if os.path.exists(f"{faults}/{card}")
        else DeviceReport(pool, card, Health.HEALTHY)
        for card in CARDS
    ]


async def probe_forever(hub: HealthHub, pool: str, faults: str) -> None:
    """A health source: one full report per probe; the hub only wakes streams on change."""
    while True:
        hub.submit("probe", await asyncio.to_thread(probe, pool, faults))
        await asyncio.sleep(1.0)


async def main(base: str, node: str, kubeconfig: str | None) -> None:
    os.makedirs(f"{base}/faults", exist_ok=True)
    hub = HealthHub([(node, card) for card in CARDS], default_timeout_seconds=10)
    options = PluginOptions(
        DRIVER,
        node_name=node,
        registry_dir=f"{base}/registry",
        plugins_dir=f"{base}/plugins",
        cdi_dir=f"{base}/cdi",
        kube_client=make_client(kubeconfig) if kubeconfig else None,
        on_device_fault=lambda pool, dev, msg: print(f"permanent fault {pool}/{dev}: {msg}"),
    )
    handle = await start(FpgaDriver(hub), options, health=hub)
    install_signal_handlers(asyncio.get_running_loop(), handle)
    probe = asyncio.create_task(probe_forever(hub, node, f"{base}/faults"))
    print(f"ready: {handle.registrar_socket} (DRA socket {handle.endpoint})", flush=True)
    try:
        await handle.wait()  # until SIGTERM/SIGINT
    finally:
        probe.cancel()
        hub.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="/tmp/fpga-driver", help="directory for all sockets")
    parser.add_argument("--node", default=os.environ.get("NODE_NAME", "node-1"))
    parser.add_argument("--kubeconfig", default=None, help="API access (claims are fetched)")
    args = parser.parse_args()
    asyncio.run(main(args.base, args.node, args.kubeconfig))
