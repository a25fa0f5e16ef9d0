"""MovieLens: biased matrix factorisation with genre-aware movie vectors, for ratings (RMSE) or clicks (AUC)."""

from modelzoo.movielens.model import RECIPE, model_fn

__all__ = ["RECIPE", "model_fn"]
