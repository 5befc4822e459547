"""``python -m trainscale.interface.cli``: the ``trainscale`` command."""

import sys

from . import main

sys.exit(main())
