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
