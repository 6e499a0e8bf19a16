"""train_and_evaluate(config, workdir): the one training loop every task runs through.

Start-up order: resume from the workdir's newest complete checkpoint, else `config.model.init_from` / the task's
pretrained weights, else from scratch. Parameters are created already sharded (eval_shape -> logical partition specs ->
mesh shardings -> jit(init, out_shardings)). The train step is jitted with donated state. One Orbax CheckpointManager
saves {train state, data iterator, experiment identity} together, so a restarted job continues at the exact next batch.

Multi-process jobs (jax.distributed): every process runs this same function; each reads its own rows of every batch
(evqa_jax.data.pipeline), eval passes have the same number of batches everywhere, and only process 0 writes logs,
summaries, train_history.jsonl and prediction files. Every process takes part in checkpointing (a shared filesystem).

Exact resume: train_history.jsonl gets each logged row appended and fsynced as it is logged; a resumed run first drops
the rows past the restored step, so after any number of kills the file equals the one of an uninterrupted run. A
checkpoint that does not read back (truncated, half-written) is reported, moved to <workdir>/checkpoints_damaged/ and
the previous one is used.
"""

import contextlib
import json
import os
import shutil
import time

from absl import logging
import flax.linen as nn
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
import optax
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


def _identity_diffs(mine: dict, theirs: dict) -> list:
  """Human-readable differences between two experiment identities, one entry per differing (nested) field."""
  out = []

  def walk(a, b, prefix):
    if isinstance(a, dict) and isinstance(b, dict):
      for k in sorted(set(a) | set(b)):
        walk(a.get(k, "<unset>"), b.get(k, "<unset>"), f"{prefix}.{k}" if prefix else k)
    elif a != b:
      out.append(f"{prefix} (checkpoint: {json.dumps(b)}, config: {json.dumps(a)})")

  walk(mine, theirs, "")
  return out


def _sync(name: str) -> None:
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def _check_workdir(config, workdir: str) -> None:
  """Refuses to resume a workdir that holds another experiment's checkpoint."""
  path = os.path.join(workdir, "config.json")
  mine = _config_identity(config)
  if os.path.exists(path):
    try:
      with open(path) as f:
        theirs = json.load(f).get("identity", {})
    except (OSError, ValueError) as e:
      raise ValueError(f"{path} is unreadable ({e}): is {workdir} an evqa_jax workdir?") from e
    diffs = _identity_diffs(mine, theirs)
    ckpt_dir = os.path.join(workdir, "checkpoints")
    if diffs and os.path.isdir(ckpt_dir) and any(n.isdigit() for n in os.listdir(ckpt_dir)):
      raise ValueError(
          f"workdir {workdir} holds a checkpoint of another experiment; it differs in "
          f"{'; '.join(diffs)}. Use a new --workdir or delete that one")
  _sync("evqa_jax:workdir_checked")  # everyone read the old file before process 0 replaces it
  if jax.process_index() == 0:
    io_lib.write_json(path, {"identity": mine, "config": json.loads(config.to_json_best_effort()),
                             "code": io_lib.code_version()})


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

    self.mesh = mesh
    self.rules = sharding.rules_tuple(rules)
    self.train_step = jax.jit(train_step, donate_argnums=0,
                              in_shardings=(state_shardings, batch_shard, aux_shardings),
                              out_shardings=(state_shardings, repl))
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
    param_shardings = sharding.tree_shardings(abstract, mesh, rules)
    params = jax.jit(lambda r: nn.meta.unbox(task.init_params(r)), out_shardings=param_shardings)(rng)
  trainable, frozen = partition.split_params(params, task.trainable_patterns)
  frozen = frozen_storage(frozen, config)
  opt_state = jax.jit(tx.init, out_shardings=opt_state_shardings(tx, trainable, mesh))(trainable)
  step = jax.jit(lambda: jnp.zeros((), jnp.int32), out_shardings=sharding.replicated(mesh))()
  state = {"step": step,
           "trainable": trainable, "frozen": frozen, "opt_state": opt_state}
  return state, jax.tree.map(lambda x: x.sharding, state)


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
  # Pretrained weights arrive in float32: store them in the state's dtypes (config.frozen_param_dtype).
  trainable, frozen = (jax.tree.map(lambda x, ref: np.asarray(x).astype(ref.dtype), tree, state[part])
                       for tree, part in ((trainable, "trainable"), (frozen, "frozen")))
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
                               item_names=("state", "data", "meta"))


