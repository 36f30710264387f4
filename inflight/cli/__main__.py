"""`python -m inflight.cli ...`: the same as the `inflight` command."""

import sys

from inflight.cli.main import main

sys.exit(main())
