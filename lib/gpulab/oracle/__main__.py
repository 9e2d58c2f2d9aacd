from gpulab.oracle import _main

raise SystemExit(_main())
