"""Parameter importances from Optuna's PED-ANOVA evaluator (no scikit-learn needed)."""

from __future__ import annotations

import math
import warnings

from tuner.export import objectives_of
from tuner.storage import StudyDB, StudyRow

MIN_TRIALS = 4


def importances(db: StudyDB, row: StudyRow) -> dict[str, float]:
    """Importance of each Optuna param for the first objective over feasible ``ok`` trials; {} when too few."""
    import optuna

    trials = [t for t in db.trials(row.id) if t.status == "ok" and t.feasible and t.duplicate_of is None]
    if len(trials) < MIN_TRIALS:
        return {}
    try:
        study = optuna.load_study(study_name=row.optuna_name, storage=db.url)
    except KeyError:
        return {}
    metric, direction = objectives_of(row)[0]
    values = {t.number: t.metrics.get(metric) for t in trials}
    frozen = [
        optuna.trial.create_trial(params=f.params, distributions=f.distributions, value=values[f.number])
        for f in study.get_trials(deepcopy=False)
        if values.get(f.number) is not None and f.params
    ]
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
