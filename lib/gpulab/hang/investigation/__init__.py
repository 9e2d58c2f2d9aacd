"""Notebook 03's investigation of a failing workload: the ladder of rungs, the bisection, the op-log repro,
the upstream bundle, a watch's capture read back (caught), their command lines and views."""
