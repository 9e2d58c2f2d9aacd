from gpulab.env import main

raise SystemExit(main())
