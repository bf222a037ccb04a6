"""``python -m cursorsync``, and the file spark-submit runs as the job's driver
(``spark-submit .../cursorsync/__main__.py run -c FILE``)."""

import os
import sys

if not __package__:
    # Run as a file, this folder is sys.path[0]: cursorsync's own subpackages (pulsar,
    # tables) would shadow the top-level packages of the same names.
    _here = os.path.dirname(os.path.realpath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _here]

from cursorsync.app.cli import main

if __name__ == "__main__":
    main()
