"""The whole study, cell by cell, resumable across sessions, and its headline table.

The command line of :mod:`diffzoo.study.plan` (``python -m recipes.study --help`` describes it).
"""

import signal

from diffzoo.study.plan import main
from diffzoo.study.runs import stop_trainings

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, stop_trainings)  # a kill of this process stops its trainings too
    main()
