"""Whose bug it is, decided from the verdict's facts (pure): the program's own op, kernel, line or ctypes call;
a library's kernel on inputs it accepted; the platform's driver or hardware; unknown when nothing says."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulab.hang import classify, memcheck, owner

EVIDENCE = Path(__file__).parent / "fixtures" / "evidence"
SITE = "/opt/venv/lib/python3.11/site-packages"
FH_OWN_CTYPES = (
    "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f00 (most recent call first):\n"
    '  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at\n'
    '  File "/home/u/prog.py", line 19 in bad_gather\n'
    f'  File "{SITE}/torch/_library/custom_ops.py", line 502 in wrapped_fn\n'
    f'  File "{SITE}/torch/_ops.py", line 875 in __call__\n'
    '  File "/home/u/prog.py", line 27 in <module>\n')
FH_PLANTED_IN_ATEN = (
    "Current thread 0x00007f00 (most recent call first):\n"
    '  File "/work/gpulab/lib/gpulab/hang/faults.py", line 120 in __torch_dispatch__\n'
    f'  File "{SITE}/torch/_ops.py", line 875 in __call__\n'
    f'  File "{SITE}/torch/nn/functional.py", line 2380 in linear\n'
    '  File "/home/u/model.py", line 42 in forward\n')
FH_PACKAGE = (
    "Current thread 0x00007f00 (most recent call first):\n"
    f'  File "{SITE}/tokenizers_x/fast.py", line 88 in encode\n'
    '  File "/home/u/data.py", line 12 in __getitem__\n')
NATIVE_CUDNN = ('Thread 11 (idle): "MainThread"\n    __lll_lock_wait (libc.so.6)\n'
                '    cudnnConvolutionForward (libcudnn_cnn.so.9)\n    at::native::cudnn_convolution (libtorch_cuda.so)\n'
                '    forward (model.py:42)\n')
NATIVE_CTYPES = ('Thread 11 (idle): "MainThread"\n    pthread_mutex_lock (libc.so.6)\n    ffi_call (libffi.so.8)\n'
                 '    _ctypes_callproc (callproc.c:1262)\n    locked_scale (prog.py:27)\n')
FH_OWN_LOCK = ("Current thread 0x00007f00 (most recent call first):\n"
               '  File "/home/u/prog.py", line 27 in locked_scale\n'
               f'  File "{SITE}/torch/_ops.py", line 875 in __call__\n'
               '  File "/home/u/prog.py", line 35 in <module>\n')
INDEX_TB = ("Traceback (most recent call last):\n  File \"/home/u/train.py\", line 20, in <module>\n"
            "    out = head(table(ids)).sum()\n"
            f"  File \"{SITE}/torch/nn/functional.py\", line 2551, in embedding\n"
            "    return torch.embedding(weight, input, padding_idx, scale_grad_by_freq, sparse)\n"
            "IndexError: index out of range in self\n")


def op(name, site="prog.py:27 in <module>", device="cpu", **kw):
    return {"name": name, "call_site": site, "device": device, "shapes": [[4, 4]], **kw}


def v(status="crash", cls="unknown", in_flight=None, python="", native="", stderr="", **kw):
    return {"status": status, "class": cls, "in_flight_op": in_flight, "stderr_tail": stderr,
            "stacks": {"python": python, "native": native, "gpu": kw.pop("gpu", "")}, **kw}


CASES = [
    # (id, verdict, registered sources, expected kind, words the where must hold)
    ("own custom op segfault, registered in the program",
     v(in_flight=op("holdout.bad_gather.default"), python=FH_OWN_CTYPES, signal="SIGSEGV"),
     {"holdout": "/home/u/prog.py:15"}, "program", ("prog.py:19 in bad_gather", "holdout.bad_gather")),
    ("own custom op segfault, no sources found: the stacks say", v(in_flight=op("holdout.bad_gather.default"),
                                                                   python=FH_OWN_CTYPES), {}, "program",
     ("prog.py:19 in bad_gather",)),
    ("own op deadlock in its ctypes call", v(status="hang", cls="host_lock", in_flight=op("mine.locked.default"),
                                             python=FH_OWN_LOCK, native=NATIVE_CTYPES),
     {"mine": "/home/u/prog.py:19"}, "program", ("prog.py:27 in locked_scale",)),
    ("ctypes null read at module level, no op", v(python="Current thread 0x1 (most recent call first):\n"
                                                  '  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at\n'
                                                  '  File "/home/u/crash.py", line 11 in <module>\n'), {}, "program",
     ("crash.py:11",)),
    ("CPU embedding with an id past the table", v(status="error", cls="out_of_bounds",
                                                  in_flight=op("aten.embedding.default", site="train.py:20 in <module>"),
                                                  stderr=INDEX_TB), {}, "program", ("train.py:20", "aten.embedding")),
    ("CUDA device-side assert in embedding", v(status="error", cls="device_assert",
                                               in_flight=op("aten.embedding.default", site="train.py:20 in <module>",
                                                            device="cuda:0")), {}, "program", ("train.py:20",)),
    ("planted segfault inside aten.addmm stays PyTorch's", v(in_flight=op("aten.addmm.default", site="model.py:42"),
                                                             python=FH_PLANTED_IN_ATEN, signal="SIGSEGV"), {},
     "library", ("aten.addmm", "PyTorch")),
    ("a hang inside cuDNN", v(status="hang", cls="unknown", in_flight=op("aten.convolution.default", device="cuda:0"),
                              native=NATIVE_CUDNN), {}, "library", ("cuDNN",)),
    ("a package's own Python", v(status="hang", python=FH_PACKAGE), {}, "library", ("tokenizers_x",)),
    ("a custom op a package registers", v(in_flight=op("vendorlib.fused.default")),
     {"vendorlib": f"{SITE}/vendorlib/ops.py:10"}, "library", ("vendorlib",)),
    ("an Xid in the driver's words", v(status="error", cls="illegal_address", in_flight=op("aten.mm.default"),
                                       stderr="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"), {},
     "platform", ("Xid",)),
    ("a sync that was not localized", v(status="hang", cls="sync", in_flight=op("aten._local_scalar_dense.default")),
     {}, "unknown", ()),
    ("an unknown namespace found nowhere", v(in_flight=op("stranger.op.default")), {}, "unknown", ("stranger",)),
    ("ranks calling different collectives", v(status="hang", cls="collective_mismatch",
                                              divergence={"op": "all_reduce", "group": "default", "seq": 3}), {},
     "program", ("all_reduce",)),
    ("a rank that alone calls a collective, no stack captured: the op it has open",
     v(status="hang", cls="skipped_collective", culprit="rank 1/2",
       divergence={"op": "all_gather_into_tensor", "group": "default", "seq": 122},
       processes=[{"role": "rank 1/2", "frame": None, "open_op": "nccl:all_reduce at train.py:106 in main"}]), {},
     "program", ("train.py:106",)),
    ("a segfault inside PyTorch's own Python, no op", v(python=(
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n"
        f'  File "{SITE}/torch/nn/parallel/distributed.py", line 1473 in _ddp_init_helper\n'
        f'  File "{SITE}/torch/nn/parallel/distributed.py", line 1079 in __init__\n'
        '  File "/home/u/train.py", line 23 in main\n'), signal="SIGSEGV"), {}, "library",
     ("PyTorch (parallel/distributed.py:1473 in _ddp_init_helper), called at u/train.py:23 in main",)),
    ("a hang inside PyTorch's own Python is no crash: not called PyTorch's", v(status="hang", python=(
        "Current thread 0x1 (most recent call first):\n"
        f'  File "{SITE}/torch/utils/data/dataloader.py", line 1100 in _get_data\n'
        '  File "/home/u/train.py", line 23 in main\n')), {}, "unknown", ()),
    ("nothing at all", v(status="crash"), {}, "unknown", ()),
    ("a breakpoint() left in: pdb reads no input under gpulab", v(status="error", stderr=(
        "Traceback (most recent call last):\n  File \"/home/u/train.py\", line 10, in <module>\n"
        "    print(loss.item())\n  File \"/usr/lib/python3.11/bdb.py\", line 115, in dispatch_line\n"
        "    if self.quitting: raise BdbQuit\nbdb.BdbQuit\n")), {}, "program", ("train.py:10",)),
    ("input() reads no input under gpulab", v(status="error", stderr=(
        "Traceback (most recent call last):\n  File \"/home/u/ask.py\", line 3, in <module>\n"
        "    ans = input('continue? ')\nEOFError: EOF when reading a line\n")), {}, "program", ("ask.py:3",)),
]


@pytest.mark.parametrize("verdict,registered,kind,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_owner_from_the_verdicts_facts(verdict, registered, kind, words):
    got = owner.decide(verdict, registered)
    assert got.kind == kind, got
    for w in words:
        assert w in got.where, (w, got)
    assert got.why
    step = owner.next_step(got)
    if kind == "program":
        assert "program's own code" in step and "upstream" not in step
    elif kind == "library":
        assert "upstream" in step and "repro" in step
    elif kind == "platform":
        assert "platform" in step and "settings" in step
    else:
        assert step is None


NATIVE_LAUNCH = ('Thread 11 (active): "MainThread"\n    ioctl (libc.so.6)\n    0x7f00 (libcuda.so.1)\n'
                 '    cuLaunchKernel (libcuda.so.1)\n    cudaLaunchKernel (libcudart.so.12)\n'
                 '    at::native::vectorized_elementwise_kernel (libtorch_cuda.so)\n    main (lazy.py:38)\n')
FH_LAUNCH = ("Current thread 0x00007f00 (most recent call first):\n"
             '  File "/home/u/lazy.py", line 38 in main\n  File "/home/u/lazy.py", line 44 in <module>\n')


@pytest.mark.parametrize("api,stacks", [
    ("cuLaunchKernel", {"native": NATIVE_LAUNCH, "python": FH_LAUNCH}),            # read from the stacks
    ("cuModuleLoadData", {"python": FH_LAUNCH}),                                    # the verdict's own driver_call
], ids=["launch on the native stack", "module load named by the verdict"])
def test_a_host_stuck_in_a_launch_or_module_load_is_the_platform_meeting_the_programs_code(api, stacks):
    """The lazy-loading deadlock: the program's own line launches the op, yet the host is stuck in the driver's
    launch behind a spinning kernel. Both sides are said, and the program's own way out names its line."""
    verdict = v(status="hang", cls="sync", in_flight=op("aten.add_.Tensor", site="lazy.py:38 in main",
                                                         device="cuda:0"), **stacks)
    if "native" not in stacks:
        verdict["driver_call"] = api
    got = owner.decide(verdict)
    assert got.kind == "platform", got
    assert api in got.where and "lazy.py:38" in got.where and "lazy" in got.where
    assert "two kernels running at once" in got.why and "CUDA_MODULE_LOADING" in got.why
    assert "lazy.py:38" in got.program and "run it once first" in got.program
    assert owner.Owner.from_dict(got.to_dict()) == got
    step = owner.next_step(got)
    assert "meets the program's code" in step and "run it once first" in step and "upstream" not in step


