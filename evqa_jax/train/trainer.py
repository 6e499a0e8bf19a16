"""train_and_evaluate(config, workdir): the one training loop every task runs through.

Start-up order: resume from the workdir's newest complete checkpoint, else `config.model.init_from` / the task's
pretrained weights, else from scratch. Parameters are created already sharded (eval_shape -> logical partition specs ->
mesh shardings -> jit(init, out_shardings)). The train step is jitted with donated state. One Orbax CheckpointManager
saves {train state, data iterator} together, so a restarted job continues at the exact next batch.
"""

import json
import os
import time

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from evqa_jax import io as io_lib
from evqa_jax import tasks as tasks_lib
from evqa_jax.data import pipeline
from evqa_jax.train import durations, partition, sharding
from evqa_jax.train import writers as writers_lib

# Config entries that must match between a workdir's checkpoint and the config resuming from it.
_IDENTITY_KEYS = ("task", "model", "data.dir")


def _config_identity(config) -> dict:
  out = {}
  for key in _IDENTITY_KEYS:
    node = config
    for part in key.split("."):
      node = node[part]
    out[key] = json.loads(node.to_json()) if hasattr(node, "to_json") else node
  return out


def _check_workdir(config, workdir: str) -> None:
  """Refuses to resume a workdir that holds another experiment's checkpoint."""
  path = os.path.join(workdir, "config.json")
  mine = _config_identity(config)
  if os.path.exists(path):
    with open(path) as f:
      theirs = json.load(f).get("identity", {})
    diffs = [k for k in mine if theirs.get(k) != mine[k]]
    if diffs and os.path.isdir(os.path.join(workdir, "checkpoints")):
      raise ValueError(
          f"workdir {workdir} holds a checkpoint of another experiment (differs in {', '.join(diffs)}); "
          "use a new --workdir or delete that one")
  if jax.process_index() == 0:
    io_lib.write_json(path, {"identity": mine, "config": json.loads(config.to_json_best_effort())})


class StepFns:
  """The jitted train and eval steps of a task on a mesh."""

  def __init__(self, task, tx, mesh, rules, state_shardings, batch_shard, aux_shardings):
    self.task = task
    repl = sharding.replicated(mesh)

    def train_step(state, batch, aux):
      rng = jax.random.fold_in(jax.random.key(task.config.seed), state["step"])

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

    with nn.logical_axis_rules(sharding.rules_tuple(rules)):
      self.train_step = jax.jit(train_step, donate_argnums=0,
                                in_shardings=(state_shardings, batch_shard, aux_shardings),
                                out_shardings=(state_shardings, repl))
      self.eval_step = jax.jit(eval_step, in_shardings=(state_shardings, batch_shard, aux_shardings),
                               out_shardings=repl)
      self.eval_loss_step = jax.jit(eval_loss_step, in_shardings=(state_shardings, batch_shard, aux_shardings),
                                    out_shardings=repl)


def optax_global_norm(tree):
  leaves = jax.tree.leaves(tree)
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves)) if leaves else jnp.zeros(())


def create_state(task, config, mesh, tx):
  """Sharded initial train state {step, trainable, frozen, opt_state} and its shardings (nothing pretrained yet)."""
  rules = sharding.rules_tuple(config.logical_axis_rules)
  rng = jax.random.key(config.seed)
  with nn.logical_axis_rules(rules):
    abstract = jax.eval_shape(task.init_params, rng)
    param_shardings = sharding.tree_shardings(abstract, mesh, rules)
    params = jax.jit(lambda r: nn.meta.unbox(task.init_params(r)), out_shardings=param_shardings)(rng)
  trainable, frozen = partition.split_params(params, task.trainable_patterns)
  opt_state = jax.jit(tx.init)(trainable)
  state = {"step": jax.device_put(jnp.zeros((), jnp.int32), sharding.replicated(mesh)),
           "trainable": trainable, "frozen": frozen, "opt_state": opt_state}
  return state, jax.tree.map(lambda x: x.sharding, state)


def load_pretrained_into(state, task, shardings):
  """Fills trainable/frozen params from the task's pretrained weights (host side, then back to global arrays)."""
  params = partition.merge_params(state["trainable"], state["frozen"])
  host = jax.tree.map(lambda x: np.asarray(jax.device_get(x)) if x.is_fully_addressable else
                      np.asarray(jax.experimental.multihost_utils.process_allgather(x, tiled=True)), params)
  host = task.load_pretrained(host)
  trainable, frozen = partition.split_params(host, task.trainable_patterns)
  state = dict(state)
  state["trainable"] = sharding.host_to_global(trainable, shardings["trainable"])
  state["frozen"] = sharding.host_to_global(frozen, shardings["frozen"])
  return state


