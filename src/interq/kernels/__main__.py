"""``python -m interq.kernels``: build (or load) the CPU kernels now and print their status."""

import sys

from interq.kernels import main

sys.exit(main())
