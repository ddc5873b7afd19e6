"""The study harness: attention variants compared on several tasks, each at its own tuned learning rate.

* :mod:`~diffzoo.study.families`: the tasks (a recipe each), the arguments selecting each variant, metrics.
* :mod:`~diffzoo.study.runs`: trainings as fresh ``python -m <recipe>`` processes, and finished runs read back.
* :mod:`~diffzoo.study.tables`: best learning rates, comparisons with Welch / permutation / Holm statistics,
  ablations, untrained scores, the per-clip speech statistics, and their markdown tables.
* :mod:`~diffzoo.study.plots`: mean curves and knob plots.
* :mod:`~diffzoo.study.sweep`: the command line (``python -m recipes.sweep``) that ties them together.

Nothing here imports Lightning at module level: the trainings run in their own processes.
"""

from .families import FAMILIES, Family, metric_value, run_name
from .tables import ablation_rows, best_lrs, chance_rows, comparison_rows, speech_voice_stats, stats_table

__all__ = ["FAMILIES", "Family", "ablation_rows", "best_lrs", "chance_rows", "comparison_rows", "metric_value",
           "run_name", "speech_voice_stats", "stats_table"]
