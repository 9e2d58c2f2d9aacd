"""Do two runs of a program compute the same numbers, and if not, which op first makes them differ?
(`gpulab compare`; notebook 05's user-program question.) Above the fixes in the layer order, beside the
oracle and the benchmark.

    names      what the child's recorder and the parent share (torch-free)
    record     the child's recorder: a fingerprint of every floating output, no host sync per op
    tolerance  assert_close's tolerances by dtype (pure)
    figures    two fingerprints compared: bitwise, within tolerance, error figures (pure)
    align      two runs' ops side by side (pure)
    judge      agree / diverged (the op that introduces it) / unaligned (pure)
    replay     the diverging op alone, against float64: which run is right
    compare    both runs as gpulab.proc children, the verdict, `run(...) -> Comparison` for the notebook
    commands   `gpulab compare`
    variants   notebook 05's `compare=` choices: the two commands for the workload, or why none apply (pure)
    view       notebook 05's plot of the error along the run and table of the first diverging ops

Importing this package imports neither torch nor a submodule.
"""
