"""drahealth.web: the dashboard (node x device grid, live over server-sent events).

``Dashboard`` serves one static page (no build step) and the JSON it renders; run it with
``drahealth dashboard`` or as part of ``drahealth demo``.
"""

from __future__ import annotations

from drahealth.web._server import Dashboard

__all__ = ["Dashboard"]
