"""`python -m sim.cli ...` (what torchrun starts) is `moesim ...`."""

import sys

from sim.cli import main

sys.exit(main())