@pytest.mark.parametrize("verdict", [
    v(status="hang", cls="collective", in_flight=op("c10d.allreduce_.default"), native=NATIVE_LAUNCH),  # peers
    v(status="hang", cls="sync", in_flight=op("aten._local_scalar_dense.default"), driver_call="cuStreamSynchronize"),
    v(status="crash", cls="unknown", in_flight=op("aten.add_.Tensor"), native=NATIVE_LAUNCH),            # no hang
], ids=["a collective's launch waits for its peers", "a sync is no launch", "a crash is no hang"])
def test_only_a_hang_in_a_launch_or_module_load_reads_as_loading(verdict):
    got = owner.decide(verdict)
    assert not got.program and "lazy module loading" not in got.where


def test_memcheck_names_the_programs_kernel_and_a_packages_kernel():
    rep = memcheck.parse(Path(__file__).parent.joinpath("fixtures", "memcheck", "triton_old_style_before.txt").read_text())
    got = owner.decide(v(status="error", cls="illegal_address", memcheck=rep.to_dict()))
    assert got.kind == "library" and "moelib" in got.where and "fused_moe_kernel" in got.where
    mine = memcheck.parse("========= Invalid __global__ write of size 8 bytes\n"
                          "=========     at _copy+0x80 in /home/u/prog.py:8\n"
                          "=========     by thread (3,0,0) in block (1,0,0)\n"
                          "=========     Address 0x7f00 is out of bounds\n")
    got = owner.decide(v(status="error", cls="illegal_address", in_flight=op("aten.add.Tensor"), memcheck=mine.to_dict()))
    assert got.kind == "program" and "_copy" in got.where and "prog.py:8" in got.where
    no_line = memcheck.parse("========= Invalid __global__ write of size 4 bytes\n"
                             "=========     at oob_kernel(float *, int)+0x70\n")
    got = owner.decide(v(status="error", cls="illegal_address", memcheck=no_line.to_dict()),
                       {"kernel:oob_kernel": "/home/u/ext.py:12"})
    assert got.kind == "program" and "oob_kernel" in got.where


