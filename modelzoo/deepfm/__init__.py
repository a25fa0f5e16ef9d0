"""DeepFM (Guo et al. 2017): first-order terms, FM second-order term and a DNN on shared embeddings."""

from modelzoo.deepfm.model import RECIPE, model_fn

__all__ = ["RECIPE", "model_fn"]
