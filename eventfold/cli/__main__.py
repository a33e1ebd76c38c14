"""``python -m eventfold.cli``: the same as the ``eventfold`` command."""

import sys

from eventfold.cli import main

sys.exit(main())
