"""The report room: metrics trackers and the completions log (:mod:`.tracking`), the progress line
(:mod:`.progress`) and the curves (:mod:`.plot`). Imports only :mod:`policyzoo.engine.rundir` and
:mod:`policyzoo.engine.dist` of the engine."""
