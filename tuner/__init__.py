"""The autotuning service: a study (``tuner.study``) of a workload (``tuner.workloads``) is stored
(``tuner.store``), searched (``tuner.strategy``) and run on workers (``tuner.run``); its results
(``tuner.results``) feed the best-config registry (``tuner.best_configs``); ``tuner.cli`` is the command
line. Imports point down only: cli -> run -> strategy, workloads, results, best_configs -> store -> study.
``tuner.client`` is the registry client for users' code (standard library only)."""
