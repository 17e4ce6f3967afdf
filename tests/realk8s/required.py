"""What a real-cluster test does when a peer it needs is not built here: it skips with
the reason, or fails with it where ``DRAHEALTH_REALK8S_REQUIRED=1`` (CI's real-cluster
step), so that step cannot pass by skipping."""

from __future__ import annotations

import os

import pytest


def skip_unless_built(reason: str | None) -> None:
    """Skip (or fail where required) with ``reason``; None: the peer is there."""
    if reason is None:
        return
    if os.environ.get("DRAHEALTH_REALK8S_REQUIRED") == "1":
        pytest.fail(reason)
    pytest.skip(reason)
