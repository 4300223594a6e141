"""``python -m capi_gpu.cli`` (what the dev world and e2e use to start the operator)."""

import sys

from capi_gpu.cli import main

sys.exit(main())
