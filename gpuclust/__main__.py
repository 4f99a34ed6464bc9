"""``python -m gpuclust`` is the ``gpuclust`` command."""

import sys

from gpuclust.cli import main

sys.exit(main())
