"""Shared by the training tests: a whole short training run as one compiled `lax.scan`."""

import jax
import optax


def scan_train(loss_fn, params, tx: optax.GradientTransformation, steps: int):
  """Trains `params` with `tx` for `steps` updates inside one jitted scan (the backward pass compiles once).

  loss_fn(params) -> (loss, aux). Without dropout the loss of scan entry k is the loss of the parameters before
  update k, so `losses[0]` is the untrained loss and `losses[steps]` the loss after all updates.
  Returns (losses `[steps + 1]`, aux of the last entry, i.e. of the trained parameters).
  """

  @jax.jit
  def run(params):
    def body(carry, _):
      params, opt_state = carry
      (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
      updates, opt_state = tx.update(grads, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state), (loss, aux)

    _, (losses, aux) = jax.lax.scan(body, (params, tx.init(params)), None, length=steps + 1)
    return losses, jax.tree.map(lambda x: x[-1], aux)

  return run(params)
