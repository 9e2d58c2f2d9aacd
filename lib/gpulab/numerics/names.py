"""Names the recorder (in the child) and the comparison (in the parent) share; torch-free."""
ENV_DIR = "GPULAB_NUMERICS_DIR"        # where the child writes <pid>.jsonl
ENV_KEEP = "GPULAB_NUMERICS_KEEP"      # "op|site|pass|out" lines: the records whose inputs the child keeps (replay)
INPUT = "<input>"                      # a record of a tensor no recorded op made (data, compiled code's outputs)
REPLAY = "replay.pt"                   # the kept record's inputs, output and float64 replay, in the run folder
INSTALL = "gpulab.numerics.record:install"
COLLECTIVES = ("c10d.", "_c10d_functional.", "c10d_functional.")   # ops whose outputs hold other ranks' data
# aten ops that draw from a random generator (base names): what they give depends on its state, not on inputs
RANDOM = frozenset({"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm", "normal",
                    "normal_", "uniform_", "bernoulli", "bernoulli_", "multinomial", "exponential_", "geometric_",
                    "cauchy_", "log_normal_", "random_", "native_dropout", "rrelu_with_noise", "poisson"})


# One computation, run by another backend's kernel (CPU's flash attention, CUDA's efficient one; cuDNN's batch norm):
# base name -> (the computation, how many leading outputs and floating inputs mean the same on every backend: the
# rest differ by backend, a log-sum-exp of another shape, a mask where the other has its output). The alignment
# pairs them; the judge compares only those inputs. Batch norm's backward is left out: its kernels take their
# inputs in other orders.
_SDPA = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
         "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
         "_scaled_dot_product_fused_attention_overrideable")
_BN = ("native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm", "_native_batch_norm_legit",
       "_native_batch_norm_legit_functional", "_batch_norm_with_update", "_batch_norm_with_update_functional",
       "_batch_norm_no_update", "_native_batch_norm_legit_no_training")
VARIANTS = {**{n: ("attention", 1, 3) for n in _SDPA}, **{f"{n}_backward": ("attention_backward", 3, 4) for n in _SDPA},
            **{n: ("batch_norm", 1, 5) for n in _BN}}


def _variant(op: str | None) -> tuple | None:
    parts = str(op or "").split(".")
    return VARIANTS.get(parts[1]) if len(parts) > 1 and parts[0] == "aten" else None


def computation(op: str | None, out: int | None = 0) -> str | None:
    """The name two runs' records are aligned by: a backend's variant of a computation (and only the outputs that
    mean the same on every backend) by the computation's ('aten.<attention>'), any other op by its own."""
    got = _variant(op)
    return f"aten.<{got[0]}>" if got and int(out or 0) < got[1] else op


def shared_inputs(op: str | None, other: str | None) -> int | None:
    """How many leading floating inputs two paired ops share: all (None) for the same op, a backend variant's
    shared ones for two kernels of one computation."""
    if op == other:
        return None
    got = _variant(op)
    return got[2] if got else None


def collective(op: str | None) -> bool:
    """Whether a recorded op ('c10d.allreduce_.default') is a collective: its output holds other ranks' data."""
    return str(op or "").startswith(COLLECTIVES)


def random_op(op: str | None) -> bool:
    """Whether a recorded op ('aten.randn.generator') draws random numbers."""
    parts = str(op or "").split(".")
    return len(parts) > 1 and parts[0] == "aten" and parts[1] in RANDOM


def replay_file(n: int) -> str:
    """The n-th kept record's replay material (n counts the lines of ENV_KEEP, from 0)."""
    return REPLAY if n == 0 else f"replay-{n}.pt"
