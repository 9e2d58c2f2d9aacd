"""Figure: where the test suite's CPU goes, per test and per file (the suite is CPU-bound on CI's two cores, so its
wall time is its CPU-seconds over two).

Runs pytest with this file loaded as a plugin in every xdist worker: around each test (setup, call, teardown) it
reads the worker's own CPU and its reaped children's (RUSAGE_SELF, RUSAGE_CHILDREN), and writes one JSON line per
test under --out. Then prints the totals, the share the heaviest tests hold, and the heaviest files and tests.

    python benchmarks/bench_suite_cpu.py --out /tmp/suite [--top 25] [-- PYTEST ARGS]   (default: -n 3 --dist loadfile)
    python benchmarks/bench_suite_cpu.py --out /tmp/suite --read    (the table again, from what --out holds)
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_ENV_OUT = "GPULAB_SUITE_CPU_OUT"


# ------------------------------------------------------------------------------------------ the pytest plugin
def _cpu() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


_sink = None


def pytest_runtest_protocol(item, nextitem):
    """The default protocol, timed: a test's module-scoped fixtures count to the first test that builds them."""
    global _sink
    from _pytest.runner import runtestprotocol

    if _sink is None:
        out = Path(os.environ[_ENV_OUT])
        out.mkdir(parents=True, exist_ok=True)
        _sink = open(out / f"{os.getpid()}.jsonl", "a", buffering=1)
    me, kids, t0 = *_cpu(), time.monotonic()
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    reports = runtestprotocol(item, nextitem=nextitem)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    me2, kids2 = _cpu()
    _sink.write(json.dumps({"id": item.nodeid, "self": me2 - me, "children": kids2 - kids,
                            "wall": time.monotonic() - t0, "outcomes": [r.outcome for r in reports]}) + "\n")
    return True


# ------------------------------------------------------------------------------------------ the table
def read(out: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.read_text().splitlines() if line]


def table(rows: list[dict], top: int) -> str:
    cpu = {r["id"]: r["self"] + r["children"] for r in rows}
    total = sum(cpu.values())
    if not rows or total <= 0:
        return "no test was timed"
    ranked = sorted(rows, key=lambda r: -cpu[r["id"]])
    lines = [f"{len(rows)} tests, {total:.0f} CPU-s ({sum(r['children'] for r in rows):.0f} in their child "
             f"processes), {sum(r['wall'] for r in rows):.0f} s of worker wall time"]
    held = []
    for n in (10, 50, 200):
        if n < len(ranked):
            held.append(f"the heaviest {n}: {sum(cpu[r['id']] for r in ranked[:n]) / total:.0%}")
    light = [r for r in rows if cpu[r["id"]] < 1.0]
    held.append(f"{len(light)} tests under 1 CPU-s: {sum(cpu[r['id']] for r in light) / total:.0%}")
    lines.append("share of the CPU: " + "; ".join(held))
    per_file, n_file = collections.Counter(), collections.Counter()
    for r in rows:
        f = r["id"].split("::")[0]
        per_file[f] += cpu[r["id"]]
        n_file[f] += 1
    lines.append("\nCPU-s  tests  file")
    lines += [f"{c:6.1f} {n_file[f]:6d}  {f}" for f, c in per_file.most_common(top)]
    lines.append("\nCPU-s  (children)  wall-s  test")
    lines += [f"{cpu[r['id']]:6.1f} ({r['children']:6.1f}) {r['wall']:6.1f}  {r['id'][:150]}" for r in ranked[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, pytest_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--read", action="store_true", help="only print the table from what --out holds")
    a = p.parse_args(ours)
    code = 0
    if not a.read:
        if a.out.exists() and any(a.out.glob("*.jsonl")):
            p.error(f"--out {a.out} already holds a run's records: give an empty folder, or --read")
        env = {**os.environ, _ENV_OUT: str(a.out.resolve()),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")]))}
        args = pytest_args or ["-n", "3", "--dist", "loadfile"]
        t0 = time.monotonic()
        code = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                               Path(__file__).stem, *args], cwd=ROOT, env=env).returncode
        print(f"\npytest exited {code} after {time.monotonic() - t0:.0f} s")
    print(table(read(a.out), a.top))
    return code


if __name__ == "__main__":
    sys.exit(main())
