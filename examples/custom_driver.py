"""A complete custom DRA driver with device health, ResourceSlices and taints, in one file.

Four FPGA cards; a card is faulty while the file ``<base>/faults/<card>`` exists. One
call, ``start()``, serves the kubelet's sockets and runs the rest from its options:
prepare (the toolkit fetches claims, writes CDI specs and the checkpoint, and refuses a
card latched Unhealthy), dra-health v1/v1alpha1 streams from the HealthHub, the
ResourceSlice of the four cards (with ``--kubeconfig``), a ``fpga.example.com/unhealthy``
NoSchedule taint on a latched-faulty card, the control socket ``drahealth inject``
talks to, ``/metrics`` (``--metrics-port``) and a clean stop on SIGTERM/SIGINT. The
driver itself is the probe below and a prepare that names the allocated cards.

It needs 7 names of the toolkit: ``start``, ``PluginOptions``, ``Pool``, ``HealthHub``,
``DeviceReport``, ``PrepareResult``, ``PreparedDevice`` (``drahealth.driver``), plus
``Health`` (``drahealth.core``) and, for API access, ``make_client`` (``drahealth.kube``);
devices are lightkube's ``resource.k8s.io/v1`` ``Device`` model.

    python examples/custom_driver.py --base /tmp/fpga       # no API access
    touch /tmp/fpga/faults/fpga-2                            # fault: Unhealthy (latched)
    rm /tmp/fpga/faults/fpga-2                               # probe Healthy clears it
    drahealth inject --state-dir /tmp/fpga/state fpga-1 unhealthy   # an injected fault
    drahealth inject --state-dir /tmp/fpga/state fpga-1 healthy     # operator recovery

Under a real kubelet, point it at the kubelet's directories (``--registry-dir
/var/lib/kubelet/plugins_registry --plugins-dir /var/lib/kubelet/plugins``).

With an API server, the cards are published and a faulty card is tainted:

    drahealth apiserver --kubeconfig-out /tmp/fpga.kubeconfig &
    python examples/custom_driver.py --base /tmp/fpga --kubeconfig /tmp/fpga.kubeconfig
    kubectl --kubeconfig /tmp/fpga.kubeconfig get resourceslices -o yaml
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any

from lightkube.models.resource_v1 import Device, DeviceAttribute

from drahealth.core import Health
from drahealth.driver import (
    DeviceReport,
    HealthHub,
    PluginOptions,
    Pool,
    PreparedDevice,
    PrepareResult,
    start,
)
from drahealth.kube import make_client

DRIVER = "fpga.example.com"
CARDS = [f"fpga-{i}" for i in range(4)]


class FpgaDriver:
    """The Driver protocol: ``prepare`` and ``unprepare`` answer every claim by UID.

    ``claims`` are ``PreparedClaimRequest`` (the fetched claim and this driver's
    allocation results) and ``ClaimRef``; the toolkit has already refused cards
    latched Unhealthy (``refuse_unhealthy``), so prepare only names the cards.
    """

    async def prepare(self, claims: Sequence[Any]) -> Mapping[str, PrepareResult]:
        return {
            claim.uid: PrepareResult.ok(
                [PreparedDevice([r.request], r.pool, r.device) for r in claim.results]
            )
            for claim in claims
        }

    async def unprepare(self, claims: Sequence[Any]) -> Mapping[str, Exception | None]:
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


async def main(
    base: str,
    node: str,
    kubeconfig: str | None,
    metrics_port: int | None,
    registry_dir: str | None = None,
    plugins_dir: str | None = None,
) -> None:
    os.makedirs(f"{base}/faults", exist_ok=True)
    hub = HealthHub([(node, card) for card in CARDS], default_timeout_seconds=10)
    hub.submit("probe", probe(node, f"{base}/faults"))  # first probe before serving
    cards = Pool(
        [Device(name=c, attributes={"index": DeviceAttribute(int=i)}) for i, c in enumerate(CARDS)]
    )
    client = make_client(kubeconfig) if kubeconfig else None
    options = PluginOptions(
        DRIVER,
        node_name=node,  # also the pool's name
        registry_dir=registry_dir or f"{base}/registry",  # a kubelet's plugins_registry
        plugins_dir=plugins_dir or f"{base}/plugins",
        cdi_dir=f"{base}/cdi",
        state_dir=f"{base}/state",  # checkpoint, taints, control.sock
        kube_client=client,  # None: no claims fetched, no slices published
        refuse_unhealthy=True,
        metrics_port=metrics_port,
        stop_on_signals=True,
    )
    handle = await start(FpgaDriver(), options, health=hub, resources=cards)
    probing = asyncio.create_task(probe_forever(hub, node, f"{base}/faults"))
    print(f"ready: {handle.registrar_socket} (DRA socket {handle.endpoint})", flush=True)
    try:
        await handle.wait()  # until SIGTERM/SIGINT
    finally:
        probing.cancel()
        hub.close()
        if client is not None:
            await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="/tmp/fpga-driver", help="directory for all sockets")
    parser.add_argument("--node", default=os.environ.get("NODE_NAME", "node-1"))
    parser.add_argument("--kubeconfig", default=None, help="API access: claims and slices")
    parser.add_argument("--metrics-port", type=int, default=None, help="serve /metrics")
    parser.add_argument(
        "--registry-dir", default=None, help="kubelet plugin registry [default: BASE/registry]"
    )
    parser.add_argument(
        "--plugins-dir", default=None, help="parent of the DRA socket dir [default: BASE/plugins]"
    )
    args = parser.parse_args()
    dirs = (args.registry_dir, args.plugins_dir)
    asyncio.run(main(args.base, args.node, args.kubeconfig, args.metrics_port, *dirs))
