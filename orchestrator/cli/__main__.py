"""``python -m orchestrator.cli``: the ``petri`` command."""
import sys

from orchestrator.cli import main

sys.exit(main())
