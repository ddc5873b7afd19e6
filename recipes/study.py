"""The whole study, cell by cell, resumable across sessions, and its headline table.

The command line of :mod:`diffzoo.study.plan` (``python -m recipes.study --help`` describes it).
"""

from diffzoo.study.plan import main
from diffzoo.study.runs import main_with_signals

if __name__ == "__main__":
    main_with_signals(main)  # SIGTERM and Ctrl-C stop its trainings too; SIGUSR1 lets the running ones finish first
