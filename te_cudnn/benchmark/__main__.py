import sys

from ..pipes import quiet_broken_pipe
from .cli import main

sys.exit(quiet_broken_pipe(main))
