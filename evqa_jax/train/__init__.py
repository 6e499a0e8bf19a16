"""Training: `train_and_evaluate(config, workdir)`."""


def train_and_evaluate(config, workdir: str):
  from evqa_jax.train.trainer import train_and_evaluate as _impl  # lazy: keeps `import evqa_jax.train` light
  return _impl(config, workdir)
