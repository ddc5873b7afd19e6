"""Learning rate tuned per attention variant, then final seeds, with real statistics.

The command line of :mod:`diffzoo.study.sweep` (``python -m recipes.sweep --help`` describes it); the
families, runs, tables and plots it uses are in :mod:`diffzoo.study`.
"""

import signal

from diffzoo.study.runs import stop_trainings
from diffzoo.study.sweep import main

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, stop_trainings)  # a kill of this process stops its trainings too
    main()