def test_rdna_page_fault_is_the_platforms_only_where_the_arch_says_so():
    fault = v(status="crash", cls="gpu_page_fault", in_flight=op("aten._local_scalar_dense.default", device="cuda:0"),
              stderr="Memory access fault by GPU node-1 (Agent handle: 0x1) on address 0x7f. Reason: Page not present")
    assert owner.decide(fault, platform={"arch": "gfx1030"}).kind == "platform"
    assert owner.decide(fault, platform={"arch": "gfx90a"}).kind == "unknown"
    assert owner.decide(fault).kind == "unknown"


@pytest.mark.parametrize("text,found", [
    ('@torch.library.custom_op("holdout::pack", mutates_args=())\n', {"holdout": "p.py:1"}),
    ('x = 1\nlib = torch.library.Library("mine", "DEF")\n', {"mine": "p.py:2"}),
    ('torch.library.define("ns2::f", "(Tensor x) -> Tensor")\n', {"ns2": "p.py:1"}),
    ('TORCH_LIBRARY(extns, m) {\n  m.def("f(Tensor x) -> Tensor");\n}\n', {"extns": "p.py:1"}),
    ('lib = torch.library.Library("aten", "IMPL")\n', {}),                       # PyTorch's own namespace
    ('@triton.jit\ndef _copy(x_ptr, n):\n    pass\n', {"kernel:_copy": "p.py:2"}),
    ('src = """\n__global__ void oob_kernel(float* x, int n) { x[n] = 0; }\n"""\n', {"kernel:oob_kernel": "p.py:2"}),
])
def test_registrations_in_the_programs_sources(text, found):
    assert owner.registrations({"p.py": text}) == found


