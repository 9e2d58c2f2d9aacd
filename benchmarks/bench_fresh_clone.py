"""Figure: a fresh clone's `make run` (set-up, then the default chain), the README's one command, timed.

Each revision is cloned into a new folder and run there as a user would (`make run`), one after another in
this run; the set-up and the chain are timed apart (the chain's own "done in" and its per-notebook times
from run.json). --cold gives each clone empty pip and uv caches (the downloads a new machine makes);
otherwise the caches of this machine stand, as for a second project on it.

    python benchmarks/bench_fresh_clone.py --out /tmp/fc [--revs 7bcf310,HEAD] [--cold]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(rev: str, out: Path, cold: bool) -> dict:
    work = Path(tempfile.mkdtemp(prefix="gpulab-fresh-"))
    try:
        clone = work / "repo"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", rev], check=True)
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        if cold:
            env.update(PIP_CACHE_DIR=str(work / "pip-cache"), UV_CACHE_DIR=str(work / "uv-cache"))
        log = out / f"make-run-{rev}.log"
        t0 = time.monotonic()
        with open(log, "w") as fh:
            rc = subprocess.run(["make", "run"], cwd=clone, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
        total = time.monotonic() - t0
        text = log.read_text(errors="replace")
        chain = re.search(r"done in (\d+) s", text)
        runs = sorted((clone / "outputs").glob("2*/run.json"))
        nbs = {}
        if runs:
            for nb in json.loads(runs[-1].read_text())["scenarios"][0]["notebooks"]:
                nbs[nb["name"][:2]] = round(nb.get("duration_s") or 0.0, 1)
        chain_s = float(chain.group(1)) if chain else None
        return {"rev": rev, "commit": subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"],
                                                     capture_output=True, text=True).stdout.strip(),
                "rc": rc, "cold_caches": cold, "total_s": round(total, 1),
                "setup_s": round(total - chain_s, 1) if chain_s is not None else None, "chain_s": chain_s,
                "notebooks_s": nbs}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--revs", default="HEAD", help="comma-separated revisions, timed in this order")
    ap.add_argument("--cold", action="store_true", help="empty pip and uv caches for each clone")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for rev in a.revs.split(","):
        rows.append(one(rev, a.out, a.cold))
        r = rows[-1]
        print(f"{r['rev']} ({r['commit']}): make run {r['total_s']} s = set-up {r['setup_s']} s + chain "
              f"{r['chain_s']} s {r['notebooks_s']} (rc {r['rc']})", flush=True)
    (a.out / "fresh_clone.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
