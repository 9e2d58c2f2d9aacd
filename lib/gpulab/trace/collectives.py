"""torch.distributed calls as first-class records: each collective, p2p call, barrier and object collective
of the program is one composite record `dist.<name>` around what the dispatcher runs inside it (the
`c10d.*` ops and the wait), with its process group, its per-group sequence number, its peer and the shapes
and dtypes of its tensors. The dispatcher alone shows `c10d.allreduce_` completing at launch, while the rank
then waits outside any op: the Python call is what a rank is stuck in.

The sequence number is the process group's own (`_get_sequence_number_for_group`, which gloo and NCCL keep
and which every collective of the group advances, whoever issues it: DDP's reducer, FSDP, the functional
collectives, this API): the number the next collective of the group will carry, read before the call, the
same on every rank and the same as the flight recorder's `collective_seq_id`. Only where a backend keeps
none is it counted here, per process and per group, in the order the program calls. A call made inside
another recorded call (all_gather_object's all_gather) is not counted again. async_op calls are recorded
until they return (the launch).

The collectives PyTorch issues from C++ (DDP's gradient all_reduce) or through the functional collectives are
numbered by the flight recorder, which the job runs with (FR_ENV): `snapshot()`, called in the rank when the
watchdog asks (gpulab.trace.follow), gives its entries and each group's current number.
"""
from __future__ import annotations

import inspect
import threading
from typing import Any, Callable

# name -> kind: counted collectives get a sequence number; p2p names a peer; "group" is bookkeeping
CALLS = {
    **dict.fromkeys(("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                     "broadcast", "reduce", "all_to_all", "all_to_all_single", "gather", "scatter", "barrier",
                     "monitored_barrier", "all_gather_object", "broadcast_object_list", "gather_object",
                     "scatter_object_list"), "collective"),
    **dict.fromkeys(("send", "recv", "isend", "irecv", "batch_isend_irecv"), "p2p"),
    "new_group": "group",
}
DEFAULT_GROUP = "default"
PREFIX = "dist."
# the flight recorder's ring, per rank: gloo and NCCL keep their collectives there (seq, state, sizes) when
# its size is set before the process group is made (the first name; the second is the older NCCL-only one,
# which newer torch warns about: a user's setting of either is kept)
FR_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_ENTRIES = 2000


class Tag(str):
    """An argument of a record that prints as itself (the op log keeps repr() of non-tensors)."""

    def __repr__(self) -> str:
        return str(self)


_inside = threading.local()


def group_key(dist: Any, group: Any) -> str:
    """The group's name as every rank knows it: 'default' for the world, else its (deterministic) name."""
    if group is None or group is getattr(dist.GroupMember, "WORLD", None):
        return DEFAULT_GROUP
    name = getattr(group, "group_name", None)
    try:
        if name == dist.distributed_c10d._get_default_group().group_name:
            return DEFAULT_GROUP
    except Exception:  # noqa: BLE001 - not initialized: a name is still a name
        pass
    return str(name) if name else f"pg@{id(group):x}"


