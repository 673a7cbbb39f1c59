"""``python -m te_cudnn``: the ``te-cudnn`` command line (see :mod:`te_cudnn.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
