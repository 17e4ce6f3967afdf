"""drahealth.web: the dashboard (a row per node, its devices when opened, live over
server-sent events: the whole state, then deltas).

``Dashboard`` serves one static page (no build step) and the JSON it renders; run it with
``drahealth dashboard`` or as part of ``drahealth demo``. See ``docs/dashboard.md``.
"""

from __future__ import annotations

from drahealth.web._server import Dashboard

__all__ = ["Dashboard"]
