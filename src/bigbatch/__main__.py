"""`python -m bigbatch` (and `torchrun -m bigbatch`)."""

import sys

from bigbatch.commands import main

sys.exit(main())
