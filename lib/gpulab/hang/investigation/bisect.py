"""Hang-safe bisection of a failing configuration to the smallest one that still fails.

Existing bisectors (torch's compiler bisector, the dynamo minifier, C-Reduce-style reducers) run their
candidates in-process or without a deadline, so a candidate that hangs hangs them, and none handles a
failure that strikes in a fraction of launches. Here every probe is a watched gpulab.proc child with a
deadline and an outcome; a configuration fails when any of its `repeats` trials fails (trials stop at the
first failure), so an intermittent hang bisects too, with the detection odds reported.

Each integer dimension is shrunk by binary search between SMALLEST and FAILING, assuming failure is
monotone in it (a hang from 65 rows on): the smallest value first (one probe when it already fails), then
halving, at most ceil(log2(M)) + 1 probes for a range of M values; a threshold such as 65 is found exactly.
Each choice dimension (a dtype, an SDPA backend, an environment variable such as CUDA_MODULE_LOADING) is
tried at its alternatives, simplest first, and takes the first one that still fails; when none does,
the failing value is what matters and is kept.
"""
from __future__ import annotations

import os
import re
import shlex
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gpulab import proc, report, workloads
from gpulab.hang.investigation.ladder import Rung, Trial, run_trial
from gpulab.trace import liveness

ENV_PREFIX = "env."
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class BisectError(ValueError):
    """A bisection that cannot start: the message names the bad part and what is allowed (exit 2)."""


class NothingToBisect(BisectError):
    """The failing values passed every trial: there is no failure to shrink."""


@dataclass(frozen=True)
class IntDim:
    name: str
    failing: int
    smallest: int


@dataclass(frozen=True)
class ChoiceDim:
    name: str
    failing: str
    alternatives: tuple[str, ...]

    @property
    def env_var(self) -> str | None:
        """`env.NAME` dimensions set an environment variable of the probe instead of a placeholder."""
        return self.name[len(ENV_PREFIX):] if self.name.startswith(ENV_PREFIX) else None


@dataclass(frozen=True)
class Probe:
    config: dict
    outcome: str                 # fail (as the failing values did) | pass | other (failed differently)
    counts: dict
    seconds: float
    dimension: str | None        # the dimension this probe decided (None: the first, all-failing probe)
    value: Any = None
    verdict: dict | None = None  # the first failing trial's verdict


@dataclass(frozen=True)
class BisectResult:
    minimal: dict
    probes: tuple[Probe, ...]
    verdict: dict | None             # the first failing trial of the minimal configuration
    repro: str | None
    repeats: int
    matters: dict = field(default_factory=dict)  # choice dimensions whose failing value is needed
    detection: str = ""
    interrupted: bool = False        # stopped by a signal: `minimal` is as far as the search got

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------------ parsing (pure)

def parse_space(spec: str) -> IntDim:
    """`NAME=FAILING:SMALLEST` (integers, SMALLEST <= FAILING)."""
    name, eq, rest = spec.partition("=")
    failing, colon, smallest = rest.partition(":")
    if not eq or not colon or not name.strip():
        raise BisectError(f"--space {spec!r} is not NAME=FAILING:SMALLEST (e.g. --space seq=128:1)")
    try:
        f, s = int(failing), int(smallest)
    except ValueError:
        raise BisectError(f"--space {spec!r}: FAILING and SMALLEST must be integers") from None
    if s > f:
        raise BisectError(f"--space {spec!r}: SMALLEST {s} is above FAILING {f}; write NAME=FAILING:SMALLEST "
                          f"with SMALLEST <= FAILING")
    return IntDim(name.strip(), f, s)


def parse_choice(spec: str) -> ChoiceDim:
    """`NAME=FAILING:ALT1,ALT2` (alternatives simplest first); `env.VAR=...` for an environment variable."""
    name, eq, rest = spec.partition("=")
    failing, colon, alts = rest.partition(":")
    alternatives = tuple(a.strip() for a in alts.split(",") if a.strip())
    if not eq or not colon or not name.strip() or not failing.strip() or not alternatives:
        raise BisectError(f"--choice {spec!r} is not NAME=FAILING:ALT1,ALT2 (e.g. --choice dtype=bfloat16:float32, "
                          f"or --choice env.CUDA_MODULE_LOADING=LAZY:EAGER)")
    if failing.strip() in alternatives:
        raise BisectError(f"--choice {spec!r}: the failing value {failing.strip()!r} is also listed as an alternative")
    return ChoiceDim(name.strip(), failing.strip(), alternatives)


