"""``python -m te_cudnn.cli``: the ``te-cudnn`` command line (see :mod:`te_cudnn.cli.main`)."""

import sys

from .main import main

if __name__ == "__main__":
    sys.exit(main())
