"""`python -m attrgraph.cli ...`: the `attrgraph` command without its console script."""

import sys

from attrgraph.cli import main

sys.exit(main())
