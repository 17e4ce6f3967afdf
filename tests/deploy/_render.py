"""Imports ``deploy/render.py`` (a script, not a package module) for the tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "drahealth"

_spec = importlib.util.spec_from_file_location("drahealth_render", ROOT / "deploy" / "render.py")
assert _spec is not None and _spec.loader is not None
render = importlib.util.module_from_spec(_spec)
sys.modules["drahealth_render"] = render
_spec.loader.exec_module(render)
