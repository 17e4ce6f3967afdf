"""A remediation controller in a process of its own, for tests that SIGKILL it.

``python -m tests.reliability._repair_controller_worker URL POLICY_FILE IDENTITY``
runs :class:`~drahealth.remedy._controller.RemediationController` against the API
server at URL until it is killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from drahealth.kube import make_client
from drahealth.remedy._controller import RemediationController
from drahealth.remedy._policy_load import parse_policy


async def main(url: str, policy_text: str, identity: str) -> None:
    client = make_client(server_url=url, timeout=5.0)
    policy = parse_policy(policy_text, "test-policy")
    await RemediationController(client, policy, identity=identity).run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]).read_text(), sys.argv[3]))
