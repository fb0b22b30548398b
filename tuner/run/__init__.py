"""Running studies: the runner that claims queued studies (``service``) and its supervisor
(``supervisor``), the orchestrator of one study (``orchestrator``) and its session with the database
(``session``), the Ray worker pool (``worker_pool``), a trial worker (``worker``), multi-GPU gangs
(``gang``, ``gang_rank``) and the runner's scheduled jobs (``jobs``). Imports every layer below it, never
``tuner.cli`` or ``api``."""
