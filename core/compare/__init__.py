"""policyzoo.compare: algorithms x seeds on one task, one table with 95% intervals, one plot.

``policyzoo compare`` (:mod:`.cli`) and :func:`policyzoo.compare` (:mod:`.api`). Parts: :mod:`.entries`
(``--algos`` entries such as ``grpo+clip=cispo``, the seeds, a run's algorithm label), :mod:`.runs`
(the planned runs and their folders' status), :mod:`.launch` (the trainings as subprocesses, Ctrl-C),
:mod:`.rundirs` (reading run directories), :mod:`.aggregate` (comparability and the statistics),
:mod:`.intervals` (the t-interval), :mod:`.report` (compare.md, compare.json, the table) and
:mod:`.plot` (compare.png). Guide: ``docs/compare.md``.
"""

from .api import compare

__all__ = ["compare"]
