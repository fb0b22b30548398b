"""The best-config registry: its entries (``registry``), the warm start of a study from them
(``warm_start``), the scheduled recheck of published entries (``recheck``) and the registry client for
users' code (``client``, standard library only, re-exported as ``tuner.client``). Imports
``tuner.store``, ``tuner.results``, ``tuner.workloads`` and ``tuner.study``. Nothing is imported here, so
``import tuner.client`` stays light."""