@pytest.mark.parametrize("path,who", [
    ("/home/u/prog.py", "program"), (f"{SITE}/torch/_ops.py", "library"), (f"{SITE}/numpy/core.py", "library"),
    ("/usr/lib/python3.11/ctypes/__init__.py", "stdlib"), ("<frozen runpy>", "stdlib"),
    (owner._GPULAB + "hang/faults.py", "tool"),
])
def test_origin_of_a_source_file(path, who):
    assert owner.origin(path)[0] == who


def test_bad_kind_is_named():
    with pytest.raises(ValueError, match="'user'.*program, library, platform, unknown"):
        owner.Owner("user", "", "")


def test_program_cause_follows_a_program_owner_and_keeps_the_job_classes():
    o = owner.Owner("program", "prog.py:19 in bad_gather", "a crash (SIGSEGV) in a ctypes call").to_dict()
    assert "prog.py:19 in bad_gather" in classify.program_cause("unknown", owner=o)
    assert classify.program_cause("unknown", owner={**o, "kind": "library"}) is None
    assert "same collectives" in classify.program_cause("collective_mismatch", owner=o)


@pytest.mark.parametrize("name,registered,kind", [
    ("out_of_bounds_cpu_embedding_real", {}, "program"), ("device_assert_embedding_cuda", {}, "program"),
    ("gemm_segfault", {}, "library"), ("seed_driver_page_fault_crash", {}, "unknown"),
    # py-spy's stacks alone (short paths) do not say whose the op is; the program's sources do
    ("host_lock_custom_op_real", {}, "unknown"),
    ("host_lock_custom_op_real", {"gpulab_fixtures": "tests/fixtures/custom_op_deadlock.py:19"}, "program"),
])
def test_the_evidence_fixtures_owner(name, registered, kind):
    fx = json.loads((EVIDENCE / f"{name}.json").read_text())
    assert owner.decide({**fx["evidence"], "class": fx["expect"]}, registered).kind == kind


# ------------------------------------------------------------------------------------ real programs, watched

FIX = Path(__file__).parent / "fixtures"
MM_LOOP = ("import torch\nw = torch.randn(16, 16)\nx = torch.randn(4, 16)\n"
           "for _ in range(5):\n    x = torch.relu(torch.addmm(x, x, w))\nprint(float(x.sum()))\n")


