"""A study's results: the Pareto front and the default pick (``pareto``) and the export of the
chosen config in the forms user code consumes (``export``). Imports ``tuner.store``, ``tuner.workloads``
and ``tuner.study``."""
