"""The workload toolkit: the contract every workload keeps (``base``), the trial template
(``template``), the Triton kernel and multi-GPU rank workloads built on it (``kernel``, ``rank``), the
stopwatch (``measure``), failure statuses (``failures``), the device fingerprint (``fingerprint``), peak
figures (``roofline``) and the names of the project's workloads (``registry``, imported lazily). Imports
``tuner.study`` only, never a particular workload."""