def _watch(tmp_path, cmd, stall_s=10.0, **kw):
    """A crash or an error ends the run by itself: a long stall window costs nothing there, and keeps a loaded
    machine's slow crash handling from reading as a hang; only the deadlock waits its window out."""
    from gpulab.fixes import suggest
    from gpulab.hang.watchdog import watch
    return watch.run(cmd, stall_s=stall_s, timeout_s=120, out_dir=tmp_path / "w", progress=lambda m: None,
                     finish=suggest.with_suggestions, **kw)


@pytest.mark.parametrize("program,status,cls,where", [
    (("own_op_segfault.py",), "crash", "unknown", "own_op_segfault.py:19 in bad_gather"),
    (("custom_op_deadlock.py", "--gil", "released"), "hang", "host_lock", "custom_op_deadlock.py:27 in locked_scale"),
    (("bad_embedding_index.py",), "error", "out_of_bounds", "bad_embedding_index.py:20"),
], ids=["segfault in its own custom op", "deadlock in its own native call", "bad index into aten.embedding"])
def test_watch_names_the_programs_own_code_and_never_sends_it_upstream(tmp_path, program, status, cls, where):
    import sys

    v = _watch(tmp_path, [sys.executable, str(FIX / program[0]), *program[1:]], 2.0 if status == "hang" else 10.0)
    assert (v.status, v.cls) == (status, cls), v.evidence
    assert v.owner["kind"] == "program" and where in v.owner["where"], v.owner
    step = owner.next_step(v.owner)
    assert where in step and "upstream" not in step
    assert not v.suggested, "a setting of a library or the platform is no fix for the program's own bug"
    saved = json.loads((tmp_path / "w" / "verdict.json").read_text())
    assert saved["owner"] == v.owner and any(e.startswith("whose code: program") for e in saved["evidence"])


def test_a_fault_planted_inside_an_aten_kernel_stays_a_librarys(tmp_path):
    """The planted segfault fires inside aten.addmm on valid inputs, called from the program's line: the kernel
    is PyTorch's, so the next step is the upstream report."""
    import sys

    prog = tmp_path / "mm_loop.py"
    prog.write_text(MM_LOOP)
    v = _watch(tmp_path, [sys.executable, str(prog)], fault="segfault:aten.addmm@2")
    assert v.status == "crash" and v.in_flight_op["name"] == "aten.addmm.default", v.evidence
    assert v.owner["kind"] == "library" and "aten.addmm" in v.owner["where"] and "PyTorch" in v.owner["where"]
    assert "upstream" in owner.next_step(v.owner) and "mm_loop.py:5" in v.owner["where"]


@pytest.mark.parametrize("name,registered,kind", [
    ("smooth_kernel_0", {"kernel:smooth_kernel": "/work/proj/train.py:12"}, "program"),   # the program's @triton.jit
    ("triton_poi_fused_relu_0", {}, "library"),                                           # Inductor generated it
    ("mystery_kernel", {}, None),                                                          # not known: not decided here
])
def test_a_kernel_launch_in_flight_is_owned_by_who_defined_it(name, registered, kind):
    from gpulab.hang.owner import kernel_owner

    v = {"status": "hang", "class": "unknown", "in_flight_op": {"name": name, "call_site": "train.py:40 in main",
                                                                "gpu_done": False}}
    got = kernel_owner(v, registered)
    assert (got.kind if got else None) == kind
    if got:
        assert "train.py:40" in got.where


# ------------------------------------------------------------------------------------ the program's own modules

