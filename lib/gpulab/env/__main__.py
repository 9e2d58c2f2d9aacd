import sys

from gpulab import proc
from gpulab.env.cli import main

# An interrupt stops the probe children and exits 128+signal, as `gpulab env` does.
raise SystemExit(proc.main_guarded("gpulab env", lambda session, argv: main(argv), sys.argv[1:]))
