"""Parameter importances from Optuna's PED-ANOVA evaluator (no scikit-learn needed), on a scratch study
built from the trial table."""

from __future__ import annotations

import math
import warnings

from tuner.export import objectives_of
from tuner.storage import StudyDB, StudyRow

MIN_TRIALS = 4


def importances(db: StudyDB, row: StudyRow) -> dict[str, float]:
    """Importance of each Optuna param for the first objective over feasible ``ok`` trials; {} when too few."""
    import optuna

    from tuner.sampler_adapter import ParamEncoder
    from tuner.space import compile_space

    trials = [t for t in db.trials(row.id) if t.status == "ok" and t.feasible and t.duplicate_of is None]
    if len(trials) < MIN_TRIALS:
        return {}
    metric, direction = objectives_of(row)[0]
    encoder = ParamEncoder(compile_space(row.space))  # the params as the sampler saw them (pow2 as log2)
    frozen = []
    for t in trials:
        value = t.metrics.get(metric)
        params, distributions = encoder.encode(t.params)
        if value is not None and params:
            frozen.append(optuna.trial.create_trial(params=params, distributions=distributions, value=value))
    if len(frozen) < MIN_TRIALS:
        return {}
    scratch = optuna.create_study(direction=direction)
    scratch.add_trials(frozen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            raw = optuna.importance.get_param_importances(
                scratch, evaluator=optuna.importance.PedAnovaImportanceEvaluator()
            )
        except (ValueError, RuntimeError, ZeroDivisionError):
            return {}
    return {name.removesuffix("__log2"): float(v) for name, v in raw.items() if math.isfinite(v)}