class CheckpointMismatchError(ValueError):
  """The checkpoint belongs to another experiment or data pipeline (not a damaged one: never skipped)."""


def save_checkpoint(mngr: ocp.CheckpointManager, step: int, state, train_iter, identity: dict) -> None:
  mngr.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state), data=pipeline.checkpoint_args_save(train_iter),
      meta=ocp.args.JsonSave({"step": int(step), "identity": identity})))


def _restore_step(mngr, step: int, state, train_iter, identity: dict):
  """Restores `step` into (state, train_iter). The state is read first: a damaged state never touches the iterator."""
  step_dir = os.path.join(os.fspath(mngr.directory), str(step))
  if os.path.isdir(os.path.join(step_dir, "meta")):
    meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    if not isinstance(meta, dict) or "identity" not in meta:
      raise RuntimeError(f"{step_dir}/meta holds no experiment identity")
    diffs = _identity_diffs(identity, meta["identity"])
    if diffs:
      raise CheckpointMismatchError(
          f"checkpoint {step_dir} was written by another experiment; it differs in {'; '.join(diffs)}. "
          "Use a new --workdir or delete that one")
  restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(_abstract(state))))
  try:
    mngr.restore(step, args=ocp.args.Composite(data=pipeline.checkpoint_args_restore(train_iter)))
  except ValueError as e:
    if "differs from the one being restored" in str(e):  # batch size, seed or dataset changed
      raise CheckpointMismatchError(f"cannot resume from {step_dir}: {e}") from e
    raise
  return restored["state"]


def restore_latest(mngr: ocp.CheckpointManager, state, make_iter, identity: dict | None = None):
  """Restores the newest checkpoint that reads back completely -> (step or None, state or None, data iterator).

  `make_iter()` gives a fresh training iterator (positioned at the start); the one returned is positioned at the
  restored step. A checkpoint that fails to read (truncated or missing files, a half-written step) is reported,
  moved to <workdir>/checkpoints_damaged/ (so the step can be written again) and the previous one is tried. A
  checkpoint of another experiment or data pipeline raises CheckpointMismatchError instead.
  """
  identity = identity if identity is not None else {}
  damaged = []
  result = None
  for step in sorted(mngr.all_steps(), reverse=True):
    it = make_iter()
    try:
      result = (step, _restore_step(mngr, step, state, it, identity), it)
      break
    except CheckpointMismatchError:
      it.close()
      raise
    except Exception as e:  # pylint: disable=broad-except
      it.close()  # a half-restored iterator may hold prefetched batches of the wrong position
      reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
      step_dir = os.path.join(os.fspath(mngr.directory), str(step))
      logging.warning("checkpoint %s is unreadable (%s)", step_dir, reason)
      if jax.process_index() == 0:
        print(f"WARNING: checkpoint {step_dir} is damaged or incomplete ({reason[:300]}); "
              "falling back to the previous checkpoint", flush=True)
      damaged.append(step)
  if damaged:
    _sync("evqa_jax:damaged_found")
    if jax.process_index() == 0:
      aside = os.path.join(os.path.dirname(os.fspath(mngr.directory)), "checkpoints_damaged")
      os.makedirs(aside, exist_ok=True)
      for step in damaged:
        target = os.path.join(aside, f"{step}.{int(time.time())}")
        shutil.move(os.path.join(os.fspath(mngr.directory), str(step)), target)
        print(f"moved the damaged checkpoint of step {step} to {target}", flush=True)
    _sync("evqa_jax:damaged_moved")
    mngr.reload()
  return result if result is not None else (None, None, make_iter())


