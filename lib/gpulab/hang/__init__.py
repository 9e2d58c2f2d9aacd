"""Notebook 03's question: does the workload hang, in which op, and why?

`watch` runs a program under the watchdog and returns a verdict; `faults` plants real faults for drills;
`capture` takes the evidence; `classify` turns evidence into a class that cites it.
"""
