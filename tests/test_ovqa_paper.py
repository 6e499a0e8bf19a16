"""The OVQA paper's tables as commands: the two published truths (`:paper`, `:released`), the zero-shot guard, the
OVQA release layout (its own CSVs, subtitles) and OVQA-trained checkpoints (release fixtures: data_prep/fixtures.py).
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import ovqa_msrvtt
from evqa_jax.train import partition

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------- the two published truths

def their_lrs(lr, total, warmup_fraction=0.1):
  """The lr each optimizer.step() of mlvlab/OVQA train.py runs at, for param_groups[0]: the Adam's initial lr at
  step 0, then util/misc.py adjust_learning_rate(curr_step = s - 1), which train.py calls after each step."""
  warm = round(warmup_fraction * total)

  def gamma(step):
    if step < warm:
      return step / max(1, warm)
    return max(0.0, (total - step) / max(1, total - warm))

  return [lr] + [lr * gamma(s - 1) for s in range(1, total)]


def _update_sizes(optim_config, total):
  """Per step, the size of Adam's update of a constant gradient (= the lr that step ran at, Adam normalising the
  gradient away) for a verbalizer weight and an adapter weight."""
  tx, schedule = partition.make_optimizer(optim_config, total)
  params = {"verbalizer": {"gat_0": {"w_dst": jnp.zeros((2, 2))}},
            "lm": {"layer_0": {"adapter": {"kernel": jnp.zeros((3,))}}}}
  grads = jax.tree.map(lambda x: jnp.full(x.shape, 0.5), params)
  state = tx.init(params)
  sizes = {"verbalizer": [], "adapter": []}
  update = jax.jit(tx.update)
  for _ in range(total):
    updates, state = update(grads, state, params)
    sizes["verbalizer"].append(float(-updates["verbalizer"]["gat_0"]["w_dst"][0, 0]))
    sizes["adapter"].append(float(-updates["lm"]["layer_0"]["adapter"]["kernel"][0]))
  return sizes, [float(schedule(s)) for s in range(total)]


def test_paper_and_released_learning_rates():
  total, lr = 20, 5e-5
  paper = ovqa_msrvtt.get_config()
  assert ovqa_msrvtt.get_config("paper").to_dict() == paper.to_dict()  # the default, named
  released = ovqa_msrvtt.get_config("released")
  assert ovqa_msrvtt.get_config("authors_eps").to_dict() == released.to_dict()  # the old name, kept
  assert (paper.verbalizer.eps_base_fixed, released.verbalizer.eps_base_fixed) == (False, True)
  assert paper.verbalizer.eps == released.verbalizer.eps == 0.7

  ours = [lr * s / 2 for s in range(2)] + [lr * (total - s) / (total - 2) for s in range(2, total)]
  sizes, schedule = _update_sizes(paper.optim, total)
  np.testing.assert_allclose(schedule, ours, rtol=1e-6)
  for group in ("verbalizer", "adapter"):  # one schedule for every trainable parameter
    np.testing.assert_allclose(sizes[group], ours, rtol=1e-5, atol=1e-12)

  sizes, schedule = _update_sizes(released.optim, total)
  theirs = their_lrs(lr, total)
  assert theirs[:4] == pytest.approx([5e-5, 0.0, 2.5e-5, 5e-5])
  np.testing.assert_allclose(schedule, theirs, rtol=1e-6)
  for group in ("verbalizer", "adapter"):  # their GNN weights (gnn1/gnn2) sit in param_groups[0] too
    np.testing.assert_allclose(sizes[group], theirs, rtol=1e-5, atol=1e-12)


def test_constant_lr_params():
  """optim.constant_lr_params: the named parameters train at the constant peak lr, the rest on the schedule."""
  total, lr = 10, 5e-5
  config = ovqa_msrvtt.get_config()
  config.optim.constant_lr_params = ("verbalizer",)
  sizes, schedule = _update_sizes(config.optim, total)
  np.testing.assert_allclose(sizes["verbalizer"], [lr] * total, rtol=1e-5)
  np.testing.assert_allclose(sizes["adapter"], schedule, rtol=1e-5, atol=1e-12)
  assert schedule[0] == 0.0 and schedule[1] == pytest.approx(lr)  # warm-up of 1 step, then linear decay
  config.optim.constant_lr_params = ("verbalizer", "gat$")
  with pytest.raises(ValueError, match=r"config.optim.constant_lr_params = \('verbalizer', 'gat\$'\): \['gat\$'\] "
                                       r"match\(es\) no trainable parameter"):
    _update_sizes(config.optim, total)
