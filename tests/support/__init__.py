"""How colo-fsm proves itself: the project's own proof kit, not part of the installed package.

* :mod:`tests.support.mutants`: the mutation proof (each lifecycle bug, applied on purpose, and what catches it);
* :mod:`tests.support.faults`: fault injection at every action, on thread ranks and real gloo processes;
* :mod:`tests.support.properties`: property checks of colo-fsm's own components (latch, in-flight cap,
  parallelism check, wall-clock metrics, replay buffer, the megatron dual-mode opt-in);
* :mod:`tests.support.saturation`: control-call latency on a Ray worker saturated with rollouts;
* :mod:`tests.support.report`: where the tests record what they measured (only when asked).

Importable with the repository root on ``sys.path``: pytest puts it there (``pythonpath`` in pyproject.toml);
``scripts/`` and ``bench/`` insert it themselves.
"""