def check(command: Sequence[str], ints: Sequence[IntDim], choices: Sequence[ChoiceDim]) -> None:
    """Every dimension is used by the command (or is an env.VAR), every placeholder has a dimension."""
    if not command:
        raise BisectError("no command: give it after '--' with {NAME} placeholders, e.g. -- python x.py --seq {seq}")
    if not ints and not choices:
        raise BisectError("nothing to shrink: give at least one --space NAME=FAILING:SMALLEST or --choice")
    names = [d.name for d in (*ints, *choices)]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise BisectError(f"dimension(s) {', '.join(dup)} given more than once")
    used = {m for part in command for m in _PLACEHOLDER.findall(part)}
    missing = [n for n in names if not n.startswith(ENV_PREFIX) and n not in used]
    if missing:
        raise BisectError(f"dimension(s) {', '.join(missing)} do not appear in the command as {{NAME}}; "
                          f"placeholders in the command: {', '.join(sorted(used)) or 'none'}")
    unbound = sorted(used - set(names))
    if unbound:
        raise BisectError(f"placeholder(s) {', '.join('{' + u + '}' for u in unbound)} in the command have no "
                          f"--space or --choice")


def instantiate(command: Sequence[str], config: Mapping[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The probe's argv with placeholders filled, and the environment variables it sets."""
    argv = [_PLACEHOLDER.sub(lambda m: str(config[m.group(1)]) if m.group(1) in config else m.group(0), c)
            for c in command]
    env = {k[len(ENV_PREFIX):]: str(v) for k, v in config.items() if k.startswith(ENV_PREFIX)}
    return argv, env


def search_int(dim: IntDim, fails: Callable[[int], bool]) -> int:
    """Smallest value in [smallest, failing] for which `fails` holds, given that it holds at `failing` and
    failure is monotone: the smallest value first, then halving. Pure given `fails`."""
    lo, hi = dim.smallest, dim.failing
    if lo == hi or fails(lo):
        return lo
    while hi - lo > 1:  # invariant: lo passes, hi fails
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid
    return hi


# ------------------------------------------------------------------------------------ probing

class _Prober:
    """Runs probes (configurations), each `repeats` trials at most, `jobs` at a time, stopping at the first
    failure; remembers every outcome so a configuration is never run twice."""

    def __init__(self, command: Sequence[str], out: Path, *, repeats: int, jobs: int, stall_s: float,
                 timeout_s: float, mode: str, record: bool, fault: str | None, say: Callable[[str], None],
                 save: Callable[[], None]):
        self.command, self.out, self.repeats, self.jobs = list(command), out, repeats, jobs
        self.kw = dict(stall_s=stall_s, timeout_s=timeout_s, mode=mode, record=record, fault=fault, stacks=False)
        self.say, self.save = say, save
        self.probes: list[Probe] = []
        self._seen: dict[tuple, Probe] = {}
        self.target: str | None = None  # the outcome of the failing values (hang, crash, error, timeout)
        self._confirmed: dict[tuple, dict] = {}

    def fails(self, config: Mapping[str, Any], dimension: str | None, value: Any = None) -> bool:
        """True when a trial fails the way the failing values did (a hang stays a hang: a configuration
        that errors instead, e.g. an invalid size, is 'other', not a smaller failure)."""
        key = tuple(sorted((k, str(v)) for k, v in config.items()))
        if key in self._seen:
            return self._seen[key].outcome == "fail"
        argv, env_vars = instantiate(self.command, config)
        rung = Rung(f"probe{len(self.probes):03d}", tuple(argv))
        env = {**os.environ, **env_vars} if env_vars else None
        t0 = time.monotonic()
        trials = self._trials(rung, env)
        bad = next((t for t in trials if t.outcome != "pass"), None)
        if self.target is None and bad is not None:
            self.target = bad.outcome
        counts: dict[str, int] = {}
        for t in trials:
            counts[t.outcome] = counts.get(t.outcome, 0) + 1
        outcome = "pass" if bad is None else ("fail" if bad.outcome == self.target else "other")
        p = Probe(dict(config), outcome, counts, round(time.monotonic() - t0, 3), dimension,
                  value, {**bad.verdict, "folder": bad.folder} if bad else None)
        self.probes.append(p)
        self._seen[key] = p
        shown = ", ".join(f"{k}={v}" for k, v in config.items())
        self.say(f"probe {len(self.probes)}: {shown} -> {p.outcome} "
                 f"({', '.join(f'{n} {o}' for o, n in counts.items())}, {p.seconds:.1f} s)")
        self.save()
        return outcome == "fail"

    def _trials(self, rung: Rung, env: Mapping[str, str] | None) -> list[Trial]:
        done: list[Trial] = []
        if self.jobs == 1:
            for i in range(self.repeats):
                done.append(run_trial(rung, i, self.out, env=env, **self.kw))
                if done[-1].outcome != "pass":
                    break
            return done
        with ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="probe") as pool:
            started, pending = 0, set()
            try:
                while started < self.repeats or pending:
                    while started < self.repeats and len(pending) < self.jobs and not any(
                            t.outcome != "pass" for t in done):
                        pending.add(pool.submit(run_trial, rung, started, self.out, env=env, **self.kw))
                        started += 1
                    if not pending:
                        break
                    finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                    done += [f.result() for f in finished]
                    if any(t.outcome != "pass" for t in done) and pending:
                        # the configuration failed: the other trials are not needed, and what stopping
                        # them looks like (a kill) is not an outcome of the program
                        proc.stop_all()
                        wait(pending)
                        pending = set()
            except BaseException:
                proc.stop_all()
                raise
        return sorted(done, key=lambda t: t.index)

    def verdict_of(self, config: Mapping[str, Any]) -> dict | None:
        key = tuple(sorted((k, str(v)) for k, v in config.items()))
        return self._confirmed.get(key) or (self._seen[key].verdict if key in self._seen else None)

    def confirm(self, config: Mapping[str, Any]) -> bool:
        """Run the minimal configuration once more with stack capture (probes skip it: it can take
        seconds), up to `repeats` trials, so the reported verdict carries the stacks."""
        argv, env_vars = instantiate(self.command, config)
        rung = Rung("minimal", tuple(argv))
        env = {**os.environ, **env_vars} if env_vars else None
        for i in range(self.repeats):
            t = run_trial(rung, i, self.out, env=env, **{**self.kw, "stacks": True})
            if t.outcome == self.target:
                key = tuple(sorted((k, str(v)) for k, v in config.items()))
                self._confirmed[key] = {**t.verdict, "folder": t.folder}
                return True
        return False


def run(command: Sequence[str], ints: Sequence[IntDim], choices: Sequence[ChoiceDim] = (), *, out_dir: str | Path,
        repeats: int = 1, jobs: int = 1, stall_s: float = liveness.STALL_S, timeout_s: float = 600.0, mode: str = "auto",
        record: bool = True, fault: str | None = None, make_repro: bool = True,
        progress: Callable[[str], None] | None = None, json_copy: str | Path | None = None) -> BisectResult:
    """Shrink the failing configuration; bisect.json (and `json_copy`) is rewritten after every probe. Raises
    NothingToBisect (after writing bisect.json) when the failing values pass every trial."""
    check(command, ints, choices)
    if repeats < 1 or jobs < 1:
        raise BisectError(f"--repeats {repeats} and --jobs {jobs} must both be >= 1")
    say = progress or (lambda m: print(f"[gpulab bisect] {m}", file=sys.stderr, flush=True))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {d.name: d.failing for d in (*ints, *choices)}
    matters: dict[str, str] = {}
    state: dict[str, Any] = {"repro": None, "interrupted": False}

    def result() -> BisectResult:
        return BisectResult(dict(config), tuple(prober.probes), prober.verdict_of(config), state["repro"], repeats,
                            dict(matters), detection_note(repeats), state["interrupted"])

    targets = [out / "bisect.json", *([Path(json_copy)] if json_copy else [])]

    def save() -> None:
        data = result().to_dict()
        for path in targets:
            report.write_json(path, data)

    prober = _Prober(command, out, repeats=repeats, jobs=jobs, stall_s=stall_s, timeout_s=timeout_s, mode=mode,
                     record=record, fault=fault, say=say, save=save)
    try:
        if not prober.fails(config, None):
            raise NothingToBisect(f"nothing to bisect: the failing values ({_show(config)}) passed {repeats} of "
                                  f"{repeats} trial(s); raise --repeats for an intermittent failure "
                                  f"({detection_note(repeats)})")
        for dim in ints:
            config[dim.name] = search_int(dim, lambda v, d=dim: prober.fails({**config, d.name: v}, d.name, v))
            say(f"{dim.name}: smallest failing value {config[dim.name]}")
        for dim in choices:
            for alt in dim.alternatives:
                if prober.fails({**config, dim.name: alt}, dim.name, alt):
                    config[dim.name] = alt
                    break
            else:
                matters[dim.name] = dim.failing
            say(f"{dim.name}: {config[dim.name]}" + (" (every alternative passed: this value matters)"
                                                      if dim.name in matters else ""))
        confirm = prober.confirm(config)
        say("minimal configuration confirmed with stacks" if confirm else
            "the minimal configuration passed its confirmation trials (an intermittent failure): its verdict "
            "comes from the bisection probe, without stacks")
    except proc.Interrupted:
        state["interrupted"] = True
        save()
        raise
    if make_repro:
        state["repro"] = str(write_repro_sh(out, command, config))
    save()
    return result()


def detection_note(repeats: int) -> str:
    """What `repeats` trials can and cannot see, in words."""
    if repeats <= 1:
        return "one trial per configuration: only a failure that always happens is found reliably"
    p95 = 1 - 0.05 ** (1 / repeats)
    return (f"{repeats} trials per configuration see a failure of rate p with probability 1-(1-p)^{repeats}: "
            f">= 95% for p >= {p95:.0%}")


def _show(config: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items())


def write_repro_sh(out: Path, command: Sequence[str], config: Mapping[str, Any]) -> Path:
    """repro.sh: the minimal failing command, runnable as is (environment variables included)."""
    argv, env = instantiate(command, config)
    lines = ["#!/bin/sh", "# The smallest configuration gpulab bisect found that still fails:",
             f"#   {_show(config)}", "# Run it under the watchdog to see the verdict:",
             "#   gpulab watch --stall 30 -- " + " ".join(shlex.quote(a) for a in argv),
             " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), *(shlex.quote(a) for a in argv)])]
    path = out / "repro.sh"
    report.write_text(path, "\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


# ------------------------------------------------------------------------------------ the built-in workload

SHRINKABLE = {"layers": 1, "heads": 1, "batch": 1, "image_tokens": 1, "text_tokens": 1, "steps": 1,
              "lora_rank": 0}  # (head_dim is left out: rotary embeddings need it even)


def builtin_space(cfg: workloads.WorkloadConfig, dims: Sequence[str]) -> tuple[list[str], list[IntDim]]:
    """The built-in workload as a command template and its integer dimensions, from the failing config."""
    bad = [d for d in dims if d not in SHRINKABLE]
    if bad:
        raise BisectError(f"cannot shrink {', '.join(bad)}; choose from {', '.join(SHRINKABLE)}")
    argv = workloads.command(cfg)
    template = list(argv)
    for d in dims:
        flag = f"--{d.replace('_', '-')}"
        template[template.index(flag) + 1] = "{" + d + "}"
    ints = [IntDim(d, int(getattr(cfg, d)), min(SHRINKABLE[d], int(getattr(cfg, d)))) for d in dims]
    return template, ints
