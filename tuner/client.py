"""The best-config registry client for users' code (:mod:`tuner.best_configs.client`): ``from tuner.client import
best_config``."""

from tuner.best_configs.client import *  # noqa: F403
