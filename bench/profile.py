"""Profile one benchmark's in-process side with pyinstrument: ``python bench/profile.py
prepare|propagation [--html FILE]``.

Owns nothing but the profiling run. ``prepare`` profiles the driver plugin (claim
watch cache on) while the kubelet-side caller runs in its own process, during the
bursts only (not the set-up of the API server and the claims); ``propagation``
profiles the embedded API server and the plugin's health hub while the agent runs as
a subprocess (profile that one with ``python -m pyinstrument -m drahealth agent ...``).
Prints the call tree; the analysis in docs/benchmarks.md comes from these runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from pyinstrument import Profiler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pipeline_bench


async def run(which: str, profiler: Profiler) -> dict[str, float]:
    if which == "prepare":
        bursts = pipeline_bench.call_prepares

        async def profiled(socket: str, claims: list[list[str]], rounds: int) -> list[float]:
            profiler.start()
            try:
                return await bursts(socket, claims, rounds)
            finally:
                profiler.stop()

        pipeline_bench.call_prepares = profiled
        return await pipeline_bench.prepare(rounds=20, cache=True)
    profiler.start()
    try:
        return await pipeline_bench.propagation(100)
    finally:
        profiler.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=["prepare", "propagation"])
    parser.add_argument("--html", help="also write an HTML report here")
    args = parser.parse_args()
    profiler = Profiler(interval=0.0005, async_mode="disabled")
    result = asyncio.run(run(args.which, profiler))
    print(result)
    print(profiler.output_text(unicode=False, color=False))
    if args.html:
        with open(args.html, "w") as f:
            f.write(profiler.output_html())


if __name__ == "__main__":
    main()
