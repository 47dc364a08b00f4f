"""``python -m rlmoptimizer.sandbox``: see :mod:`rlmoptimizer.sandbox.check`."""

import sys

from rlmoptimizer.sandbox.check import main

sys.exit(main())