def group_seq(dist: Any, group: Any) -> int | None:
    """The group's own sequence number now (collectives issued so far), or None where the backend keeps none."""
    try:
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        return int(pg._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - not initialized, or a backend without one
        return None


def _tensors(values: Any) -> list:
    import torch

    out: list = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
            out.extend(x for x in v if isinstance(x, torch.Tensor))
    return out[:4]


def describer(dist: Any, name: str, kind: str, orig: Callable, counters: dict) -> Callable:
    """describe(args, kwargs) -> the record's arguments: tensors, then g=, seq= / peer=, async."""
    try:
        sig = inspect.signature(orig)
    except (TypeError, ValueError):
        sig = None

    def describe(args: tuple, kwargs: dict):
        if getattr(_inside, "depth", 0):
            return None
        try:
            bound = sig.bind_partial(*args, **kwargs).arguments if sig is not None else dict(kwargs)
        except TypeError:
            bound = dict(kwargs)
        group = bound.get("group")
        if kind == "p2p" and group is None and name == "batch_isend_irecv":
            ops = bound.get("p2p_op_list") or ()
            group = getattr(ops[0], "group", None) if ops else None
        key = group_key(dist, group)
        tags = [Tag(f"g={key}")]
        if kind == "collective":
            counters[key] = counters.get(key, 0) + 1
            now = group_seq(dist, group)
            tags.append(Tag(f"seq={now + 1}" if now is not None else f"seq={counters[key]}"))
            if now is None:
                tags.append(Tag("counted"))
        elif kind == "p2p":
            peer = next((bound[k] for k in ("dst", "src", "group_dst", "group_src") if bound.get(k) is not None), None)
            if peer is not None:
                tags.append(Tag(f"peer={peer}"))
        elif kind == "group" and bound.get("ranks") is not None:
            tags.append(Tag("ranks=" + ",".join(map(str, bound["ranks"]))))
        if bound.get("async_op"):
            tags.append(Tag("async"))
        return (*_tensors(bound.values()), *tags)
    return describe


def _nested(orig: Callable) -> Callable:
    def call(*args, **kwargs):
        _inside.depth = getattr(_inside, "depth", 0) + 1
        try:
            return orig(*args, **kwargs)
        finally:
            _inside.depth -= 1
    return call


def install(call_wrapper: Callable, on_init: Callable[[Any], None] | None = None) -> Callable[[], None]:
    """Wrap torch.distributed's calls with `call_wrapper(orig, name, describe)` (the recorder's composite
    records); returns the function that puts the originals back. A torch without distributed: nothing."""
    try:
        import torch.distributed as dist
        if not dist.is_available():
            return lambda: None
    except Exception:  # noqa: BLE001
        return lambda: None
    # both the package and the module that defines the calls: a library may call either, and the calls
    # one collective makes inside (all_gather_object's all_gather) go through the module's globals
    c10d = dist.distributed_c10d
    saved: list[tuple[Any, str, Callable]] = []
    counters: dict[str, int] = {}

    def put(name: str, orig: Callable, wrapped: Callable) -> None:
        for mod in (dist, c10d):
            if getattr(mod, name, None) is orig:
                saved.append((mod, name, orig))
                setattr(mod, name, wrapped)

    for name, kind in CALLS.items():
        orig = getattr(c10d, name, None) or getattr(dist, name, None)
        if orig is None or getattr(orig, "__gpulab_call__", False):
            continue
        wrapped = call_wrapper(_nested(orig), f"{PREFIX}{name}".encode(), describer(dist, name, kind, orig, counters))
        wrapped.__gpulab_call__ = True
        put(name, orig, wrapped)
    init = getattr(dist, "init_process_group", None)
    if on_init is not None and init is not None and not getattr(init, "__gpulab_call__", False):
        def init_process_group(*args, **kwargs):
            out = init(*args, **kwargs)
            try:
                on_init(dist)
            except Exception:  # noqa: BLE001 - a role note must never break the program
                pass
            return out
        init_process_group.__gpulab_call__ = True
        put("init_process_group", init, init_process_group)

    def restore() -> None:
        for mod, n, f in reversed(saved):
            setattr(mod, n, f)
    return restore


def parse(args: list) -> dict:
    """The tags of a `dist.*` record's parsed arguments: {"group", "seq", "peer", "async", "ranks"}."""
    out: dict = {"group": None, "seq": None, "peer": None, "async": False}
    for a in args:
        v = a.get("value") if isinstance(a, dict) else None
        if not isinstance(v, str):
            continue
        if v.startswith("g="):
            out["group"] = v[2:]
        elif v.startswith("seq="):
            out["seq"] = _int(v[4:])
        elif v.startswith("peer="):
            out["peer"] = _int(v[5:])
        elif v.startswith("ranks="):
            out["ranks"] = v[6:]
        elif v == "async":
            out["async"] = True
        elif v == "counted":
            out["counted"] = True
    return out


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


# ------------------------------------------------------------------------------------ the flight recorder

def snapshot() -> dict:
    """In a rank, when the watchdog asks: every process group's key, ranks and current sequence number, and the
    flight recorder's entries ({} when torch.distributed is not initialized here). Runs on a helper thread
    while the main thread waits in a collective (the waits release the GIL)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return {}
    c10d = dist.distributed_c10d
    groups = []
    for pg in list(getattr(c10d._world, "pg_map", {}) or ()):
        try:
            ranks = list(dist.get_process_group_ranks(pg))
        except Exception:  # noqa: BLE001
            ranks = []
        groups.append({"name": str(getattr(pg, "group_name", "")), "key": group_key(dist, pg), "ranks": ranks,
                       "seq": group_seq(dist, pg)})
    return {"groups": groups, "fr": _fr_entries(groups)}


def _fr_entries(groups: list) -> list:
    """The flight recorder's entries, each with the group's key ('default' or its name); [] when it is off.
    Every entry the ring holds, completed ones too: NCCL marks an entry completed when its GPU work is (gloo
    never does, and retires it instead), so asking for the active ones only would leave a rank whose
    collectives all completed with none at all, and nothing to match the waiting ranks' numbers against."""
    import json
    import sys

    c = getattr(sys.modules["torch"]._C, "_distributed_c10d", None)
    entries, seen = [], set()
    # CPU backends keep one recorder, NCCL its own (a CUDA build has both): read each that answers
    for name in ("_dump_fr_trace_json", "_dump_nccl_trace_json"):
        fn = getattr(c, name, None)
        for args in ((True, False), ()):   # (includeCollectives, onlyActive)
            if fn is None:
                break
            try:
                raw = fn(*args)
            except Exception:  # noqa: BLE001 - another signature, or the recorder is off
                continue
            try:
                got = json.loads(raw).get("entries") or [] if raw else []
            except ValueError:
                got = []
            for e in got:
                key = (tuple(e.get("process_group") or ()), e.get("record_id"), e.get("collective_seq_id"),
                       e.get("p2p_seq_id"), e.get("profiling_name"))
                if key not in seen:
                    seen.add(key)
                    entries.append(e)
            break
    keys = {g["name"]: g["key"] for g in groups}
    out = []
    for e in entries:
        pg = e.get("process_group") or ["", ""]
        out.append({"group": keys.get(str(pg[0]), str(pg[0])), "seq": e.get("collective_seq_id"),
                    "p2p_seq": e.get("p2p_seq_id"), "p2p": bool(e.get("is_p2p")), "op": fr_op(e.get("profiling_name")),
                    "sizes": e.get("input_sizes") or [], "dtypes": e.get("input_dtypes") or [],
                    "state": e.get("state"), "retired": bool(e.get("retired")) or e.get("state") == "completed",
                    "created": (e.get("time_created_ns") or 0) / 1e9,
                    "frames": [f"{f.get('filename')}:{f.get('line')} in {f.get('name')}" for f in e.get("frames") or ()][:8]})
    return out


_FR_OPS = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
           "alltoall": "all_to_all", "_allgather_base": "all_gather_into_tensor", "_all_gather_base": "all_gather_into_tensor",
           "_reduce_scatter_base": "reduce_scatter_tensor", "allgather_into_tensor_coalesced": "all_gather_into_tensor",
           "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor", "allreduce_coalesced": "all_reduce",
           # NCCL's barrier is an all_reduce of one element, named apart; c10d's op names (the dispatcher's)
           "all_reduce_barrier": "barrier", "alltoall_base": "all_to_all_single", "allgather_coalesced": "all_gather",
           "reduce_scatter": "reduce_scatter"}


def fr_op(profiling_name: str | None) -> str:
    """'gloo:all_reduce' / 'nccl:all_reduce' -> 'all_reduce', the torch.distributed name."""
    name = str(profiling_name or "?").split(":", 1)[-1]
    return _FR_OPS.get(name, name)


def dispatcher_op(name: str) -> str:
    """The torch.distributed name of a collective as the dispatcher or a backend names it:
    'c10d.allreduce_.default', '_c10d_functional.all_gather_into_tensor.default', 'nccl:all_reduce_barrier'
    -> 'all_reduce', 'all_gather_into_tensor', 'barrier'."""
    if ":" in name:
        return fr_op(name)
    parts = name.split(".")
    op = parts[1] if len(parts) > 1 else parts[0]
    op = op.removesuffix("_")   # c10d's in-place names: allreduce_, _allgather_base_
    return _FR_OPS.get(op, op)
