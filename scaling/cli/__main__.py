"""`python -m scaling.cli VERB ...`: the same as the `scaling` command."""

import sys

from scaling.cli import main

sys.exit(main())
