"""The train state and the jitted steps: state created already sharded, `StepFns` (train / eval / eval-loss steps).

Parameters are created already sharded (eval_shape -> logical partition specs -> mesh shardings -> jit(init,
out_shardings)); `abstract_train_state` gives the same tree as ShapeDtypeStructs for AOT compile checks. The train
step is jitted with donated state.
"""

import contextlib

import flax.linen as nn
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
import optax

from evqa_jax.train import partition, sharding


class StepFns:
  """The jitted train and eval steps of a task on a mesh."""

  def __init__(self, task, tx, mesh, rules, state_shardings, batch_shard, aux_shardings):
    self.task = task
    repl = sharding.replicated(mesh)

    def train_step(state, batch, aux, seed):
      rng = jax.random.fold_in(jax.random.key(seed), state["step"])

      def loss_fn(trainable):
        params = partition.merge_params(trainable, state["frozen"])
        return task.loss(params, batch, aux, rng, train=True)

      (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["trainable"])
      updates, opt_state = tx.update(grads, state["opt_state"], state["trainable"])
      trainable = jax.tree.map(jnp.add, state["trainable"], updates)
      metrics = dict(metrics, loss=loss, grad_norm=optax_global_norm(grads))
      new_state = dict(state, step=state["step"] + 1, trainable=trainable, opt_state=opt_state)
      return new_state, metrics

    def eval_step(state, batch, aux):
      params = partition.merge_params(state["trainable"], state["frozen"])
      out = task.predict(params, batch, aux)
      out["index"] = batch["index"]
      out["_valid"] = batch["_valid"]
      return out

    def eval_loss_step(state, batch, aux):
      params = partition.merge_params(state["trainable"], state["frozen"])
      loss, metrics = task.loss(params, batch, aux, jax.random.key(0), train=False)
      return dict(metrics, loss=loss)

    self.mesh = mesh
    self.rules = sharding.rules_tuple(rules)
    # The seed is an input of the compiled step, not a constant in it: runs that differ only in their seed share one
    # executable (a sweep's seeds hit the persistent compilation cache), with the same random bits as a constant.
    self.train_step = SeededStep(
        jax.jit(train_step, donate_argnums=0, in_shardings=(state_shardings, batch_shard, aux_shardings, repl),
                out_shardings=(state_shardings, repl)),
        task.config.seed)
    self.eval_step = jax.jit(eval_step, in_shardings=(state_shardings, batch_shard, aux_shardings),
                             out_shardings=repl)
    self.eval_loss_step = jax.jit(eval_loss_step, in_shardings=(state_shardings, batch_shard, aux_shardings),
                                  out_shardings=repl)

  def context(self):
    """The mesh and logical axis rules under which the steps are traced (and must be called).

    Under the context mesh every `with_logical_constraint` in the modules is a real sharding constraint on the
    activations (the encoders' [batch, length, embed] states, the verbalizer's [nodes, embed] states, ...);
    parameters, batches and outputs carry explicit shardings besides. Frozen parameters are passed through the step
    untouched (no gradient, no optimiser state), so they keep their values bit for bit on any mesh.
    """
    return mesh_context(self.mesh, self.rules)


class SeededStep:
  """`step(state, batch, aux)` (and `.lower` with the same arguments) of a jitted `f(state, batch, aux, seed)`."""

  def __init__(self, jitted, seed: int):
    if not np.iinfo(np.int32).min <= int(seed) <= np.iinfo(np.int32).max:
      raise ValueError(f"config.seed = {seed} does not fit in int32 (jax.random.key's seed range without x64)")
    self.jitted, self.seed = jitted, np.int32(seed)

  def __call__(self, state, batch, aux):
    return self.jitted(state, batch, aux, self.seed)

  def lower(self, state, batch, aux):
    return self.jitted.lower(state, batch, aux, self.seed)


