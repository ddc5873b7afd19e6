"""Learning rate tuned per attention variant, then final seeds, with real statistics.

The command line of :mod:`diffzoo.study.sweep` (``python -m recipes.sweep --help`` describes it); the
families, runs, tables and plots it uses are in :mod:`diffzoo.study`.
"""

from diffzoo.study.runs import main_with_signals
from diffzoo.study.sweep import main

if __name__ == "__main__":
    main_with_signals(main)  # SIGTERM and Ctrl-C stop its trainings too; SIGUSR1 lets the running ones finish first
