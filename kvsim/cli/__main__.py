"""``python -m kvsim.cli``: the same as the ``kvsim`` command."""
import sys

from kvsim.cli import main

sys.exit(main())
