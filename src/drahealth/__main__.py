"""``python -m drahealth``: the same command line as the ``drahealth`` script."""

from __future__ import annotations

from drahealth.cli import main

if __name__ == "__main__":
    main()