@contextlib.contextmanager
def mesh_context(mesh, rules):
  """`jax.set_mesh(mesh)` + `nn.logical_axis_rules(rules)`: what big_vision and MaxText wrap every step in."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.rules_tuple(rules)):
    yield


def optax_global_norm(tree):
  leaves = jax.tree.leaves(tree)
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves)) if leaves else jnp.zeros(())


def create_state(task, config, mesh, tx):
  """Sharded initial train state {step, trainable, frozen, opt_state} and its shardings (nothing pretrained yet)."""
  rules = sharding.rules_tuple(config.logical_axis_rules)
  rng = jax.random.key(config.seed)
  with nn.logical_axis_rules(rules):
    abstract = jax.eval_shape(task.init_params, rng)
    param_shardings = frozen_fsdp(sharding.tree_shardings(abstract, mesh, rules), abstract, task, config)
    params = jax.jit(lambda r: nn.meta.unbox(task.init_params(r)), out_shardings=param_shardings)(rng)
  trainable, frozen = partition.split_params(params, task.trainable_patterns)
  frozen = frozen_storage(frozen, config)
  opt_state = jax.jit(tx.init, out_shardings=opt_state_shardings(tx, trainable, mesh))(trainable)
  step = jax.jit(lambda: jnp.zeros((), jnp.int32), out_shardings=sharding.replicated(mesh))()
  state = {"step": step,
           "trainable": trainable, "frozen": frozen, "opt_state": opt_state}
  return state, jax.tree.map(lambda x: x.sharding, state)


def frozen_fsdp(param_shardings, abstract, task, config):
  """`param_shardings` with the frozen parameters' also split over the data axis when `config.frozen_fsdp`
  (`sharding.fsdp_sharding`): a frozen LM held once per data shard instead of once per device. The values and the
  step's results are the same; XLA gathers each weight where a layer uses it."""
  if not config.frozen_fsdp:
    return param_shardings
  shapes = jax.tree.map(lambda x: x.shape, nn.meta.unbox(abstract))
  trainable, frozen = partition.split_params(param_shardings, task.trainable_patterns)
  _, frozen_shapes = partition.split_params(shapes, task.trainable_patterns)
  frozen = jax.tree.map(lambda s, shape: sharding.fsdp_sharding(s, shape, "data"), frozen, frozen_shapes,
                        is_leaf=lambda x: isinstance(x, jax.sharding.NamedSharding))
  return partition.merge_params(trainable, frozen)


def frozen_storage(frozen, config):
  """Frozen parameters (arrays or ShapeDtypeStructs) in `config.frozen_param_dtype`; integer leaves untouched.

  bfloat16 halves the HBM of a frozen LM. The layers cast their weights to the compute dtype (config.model.dtype),
  so a float32 run with bf16-stored frozen weights computes in float32 from bf16-rounded weights.
  """
  if config.frozen_param_dtype not in ("float32", "bfloat16"):
    raise ValueError(f"config.frozen_param_dtype = {config.frozen_param_dtype!r}: expected float32 or bfloat16")
  dtype = jnp.dtype(config.frozen_param_dtype)

  def cast(x):
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype == dtype:
      return x
    if isinstance(x, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct(x.shape, dtype, sharding=x.sharding)
    return x.astype(dtype)

  return jax.tree.map(cast, frozen)


def opt_state_shardings(tx, trainable, mesh):
  """Optimiser-state shardings: moments sharded like their parameters, counters replicated on the whole mesh.

  (Left to propagation, state that does not depend on the parameters' values, such as Adam's zero moments and
  step count, would land on one local device, which a multi-process step rejects.)
  """
  abstract = jax.eval_shape(tx.init, trainable)
  return optax.tree_map_params(tx, lambda _, s: s, abstract, jax.tree.map(lambda x: x.sharding, trainable),
                               transform_non_params=lambda _: sharding.replicated(mesh))


def load_pretrained_into(state, task, shardings):
  """Fills trainable/frozen params from the task's pretrained weights (host side, then back to global arrays)."""
  params = partition.merge_params(state["trainable"], state["frozen"])
  host = jax.tree.map(lambda x: np.asarray(jax.device_get(x)) if x.is_fully_addressable else
                      np.asarray(multihost_utils.process_allgather(x, tiled=True)), params)
  host = task.load_pretrained(host)
  trainable, frozen = partition.split_params(host, task.trainable_patterns)
  return put_params(state, trainable, frozen, shardings)


def put_params(state, trainable, frozen, shardings):
  """The state with its trainable/frozen parameters replaced by host (numpy) trees of the same structure."""
  # Pretrained weights arrive in float32: store them in the state's dtypes (config.frozen_param_dtype).
  trainable, frozen = (jax.tree.map(lambda x, ref: np.asarray(x).astype(ref.dtype), tree, state[part])
                       for tree, part in ((trainable, "trainable"), (frozen, "frozen")))
  state = dict(state)
  state["trainable"] = sharding.host_to_global(trainable, shardings["trainable"])
  state["frozen"] = sharding.host_to_global(frozen, shardings["frozen"])
  return state


def aux_shardings_for(task, mesh, rules, aux):
  """Shardings of a tree of the task's aux inputs (numpy arrays or ShapeDtypeStructs): its logical specs, or
  replicated."""
  aux_specs = task.aux_logical_axes(aux)
  if aux_specs is None:
    return jax.tree.map(lambda _: sharding.replicated(mesh), aux)
  return jax.tree.map(lambda s: sharding.logical_sharding(s, mesh, rules), aux_specs,
                      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))


