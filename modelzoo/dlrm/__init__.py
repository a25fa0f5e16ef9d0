"""DLRM (Naumov et al. 2019): bottom MLP, one table per categorical feature, dot interaction, top MLP."""

from modelzoo.dlrm.model import RECIPE, model_fn

__all__ = ["RECIPE", "model_fn"]
