"""The run room: the ``policyzoo train`` entry (:mod:`.train`), the run's parts, checked and started
(:mod:`.session`), the step loop (:mod:`.loop`), resume rules (:mod:`.resume`), every pre-run
check (:mod:`.checks`), start-up helpers (:mod:`.startup`) and SIGINT / SIGTERM at start-up and at exit
(:mod:`.interrupts`)."""
