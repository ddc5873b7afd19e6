"""The whole study, cell by cell, resumable across sessions, and its headline table.

The command line of :mod:`diffzoo.study.plan` (``python -m recipes.study --help`` describes it).
"""

from diffzoo.study.plan import main

if __name__ == "__main__":
    main()