class StepAux:
  """The aux inputs the steps read, on the mesh: a split's `task.aux_inputs(split)` (host numpy), and with
  `task.precomputes_aux` what `task.precompute_aux` makes of it with the frozen parameters (jitted once, under the
  mesh and rules, its result sharded by the task's logical specs like any aux input).

  Built from the train split's aux inputs and the state's shapes (the state may still be the initial or abstract
  one); called with the state as loaded or restored, so a resumed run precomputes from its restored frozen
  parameters. Every split's aux inputs have the same shapes (one compiled step serves all), so one program serves
  all splits. `shardings` are the steps' aux in_shardings; `abstract` their ShapeDtypeStructs (AOT compiles).
  """

  def __init__(self, task, mesh, rules, state, state_shardings, train_aux):
    self.task, self.mesh, self.rules = task, mesh, rules
    self.input_shardings = aux_shardings_for(task, mesh, rules, train_aux)
    self.precomputes = bool(task.precomputes_aux)
    if not self.precomputes:
      self.shardings = self.input_shardings
      shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), train_aux)
    else:
      with mesh_context(mesh, rules):
        shapes = jax.eval_shape(task.precompute_aux, state["frozen"], train_aux)
      self.shardings = aux_shardings_for(task, mesh, rules, shapes)
      self._precompute = jax.jit(task.precompute_aux, in_shardings=(state_shardings["frozen"], self.input_shardings),
                                 out_shardings=self.shardings)
    self.abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes,
                                 self.shardings)

  def __call__(self, state, aux):
    """A split's host aux inputs -> the global arrays the steps read (precomputed from `state["frozen"]`)."""
    aux = sharding.host_to_global(aux, self.input_shardings)
    if not self.precomputes:
      return aux
    with mesh_context(self.mesh, self.rules):
      return self._precompute(state["frozen"], aux)


def abstract_train_state(task, config, mesh, tx):
  """ShapeDtypeStructs (with shardings) of the train state, without creating any parameter (for AOT checks)."""
  rules = sharding.rules_tuple(config.logical_axis_rules)
  with nn.logical_axis_rules(rules):
    boxed = jax.eval_shape(task.init_params, jax.random.key(config.seed))
    param_shardings = frozen_fsdp(sharding.tree_shardings(boxed, mesh, rules), boxed, task, config)
  params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        nn.meta.unbox(boxed), param_shardings)
  trainable, frozen = partition.split_params(params, task.trainable_patterns)
  frozen = frozen_storage(frozen, config)
  opt_state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                           jax.eval_shape(tx.init, trainable), opt_state_shardings(tx, trainable, mesh))
  step = jax.ShapeDtypeStruct((), jnp.int32, sharding=sharding.replicated(mesh))
  return {"step": step, "trainable": trainable, "frozen": frozen, "opt_state": opt_state}