def _tree(root, files):
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_the_programs_sources_follow_its_imports_into_its_own_modules(tmp_path):
    """A helper beside the script, a package under it (relative imports too), a module of the working directory;
    never an installed package, nor a module the program does not import from a folder it does not own."""
    from gpulab.hang import sources

    _tree(tmp_path, {
        "proj/train.py": "import torch\nfrom kernels import attention\nimport helper, os\nfrom shared.ops import f\n",
        "proj/helper.py": 'lib = torch.library.Library("helperns", "DEF")\n',
        "proj/kernels/__init__.py": "from .fused import go\n",
        "proj/kernels/attention.py": '@torch.library.custom_op("attnns::fwd", mutates_args=())\ndef fwd(x): ...\n',
        "proj/kernels/fused.py": '@triton.jit\ndef fused_kernel(x_ptr):\n    pass\n',
        "shared/ops.py": 'torch.library.define("sharedns::f", "(Tensor x) -> Tensor")\n',
        "shared/unused.py": 'lib = torch.library.Library("unusedns", "DEF")\n',
        "venv/lib/python3.11/site-packages/shared/ops.py": 'lib = torch.library.Library("installedns", "DEF")\n',
    })
    found = owner.registrations(sources.program(tmp_path, script="proj/train.py"))
    assert {"helperns", "attnns", "sharedns", "kernel:fused_kernel"} <= set(found), found
    assert "unusedns" not in found and "installedns" not in found
    assert found["attnns"].endswith("proj/kernels/attention.py:1")
    # python -m proj.train from the same folder: the module is the script
    assert set(owner.registrations(sources.program(tmp_path, module="proj.train"))) == set(found)
    assert sources.program(tmp_path, module="not_there") == {}


def test_watch_names_a_custom_op_registered_by_the_programs_own_module(tmp_path):
    """The op is registered in ops/locked.py, a package beside the script that it imports: whose code is the
    program, at the registration the sources show, never 'namespace not found'."""
    import sys

    v = _watch(tmp_path, [sys.executable, str(FIX / "helper_op" / "train.py")], 2.0)
    assert v.status == "hang" and v.in_flight_op["name"] == "helper_fixture.scale.default", v.evidence
    assert v.owner["kind"] == "program", v.owner
    assert "registered at ops/locked.py:9" in v.owner["where"] and "helper_fixture" in v.owner["why"], v.owner
    assert "upstream" not in owner.next_step(v.owner) and not v.suggested


def test_an_error_no_class_names_is_said_in_the_programs_own_last_words():
    # a DataLoader worker's Dataset raises: the main process re-raises it, naming the worker's frames
    tb = ('Traceback (most recent call last):\n  File "/home/u/train.py", line 11, in __getitem__\n'
          '    raise KeyError(f"sample {i} missing its label")\nKeyError: \'sample 37 missing its label\'\n')
    got = owner.decide(v(status="error", cls="unknown", stderr=tb), {})
    assert got.kind == "program" and "train.py:11 in __getitem__" in got.where, got
    assert got.why.startswith("an error (KeyError: 'sample 37 missing its label') in the program's own code"), got


@pytest.mark.parametrize("last,says", [("bdb.BdbQuit", "breakpoint()"), ("EOFError: EOF when reading a line", "input()"),
                                       ("EOFError: Ran out of input", None)])
def test_a_program_that_reads_standard_input_is_told_gpulab_gives_it_none(last, says):
    tb = f'Traceback (most recent call last):\n  File "/home/u/train.py", line 9, in <module>\n    x()\n{last}\n'
    why = owner.decide(v(status="error", stderr=tb), {}).why
    if says:
        assert says in why and "stdin is /dev/null" in why and "`gpulab watch` at a terminal" in why, why
    else:   # a pickle's EOF is no read of the terminal
        assert "stdin" not in why, why


def test_a_line_torch_compile_refuses_under_fullgraph_is_the_programs_with_dynamos_hint():
    tb = ('  File "/home/u/train.py", line 11, in forward\n    if h.mean() > 0.1:\n'
          f'  File "{SITE}/torch/_dynamo/eval_frame.py", line 1177, in compile_wrapper\n    raise e\n'
          "torch._dynamo.exc.Unsupported: Data-dependent branching\n  Hint: This graph break is fundamental - it is "
          "unlikely that Dynamo will ever be able to trace through your code.\n  Hint: Use `torch.cond` to express "
          "dynamic control flow.\n\nfrom user code:\n   File \"/home/u/train.py\", line 11, in forward\n\n"
          "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace\n")
    got = owner.decide(v(status="error", stderr=tb), {})
    assert got.kind == "program" and "train.py:11" in got.where, got
    assert "Data-dependent branching" in got.why and "torch.cond" in got.why and "fullgraph=True" in got.why, got.why


FUNCTION_SRC = '''import torch


class RowScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        return x * w

    @staticmethod
    def backward(ctx, gy):
        return gy


def train():
    pass
'''


