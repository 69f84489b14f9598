"""`python -m fleetsim`: see fleetsim.demo."""

from fleetsim.demo import main

raise SystemExit(main())
