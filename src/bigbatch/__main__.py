"""`python -m bigbatch` (and `torchrun -m bigbatch`)."""

import sys

from bigbatch.cli import main

sys.exit(main())
