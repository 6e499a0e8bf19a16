"""evqa-jax: open-vocabulary, inference and evidence-backed video QA in JAX/Flax."""

__version__ = "0.1.0"