def _abstract(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def make_checkpoint_manager(workdir: str, config) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=config.checkpoint.max_to_keep, create=True,
                                         enable_async_checkpointing=False)
  return ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "checkpoints"), options=options,
                               item_names=("state", "data"))


def restore_latest(mngr: ocp.CheckpointManager, state, train_iter):
  """Restores the newest checkpoint that reads back completely; a damaged one is reported and the previous used."""
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      restored = mngr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(_abstract(state)),
          data=pipeline.checkpoint_args_restore(train_iter)))
      return step, restored["state"]
    except ValueError as e:
      if "differs" in str(e):  # the data pipeline changed (batch size, seed, dataset): not a damaged checkpoint
        raise ValueError(f"cannot resume from {mngr.directory} step {step}: {e}") from e
      logging.warning("checkpoint at step %d in %s is unreadable (%s); trying the previous one", step,
                      mngr.directory, e)
      print(f"WARNING: checkpoint step {step} is unreadable ({e}); falling back to an earlier one", flush=True)
    except Exception as e:  # a truncated or half-written checkpoint: fall back to the one before
      logging.warning("checkpoint at step %d in %s is unreadable (%s: %s); trying the previous one",
                      step, mngr.directory, type(e).__name__, e)
      print(f"WARNING: checkpoint step {step} is unreadable ({type(e).__name__}); falling back to an earlier one",
            flush=True)
  return None, None