@pytest.mark.parametrize("message,words", [
    ("RuntimeError: function RowScaleBackward returned an incorrect number of gradients (expected 2, got 1)",
     "returns 1 gradient(s) where forward takes 2 input(s)"),
    ("RuntimeError: Function RowScaleBackward returned an invalid gradient at index 1 - got [8] but expected shape "
     "compatible with [16]", "at index 1 does not fit forward's input 1 (got [8] but expected shape"),
])
def test_what_autograd_refuses_from_a_programs_function_is_named_at_its_backward(message, words):
    registered = owner.registrations({"/home/u/train.py": FUNCTION_SRC})
    assert registered["function:RowScale"] == "/home/u/train.py:10", registered
    tb = ('Traceback (most recent call last):\n  File "/home/u/train.py", line 30, in <module>\n    loss.backward()\n'
          f'  File "{SITE}/torch/autograd/graph.py", line 829, in _engine_run_backward\n    return Variable._exec\n'
          f"{message}\n")
    verdict = v(status="error", cls="refused_call", stderr=tb,
                in_flight=op("autograd::engine::evaluate_function: RowScaleBackward", site="train.py:30 in <module>"))
    got = owner.decide(verdict, registered)
    assert got.kind == "program" and got.where.startswith("u/train.py:10 (RowScale.backward"), got
    assert words in got.why, got.why
    # the same where the op in flight is not autograd's node (a build that marks no raised op: backward()'s last)
    plain = v(status="error", cls="refused_call", stderr=tb, in_flight=op("aten.mul.Tensor", site="train.py:30"))
    assert owner.decide(plain, registered).where.startswith("u/train.py:10 (RowScale.backward"), plain
    # a Function the program's sources do not define (a package's): the backward() call, as before
    other = owner.decide(verdict, {})
    assert other.kind == "program" and "train.py:30" in other.where and "RowScale.backward" not in other.where, other


HOOK_SRC = '''import torch
model = torch.nn.Linear(16, 4)


def clip_rows(grad):
    return grad[:2]


model.weight.register_hook(clip_rows)
model.register_forward_hook(lambda m, i, o: o)
'''


def test_a_gradient_hook_returning_another_size_is_named_at_the_hook_not_at_backward():
    registered = owner.registrations({"/home/u/train.py": HOOK_SRC})
    assert registered["hook:clip_rows"] == "/home/u/train.py:5", registered
    tb = ('Traceback (most recent call last):\n  File "/home/u/train.py", line 17, in <module>\n    loss.backward()\n'
          "RuntimeError: hook 'clip_rows' has changed the size of value\n")
    verdict = v(status="error", cls="refused_call", stderr=tb, in_flight=op(
        "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", site="train.py:17 in <module>",
        **{"pass": 4}))
    got = owner.decide(verdict, registered)
    assert got.kind == "program" and got.where.startswith("u/train.py:5 (clip_rows, a hook"), got
    assert "returns None (to keep the gradient) or a tensor of the same shape" in got.why, got.why
    plain = v(status="error", cls="refused_call", stderr=tb, in_flight=op("aten.mul.Tensor", site="train.py:17"))
    assert owner.decide(plain, registered).where.startswith("u/train.py:5 (clip_rows"), plain
    # the 4th AccumulateGrad of one backward is the 4th parameter, not a line called a 4th time
    assert "4th call" not in got.why
    assert "4th call" not in owner.decide(verdict, {}).why


@pytest.mark.parametrize("cls,role", [("worker_stuck", "DataLoader worker 0"), ("child_stuck", "child pid 9"),
                                      ("rank_stuck", "rank 1/2")])
def test_a_process_forked_holding_a_lock_is_the_programs_fork_whatever_it_is_to_the_job(cls, role):
    """A DataLoader worker, a child the program waits for and a rank started by fork alike: the lock its parent's
    thread held at fork() is the cause, and the words say how to change the program."""
    row = {"role": role, "frame": "u/train.py:31 in __getitem__", "started_by": "fork", "lock_alone": True,
           "own_code": True, "open_op": None, "wait": "lock", "collective": None}
    got = owner.decide(v(status="hang", cls=cls, culprit=role, processes=[row]), {})
    assert got.kind == "program" and "u/train.py:31" in got.where, got
    assert "it was forked while another thread of its parent held that lock" in got.why, got
    assert "program's own code" in owner.next_step(got)