class History:
  """train_history.jsonl: one JSON row per logged step, appended durably (process 0 only).

  Opening it with `keep_up_to=step` drops the rows past `step` (those a killed run logged after its last
  checkpoint, and a torn last line), so a resumed run's file equals an uninterrupted run's.
  """

  def __init__(self, path: str, keep_up_to: int, enabled: bool = True):
    self.path = path
    self.enabled = enabled
    if not enabled or not os.path.exists(path):
      return
    with open(path) as f:
      lines = f.read().split("\n")
    # Every complete row ends with a newline; an unterminated last piece is a row torn by a kill mid-write.
    changed = bool(lines[-1].strip())
    kept = []
    for i, line in enumerate(lines[:-1]):
      if not line.strip():
        continue
      try:
        step = int(json.loads(line)["step"])
      except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} line {i + 1} is not a history row ({e}): {line[:200]!r}") from e
      if step <= keep_up_to:
        kept.append(line)
      else:
        changed = True
    if changed:
      io_lib.write_text(path, "".join(line + "\n" for line in kept))
      print(f"{path}: dropped the rows past step {keep_up_to} (logged after the last checkpoint)", flush=True)

  def append(self, row: dict) -> None:
    if not self.enabled:
      return
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")
      f.flush()
      os.fsync(f.fileno())


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


def aux_shardings_for(task, mesh, rules, aux):
  """Shardings of the task's aux inputs: its logical specs, or replicated."""
  aux_specs = task.aux_logical_axes()
  if aux_specs is None:
    return jax.tree.map(lambda _: sharding.replicated(mesh), aux)
  return jax.tree.map(lambda s: sharding.logical_sharding(s, mesh, rules), aux_specs,
                      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))


def abstract_train_state(task, config, mesh, tx):
  """ShapeDtypeStructs (with shardings) of the train state, without creating any parameter (for AOT checks)."""
  rules = sharding.rules_tuple(config.logical_axis_rules)
  with nn.logical_axis_rules(rules):
    boxed = jax.eval_shape(task.init_params, jax.random.key(config.seed))
    param_shardings = sharding.tree_shardings(boxed, mesh, rules)
  params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        nn.meta.unbox(boxed), param_shardings)
  trainable, frozen = partition.split_params(params, task.trainable_patterns)
  frozen = frozen_storage(frozen, config)
  opt_state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                           jax.eval_shape(tx.init, trainable), opt_state_shardings(tx, trainable, mesh))
  step = jax.ShapeDtypeStruct((), jnp.int32, sharding=sharding.replicated(mesh))
  return {"step": step, "trainable": trainable, "frozen": frozen, "opt_state": opt_state}


def _check_record_tails(source, split: str) -> None:
  """`source.check_tails()` (TFRecordDataSource) with the split named; other sources have nothing to check."""
  if hasattr(source, "check_tails") and len(source):
    try:
      source.check_tails()
    except ValueError as e:
      raise ValueError(f"split {split!r}: {e}") from e


def _check_batch_sizes(config, batch_shard) -> None:
  """Batch sizes must split evenly over the processes and over the devices of the batch axis."""
  axes = batch_shard.spec[0] if len(batch_shard.spec) else None
  axes = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
  shards = int(np.prod([batch_shard.mesh.shape[a] for a in axes])) if axes else 1
  for key in ("batch_size", "eval_batch_size"):
    value = config[key]
    for n, what in ((jax.process_count(), "processes"), (shards, f"devices of the batch mesh axes {axes}")):
      if value % n:
        raise ValueError(f"config.{key} = {value} is not divisible by the {n} {what}")