def evaluate_split(task, steps: StepFns, state, aux, split: str, config, batch_shard, out_dir: str) -> dict:
  """Runs prediction over the whole split and scores it with the task's evaluator (same code as the CLI)."""
  source = task.source(split)
  batches = pipeline.make_eval_batches(
      source, global_batch_size=config.eval_batch_size, transform=lambda ex: task.preprocess(ex, train=False))
  collected = []
  for local in batches:
    local = dict(local)
    local["_valid"] = np.asarray(local["_valid"]).astype(np.int32)
    out = steps.eval_step(state, sharding.global_batch(local, batch_shard), aux)
    collected.append(jax.tree.map(np.asarray, out))
  outputs = {k: np.concatenate([c[k] for c in collected]) for k in collected[0]}
  valid = outputs.pop("_valid").astype(bool)
  outputs = {k: v[valid] for k, v in outputs.items()}
  order = np.argsort(outputs["index"], kind="stable")
  outputs = {k: v[order] for k, v in outputs.items()}
  if len(np.unique(outputs["index"])) != len(outputs["index"]):
    raise RuntimeError(f"evaluation of split {split!r} saw an example twice")
  if jax.process_index() != 0:
    return {}
  return task.evaluate(split, outputs, out_dir)


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains `config.task` in `workdir`, evaluating every `eval_every_steps` and at the end. Returns the last metrics."""
  workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  _check_workdir(config, workdir)
  task = tasks_lib.build_task(config)
  mesh = sharding.make_mesh(config.mesh_shape, config.mesh_axes)
  rules = config.logical_axis_rules
  batch_shard = sharding.batch_sharding(mesh, rules)
  if config.batch_size % jax.process_count():
    raise ValueError(f"config.batch_size = {config.batch_size} is not divisible by {jax.process_count()} processes")

  train_source = task.source(config.data.train_split)
  if len(train_source) == 0:
    raise ValueError(f"split {config.data.train_split!r} of {config.data.dir} has no examples")
  steps_per_epoch = len(train_source) / config.batch_size
  total_steps = durations.to_steps(config, "total", steps_per_epoch=steps_per_epoch, batch_size=config.batch_size)
  eval_every = durations.to_steps(config, "eval_every", steps_per_epoch=steps_per_epoch,
                                  batch_size=config.batch_size, required=False) or total_steps
  log_every = config.log_every_steps
  ckpt_every = durations.to_steps(config, "checkpoint_every", steps_per_epoch=steps_per_epoch,
                                  batch_size=config.batch_size, required=False) or total_steps

  tx, schedule = partition.make_optimizer(config.optim, total_steps)
  state, state_shardings = create_state(task, config, mesh, tx)
  train_aux = task.aux_inputs(config.data.train_split)
  aux_specs = task.aux_logical_axes()
  if aux_specs is None:
    aux_shardings = jax.tree.map(lambda _: sharding.replicated(mesh), train_aux)
  else:
    aux_shardings = jax.tree.map(lambda s: sharding.logical_sharding(s, mesh, rules), aux_specs,
                                 is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  steps = StepFns(task, tx, mesh, rules, state_shardings, batch_shard, aux_shardings)

  loader = pipeline.make_train_loader(
      train_source, global_batch_size=config.batch_size,
      transform=lambda ex: task.preprocess(ex, train=True), seed=config.seed,
      worker_count=config.data.worker_count)
  train_iter = iter(loader)

  mngr = make_checkpoint_manager(workdir, config)
  start_step, restored = restore_latest(mngr, state, train_iter)
  if restored is not None:
    state = restored
    print(f"Resumed from {mngr.directory} at step {start_step}", flush=True)
  else:
    state = load_pretrained_into(state, task, state_shardings)
    start_step = 0
  n_train = partition.count_params(state["trainable"])
  n_frozen = partition.count_params(state["frozen"])

  writer = writers_lib.create_writer(workdir, config)
  if start_step == 0:
    writer.write_hparams({"trainable_params": n_train, "frozen_params": n_frozen,
                          "total_steps": total_steps, "devices": jax.device_count(),
                          "processes": jax.process_count()})
  print(f"{task.describe()}: {n_train:,} trainable / {n_frozen:,} frozen parameters; "
        f"{len(train_source)} train examples, {total_steps} steps of {config.batch_size} on mesh "
        f"{dict(mesh.shape)}", flush=True)

  def put_aux(aux):
    return sharding.host_to_global(aux, aux_shardings)

  train_aux_dev = put_aux(train_aux)
  eval_aux_dev = {}
  progress = writers_lib.Progress(total_steps, start_step)
  last_metrics = {}
  history = []
  step = start_step
  while step < total_steps:
    local = next(train_iter)
    batch = sharding.global_batch(local, batch_shard)
    state, metrics = steps.train_step(state, batch, train_aux_dev)
    step += 1
    if step % log_every == 0 or step == total_steps:
      metrics = jax.tree.map(lambda x: float(x), jax.device_get(metrics))
      if not np.isfinite(metrics["loss"]):
        raise FloatingPointError(f"loss is {metrics['loss']} at step {step} (workdir {workdir})")
      metrics["lr"] = float(schedule(step - 1))
      writer.write_scalars(step, {f"train/{k}": v for k, v in metrics.items()})
      history.append({"step": step, **metrics})
      progress.report(step, metrics)
    if step % ckpt_every == 0 or step == total_steps:
      mngr.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), data=pipeline.checkpoint_args_save(train_iter)))
    if step % eval_every == 0 or step == total_steps:
      for split in config.data.eval_splits:
        if split not in eval_aux_dev:
          eval_aux_dev[split] = put_aux(task.aux_inputs(split))
        out_dir = os.path.join(workdir, "eval", f"{split}_step{step}")
        t0 = time.time()
        results = evaluate_split(task, steps, state, eval_aux_dev[split], split, config, batch_shard, out_dir)
        if jax.process_index() == 0:
          scalars = {f"{split}/{k}": v for k, v in results.items() if isinstance(v, (int, float))}
          writer.write_scalars(step, scalars)
          io_lib.write_json(os.path.join(workdir, "eval", f"{split}_metrics.json"), {"step": step, **results})
          print(writers_lib.format_metrics(f"eval {split} @ step {step} ({time.time() - t0:.1f}s)", results),
                flush=True)
          last_metrics[split] = results
  mngr.wait_until_finished()
  mngr.close()
  writer.flush()
  if jax.process_index() == 0 and history:
    hist_path = os.path.join(workdir, "train_history.jsonl")
    mode = "a" if start_step > 0 and os.path.exists(hist_path) else "w"
    with open(hist_path, mode) as f:
      for row in history:
        f.write(json.dumps(row) + "\n")
  result = {"step": step, "train": history[-1] if history else {}, "eval": last_metrics}
  if jax.process_index() == 0 and step >= total_steps:
    io_lib.write_json(os.path.join(workdir, "final_metrics.json"), result)
  return result
