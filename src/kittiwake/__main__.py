"""``python -m kittiwake`` is the ``kittiwake`` command."""

import sys

from kittiwake.cli import main

sys.exit(main())
