"""`gpulab env` (and `python -m gpulab.env`): notebook 01 on the command line.

Flags are spelled as notebook 01's parameters (`--head_dim`), so a value can be copied from one to the
other; the dashed spelling (`--head-dim`) is accepted too. Every input is checked before anything is
probed: a bad value is one line on stderr and exit 2, with nothing written.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpulab import proc
from gpulab.args import BadInput, json_target, parser
from gpulab.env import rules
from gpulab.env.gather import collect
from gpulab.env.products import document
from gpulab.env.view import format_report
from gpulab.report import write_json
from gpulab.workloads import DTYPES, RUNGS, SDPA_BACKENDS, WorkloadConfig

PROG = "gpulab env"
# The workload parameters that shape the attention call, with their help; defaults come from WorkloadConfig.
WORKLOAD_FLAGS = {
    "device": ("auto, cpu, cuda or cuda:N", None),
    "dtype": ("attention dtype (auto: bfloat16 on a GPU, float32 on the CPU)", DTYPES),
    "rung": ("step and steps also run the attention backward", RUNGS),
    "sdpa_backend": ("the backend the workload asks for (recorded; every usable backend is probed)", SDPA_BACKENDS),
    "batch": ("batch size", None),
    "heads": ("attention heads", None),
    "head_dim": ("dimension per head", None),
    "text_tokens": ("text tokens (the last quarter are padding, masked out of every row)", None),
    "image_tokens": ("image tokens", None),
}
EXAMPLE = "gpulab env --json env.json --device cuda --dtype bfloat16 --head_dim 128 --text_tokens 256"


def build_parser() -> argparse.ArgumentParser:
    p = parser(PROG, "The environment report and platform risks (notebook 01): facts, SDPA backends for the "
               "workload's attention call (selected, refused with torch's reasons, and really run in a child "
               "with a deadline), matched risks and the fix scenarios to try.", EXAMPLE)
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write facts + risks as JSON here")
    p.add_argument("--rules", type=Path, default=None, metavar="FILE", help="risk rules YAML (None: the bundled gpulab/env/risks.yaml)")
    p.add_argument("--no-sdpa-run", action="store_true", help="only select SDPA backends; do not run them")
    p.add_argument("--no-mask", dest="unmasked", action="store_true",
                   help="probe the call without its padding mask (what flash accepts), for comparison")
    defaults = WorkloadConfig()
    for name, (what, choices) in WORKLOAD_FLAGS.items():
        default = getattr(defaults, name)
        p.add_argument(f"--{name}", type=type(default), default=default, choices=choices, help=what)
        if "_" in name:  # the dashed spelling, hidden
            p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=type(default), choices=choices,
                           default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    """Prints the report (and writes --json); exit 0 when the report was produced, 2 on bad input."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        out = json_target(args.json)
        cfg = WorkloadConfig(**{name: getattr(args, name) for name in WORKLOAD_FLAGS})
        rule_set = rules.load_rules(args.rules)
    except (BadInput, ValueError) as exc:  # RuleError is a ValueError
        print(f"{PROG}: {exc}", file=sys.stderr)
        return proc.EXIT_BAD_INPUT
    facts = collect(cfg, unmasked=args.unmasked, run_sdpa=not args.no_sdpa_run, progress=True)
    matches = rules.evaluate(facts, rule_set)
    print(format_report(facts, matches))
    if out:
        write_json(out, document(facts, matches))
        print(f"wrote {out}")
    return 0