def _check_eval_splits(task, config) -> None:
  """Fails at start-up, not after hours of training, when an evaluation split is missing or empty."""
  for split in config.data.eval_splits:
    try:
      n = len(task.source(split))
    except (FileNotFoundError, ValueError) as e:
      raise ValueError(f"config.data.eval_splits names split {split!r}, which cannot be read: {e}") from e
    if n == 0:
      raise ValueError(f"evaluation split {split!r} of {config.data.dir} has no examples "
                       "(config.data.eval_splits)")
    _check_record_tails(task.source(split), split)


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains `config.task` in `workdir`, evaluating every `eval_every_steps` and at the end. Returns the last metrics."""
  workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  _check_workdir(config, workdir)
  identity = _config_identity(config)
  is_main = jax.process_index() == 0
  task = tasks_lib.build_task(config)
  mesh = sharding.make_mesh(config.mesh_shape, config.mesh_axes)
  rules = config.logical_axis_rules
  batch_shard = sharding.batch_sharding(mesh, rules)
  _check_batch_sizes(config, batch_shard)

  train_source = task.source(config.data.train_split)
  if len(train_source) == 0:
    raise ValueError(f"split {config.data.train_split!r} of {config.data.dir} has no examples")
  _check_record_tails(train_source, config.data.train_split)
  _check_eval_splits(task, config)
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
  aux_shardings = aux_shardings_for(task, mesh, rules, train_aux)
  steps = StepFns(task, tx, mesh, rules, state_shardings, batch_shard, aux_shardings)

  loader = pipeline.make_train_loader(
      train_source, global_batch_size=config.batch_size,
      transform=lambda ex: task.preprocess(ex, train=True), seed=config.seed,
      worker_count=config.data.worker_count)

  mngr = make_checkpoint_manager(workdir, config)
  start_step, restored, train_iter = restore_latest(mngr, state, lambda: iter(loader), identity)
  if restored is not None:
    state = restored
    if is_main:
      print(f"Resumed from {mngr.directory} at step {start_step}", flush=True)
  else:
    state = load_pretrained_into(state, task, state_shardings)
    start_step = 0
  history = History(os.path.join(workdir, "train_history.jsonl"), keep_up_to=start_step, enabled=is_main)
  n_train = partition.count_params(state["trainable"])
  n_frozen = partition.count_params(state["frozen"])

  writer = writers_lib.create_writer(workdir, config)
  if start_step == 0:
    writer.write_hparams({"trainable_params": n_train, "frozen_params": n_frozen,
                          "total_steps": total_steps, "devices": jax.device_count(),
                          "processes": jax.process_count()})
  if is_main:
    print(f"{task.describe()}: {n_train:,} trainable / {n_frozen:,} frozen parameters; "
          f"{len(train_source)} train examples, {total_steps} steps of {config.batch_size} on mesh "
          f"{dict(mesh.shape)} ({jax.process_count()} process(es))", flush=True)

  def put_aux(aux):
    return sharding.host_to_global(aux, aux_shardings)

  train_aux_dev = put_aux(train_aux)
  eval_aux_dev = {}
  progress = writers_lib.Progress(total_steps, start_step)
  last_metrics = {}
  last_row = {}
  step = start_step
  with steps.context():
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
        last_row = {"step": step, **metrics}
        history.append(last_row)
        progress.report(step, metrics)
      if step % ckpt_every == 0 or step == total_steps:
        save_checkpoint(mngr, step, state, train_iter, identity)
      if step % eval_every == 0 or step == total_steps:
        for split in config.data.eval_splits:
          if split not in eval_aux_dev:
            eval_aux_dev[split] = put_aux(task.aux_inputs(split))
          out_dir = os.path.join(workdir, "eval", f"{split}_step{step}")
          t0 = time.time()
          results = evaluate_split(task, steps, state, eval_aux_dev[split], split, config, batch_shard, out_dir)
          if is_main:
            scalars = {f"{split}/{k}": v for k, v in results.items() if isinstance(v, (int, float))}
            writer.write_scalars(step, scalars)
            io_lib.write_json(os.path.join(workdir, "eval", f"{split}_metrics.json"), {"step": step, **results})
            print(writers_lib.format_metrics(f"eval {split} @ step {step} ({time.time() - t0:.1f}s)", results),
                  flush=True)
            last_metrics[split] = results
  mngr.wait_until_finished()
  mngr.close()
  train_iter.close()
  writer.flush()
  result = {"step": step, "train": last_row, "eval": last_metrics}
  if is_main and step >= total_steps:
    io_lib.write_json(os.path.join(workdir, "final_metrics.json"), result)
  _sync("evqa_jax:train_and_evaluate_done")
  return result


def load_checkpoint_arrays(workdir: str, step: int | None = None) -> tuple[int, dict]:
  """(step, numpy train state {step, trainable, frozen, opt_state}) of a workdir's checkpoint (default: newest).

  Host-side and device-independent: for inspecting or comparing runs, whatever mesh wrote them.
  """
  ckpt_dir = os.path.join(os.path.abspath(workdir), "checkpoints")
  steps = sorted(int(n) for n in os.listdir(ckpt_dir) if n.isdigit()) if os.path.isdir(ckpt_dir) else []
  if not steps:
    raise FileNotFoundError(f"{ckpt_dir} holds no checkpoint")
  step = steps[-1] if step is None else step
  path = os.path.join(ckpt_dir, str(step), "state")
  with ocp.PyTreeCheckpointer() as ckptr:
    tree = ckptr.metadata(path)
    tree = getattr(tree, "item_metadata", tree)
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    return step, ckptr.restore(path, restore_args=args)
