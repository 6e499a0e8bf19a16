"""train_and_evaluate(config, workdir): the one training loop every task runs through; evaluate_checkpoint: the
evaluate-only entry (launch/evaluate.py) on the same state and steps.

Start-up order: resume from the workdir's newest complete checkpoint (checkpointing.py), else
`config.pretrained.init_from` / the task's pretrained weights, else from scratch. The state and the jitted steps come
from steps.py, the workdir's experiment identity from workdir.py, train_history.jsonl from history.py and the
evaluation passes and model selection (config.select: the best step, reported beside the last one in
final_metrics.json, its checkpoint kept) from evaluation.py; this file holds the start-up checks and the loop.

Multi-process jobs (jax.distributed): every process runs this same function; each reads its own rows of every batch
(evqa_jax.data.pipeline), eval passes have the same number of batches everywhere, and only process 0 writes logs,
summaries, train_history.jsonl and prediction files. Every process takes part in checkpointing (a shared filesystem).

Before every write that a second run in the workdir would collide with (a logged row, a checkpoint, an evaluation,
the final metrics) the loop checks that the run still holds the workdir lock (safeguards.WorkdirLease.check: on
gs://, another run may have taken a stalled run's lease over); if not, every process raises LockLostError there.
"""

import os
import time

import jax
import numpy as np

from evqa_jax import io as io_lib
from evqa_jax import log
from evqa_jax import projects as tasks_lib
from evqa_jax import settings
from evqa_jax.data import pipeline
from evqa_jax.runs import checkpointing, safeguards
from evqa_jax.runs import history as history_lib
from evqa_jax.runs import workdir as workdir_lib
from evqa_jax.train import durations, evaluation, partition, sharding
from evqa_jax.train import steps as steps_lib
from evqa_jax.train import writers as writers_lib


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


def _check_eval_splits(task, config, splits=None, key: str = "config.data.eval_splits") -> None:
  """Fails at start-up, not after hours of training, when an evaluation split is missing or empty."""
  for split in config.data.eval_splits if splits is None else splits:
    try:
      n = len(task.source(split))
    except (FileNotFoundError, ValueError) as e:
      raise ValueError(f"{key} names split {split!r}, which cannot be read: {e}") from e
    if n == 0:
      raise ValueError(f"evaluation split {split!r} of {config.data.dir} has no examples ({key})")
    _check_record_tails(task.source(split), split)


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains `config.task` in `workdir`, evaluating every `eval_every_steps` and at the end. Returns the last metrics.

  One run per workdir at a time (safeguards.workdir_lock); a run that lost its lock to another stops with
  safeguards.LockLostError before its next write."""
  settings.check_config(config)  # every numeric setting, naming its key, before anything is written or compiled
  workdir = io_lib.absolute(workdir)  # local, or gs://... (every file below goes through evqa_jax.io / epath)
  safeguards.check_workdir_paths(config, workdir)  # before anything is written
  io_lib.makedirs(workdir)
  with safeguards.workdir_lock(workdir) as lease:
    return _train_and_evaluate(config, workdir, lease)


def _build(config):
  """(task, mesh, logical axis rules, batch sharding) of a config, batch sizes checked."""
  task = tasks_lib.build_task(config)
  mesh = sharding.make_mesh(config.mesh_shape, config.mesh_axes)
  rules = config.logical_axis_rules
  batch_shard = sharding.batch_sharding(mesh, rules)
  _check_batch_sizes(config, batch_shard)
  return task, mesh, rules, batch_shard


def _train_and_evaluate(config, workdir: str, lease: safeguards.WorkdirLease) -> dict:
  workdir_lib.check_workdir(config, workdir)
  identity = workdir_lib.config_identity(config)
  is_main = jax.process_index() == 0
  task, mesh, rules, batch_shard = _build(config)
  workdir_lib.record_config(config, workdir)  # once the task and its model accepted the config

  train_source = task.source(config.data.train_split)
  if len(train_source) == 0:
    raise ValueError(f"split {config.data.train_split!r} of {config.data.dir} has no examples")
  _check_record_tails(train_source, config.data.train_split)
  _check_eval_splits(task, config)
  select = evaluation.selection(config, task)
  steps_per_epoch = len(train_source) / config.batch_size
  total_steps = durations.to_steps(config, "total", steps_per_epoch=steps_per_epoch, batch_size=config.batch_size)
  eval_every = durations.to_steps(config, "eval_every", steps_per_epoch=steps_per_epoch,
                                  batch_size=config.batch_size, required=False) or total_steps
  log_every = config.log_every_steps
  ckpt_every = durations.to_steps(config, "checkpoint_every", steps_per_epoch=steps_per_epoch,
                                  batch_size=config.batch_size, required=False) or total_steps

  tx, schedule = partition.make_optimizer(config.optim, total_steps)
  state, state_shardings = steps_lib.create_state(task, config, mesh, tx)
  train_aux = task.aux_inputs(config.data.train_split)
  step_aux = steps_lib.StepAux(task, mesh, rules, state, state_shardings, train_aux)
  steps = steps_lib.StepFns(task, tx, mesh, rules, state_shardings, batch_shard, step_aux.shardings)

  loader = pipeline.make_train_loader(
      train_source, global_batch_size=config.batch_size,
      transform=pipeline.KeyedTransform(task.preprocess_train), seed=config.seed,
      worker_count=config.data.worker_count)

  keep = checkpointing.KeepSteps()  # the best step's checkpoint outlives max_to_keep
  mngr = checkpointing.make_checkpoint_manager(workdir, config, keep)
  start_step, restored, train_iter = checkpointing.restore_latest(mngr, state, lambda: iter(loader), identity,
                                                                config.checkpoint.allow_unverified)
  if restored is not None:
    state = restored
    if is_main:
      log.info(f"Resumed from {mngr.directory} at step {start_step}")
  else:
    state = steps_lib.load_pretrained_into(state, task, state_shardings)
    start_step = 0
  history = history_lib.History(os.path.join(workdir, "train_history.jsonl"), keep_up_to=start_step, enabled=is_main)
  n_train = partition.count_params(state["trainable"])
  n_frozen = partition.count_params(state["frozen"])

  writer = writers_lib.create_writer(workdir, config)
  if start_step == 0:
    writer.write_hparams({"trainable_params": n_train, "frozen_params": n_frozen,
                          "total_steps": total_steps, "devices": jax.device_count(),
                          "processes": jax.process_count()})
  if is_main:
    log.info(f"{task.describe()}: {n_train:,} trainable / {n_frozen:,} frozen parameters; "
             f"{len(train_source)} train examples, {total_steps} steps of {config.batch_size} on mesh "
             f"{dict(mesh.shape)} ({jax.process_count()} process(es))")

  def put_aux(aux):
    # From the state as loaded or restored: what the task precomputes reads frozen parameters only, which training
    # never changes.
    return step_aux(state, aux)

  train_aux_dev = put_aux(train_aux)
  eval_aux_dev = {}
  progress = writers_lib.Progress(total_steps, start_step)
  last_metrics = {}
  # A resumed run starts from what the workdir holds: its last logged row, and the evaluations of the restored step
  # (redone below when a kill interrupted them), so final_metrics.json equals an uninterrupted run's.
  last_row = safeguards.last_history_row(history.path) if start_step else {}
  step = start_step
  saved_step = start_step if restored is not None else None  # the newest checkpoint this run can stand on

  def still_locked():
    """Before a write: stops every process (LockLostError) when another run has taken the workdir over."""
    lease.check(saved_step)

  def run_evals(step, reuse=False):
    for split in config.data.eval_splits:
      done = safeguards.completed_eval(workdir, split, step) if reuse else None
      if done is not None:
        last_metrics[split] = done
        continue
      if split not in eval_aux_dev:
        eval_aux_dev[split] = put_aux(task.aux_inputs(split))
      out_dir = os.path.join(workdir, "eval", f"{split}_step{step}")
      t0 = time.time()
      results = evaluation.evaluate_split(task, steps, state, eval_aux_dev[split], split, config, batch_shard, out_dir)
      if is_main:
        writer.write_scalars(step, writers_lib.metric_scalars(split, results))
        io_lib.write_json(os.path.join(workdir, "eval", f"{split}_metrics.json"), {"step": step, **results})
        log.info(writers_lib.format_metrics(f"eval {split} @ step {step} ({time.time() - t0:.1f}s)", results,
                                            task.console_metrics(),
                                            os.path.relpath(out_dir, workdir) + "/metrics.json"))
        last_metrics[split] = results
    update_best(step)

  best = {}

  def update_best(step):
    """Model selection over the evaluations written so far (config.select); the best step's checkpoint is kept."""
    found = evaluation.best_eval(workdir, select, config.data.eval_splits, up_to_step=step) if select else None
    best.clear()
    best.update(found or {})
    keep.steps = {found["step"]} if found else set()

  with steps.context():
    if start_step:
      update_best(start_step)  # the evaluations of the run that wrote the restored checkpoint
    if start_step and (start_step % eval_every == 0 or start_step == total_steps):
      still_locked()
      run_evals(start_step, reuse=True)
    while step < total_steps:
      local = next(train_iter)
      batch = sharding.global_batch(local, batch_shard)
      state, metrics = steps.train_step(state, batch, train_aux_dev)
      step += 1
      log_due = step % log_every == 0 or step == total_steps
      ckpt_due = step % ckpt_every == 0 or step == total_steps
      if log_due or ckpt_due:
        still_locked()  # once per step that writes the history or a checkpoint
      if log_due:
        metrics = jax.tree.map(lambda x: float(x), jax.device_get(metrics))
        if not np.isfinite(metrics["loss"]):
          raise FloatingPointError(f"loss is {metrics['loss']} at step {step} (workdir {workdir})")
        metrics["lr"] = float(schedule(step - 1))
        writer.write_scalars(step, {f"train/{k}": v for k, v in metrics.items()})
        last_row = {"step": step, **metrics}
        history.append(last_row)
        progress.report(step, metrics)
      if ckpt_due:
        checkpointing.save_checkpoint(mngr, step, state, train_iter, identity)
        saved_step = step
      if step % eval_every == 0 or step == total_steps:
        still_locked()  # again: a checkpoint can take a while, an evaluation longer
        run_evals(step)
  still_locked()  # before the last TensorBoard events and final_metrics.json
  mngr.wait_until_finished()
  mngr.close()
  train_iter.close()
  writer.close()
  result = {"step": step, "train": last_row, "eval": last_metrics}
  if best:  # model selection, beside the last step's metrics
    result["best"] = dict(best)
  if is_main and step >= total_steps:
    io_lib.write_json(os.path.join(workdir, "final_metrics.json"), result)
  workdir_lib.sync("evqa_jax:train_and_evaluate_done")
  return result


def resolve_checkpoint(workdir: str, checkpoint: str, select: dict) -> int:
  """`checkpoint` ("last", "best" or a step number) of a workdir -> a step whose checkpoint it holds."""
  ckpt_dir = os.path.join(workdir, "checkpoints")
  kept = checkpointing.checkpoint_steps(ckpt_dir)
  if not kept:
    raise FileNotFoundError(f"{ckpt_dir} holds no checkpoint: train first, or score the initial weights with "
                            "--zero_shot")
  if checkpoint == "last":
    return kept[-1]
  if checkpoint == "best":
    if select is None:
      raise ValueError("--checkpoint=best selects over the evaluations of training, but config.data.eval_splits is "
                       "empty")
    best = evaluation.best_eval(workdir, select, ())
    if best is None:
      raise FileNotFoundError(f"{workdir}/eval holds no evaluation of split {select['split']!r} (config.select.split)"
                              " to select the best checkpoint from")
    step = best["step"]
    where = f"the best step {step} ({select['metric']} {best['value']} on {select['split']})"
  else:
    try:
      step = int(checkpoint)
    except ValueError:
      raise ValueError(f"--checkpoint={checkpoint!r}: expected 'last', 'best' or a step number") from None
    where = f"step {step}"
  if step not in kept:
    raise FileNotFoundError(f"{ckpt_dir} holds no checkpoint of {where}; it holds steps {kept} (a step's "
                            "checkpoint exists only when it was a checkpoint step: config.checkpoint_every_*)")
  return step


def evaluate_checkpoint(config, workdir: str, checkpoint: str | None, splits=None) -> dict:
  """Scores a checkpoint of `workdir` (`checkpoint`: "last", "best" or a step), or with checkpoint=None the weights
  training starts from (pretrained / config.pretrained.init_from: the OVQA paper's zero-shot Table 6), on `splits`
  (default config.data.eval_splits). Writes what training's evaluation writes, under <workdir>/eval/<split>_step<N>/
  (zero-shot: <split>_zero_shot/), and <workdir>/evaluate_<step<N>|zero_shot>.json; returns
  {"checkpoint", "step", "eval": {split: metrics}}."""
  settings.check_config(config)
  workdir = io_lib.absolute(workdir)
  safeguards.check_workdir_paths(config, workdir)  # before anything is written
  task, mesh, rules, batch_shard = _build(config)
  splits = list(splits or config.data.eval_splits)
  _check_eval_splits(task, config, splits, key="--split")
  tx, _ = partition.make_optimizer(config.optim, 1)  # the state's structure; no step is taken
  state, state_shardings = steps_lib.create_state(task, config, mesh, tx)
  if checkpoint is None:
    io_lib.makedirs(workdir)
    state, step, tag = steps_lib.load_pretrained_into(state, task, state_shardings), 0, "zero_shot"
    task.check_zero_shot()
  else:
    if not io_lib.epath_of(workdir).is_dir():
      raise FileNotFoundError(f"--workdir {workdir} does not exist")
    workdir_lib.check_same_experiment(config, workdir)
    step = resolve_checkpoint(workdir, checkpoint, evaluation.selection(config, task))
    # "last" of a run still training: the newest finished step when it is read (again if it rotates away meanwhile)
    step, arrays = checkpointing.load_checkpoint_arrays(workdir, None if checkpoint == "last" else step,
                                                        config.checkpoint.allow_unverified)
    state = steps_lib.put_params(state, arrays["trainable"], arrays["frozen"], state_shardings)
    tag = f"step{step}"
  train_aux = task.aux_inputs(config.data.train_split)
  step_aux = steps_lib.StepAux(task, mesh, rules, state, state_shardings, train_aux)
  steps = steps_lib.StepFns(task, tx, mesh, rules, state_shardings, batch_shard, step_aux.shardings)
  results = {}
  with steps.context():
    for split in splits:
      aux = step_aux(state, task.aux_inputs(split))
      out_dir = os.path.join(workdir, "eval", f"{split}_{tag}")
      results[split] = evaluation.evaluate_split(task, steps, state, aux, split, config, batch_shard, out_dir)
      if jax.process_index() == 0:
        log.info(writers_lib.format_metrics(f"eval {split} @ {checkpoint or 'zero-shot'} ({tag})", results[split],
                                            task.console_metrics(),
                                            os.path.relpath(out_dir, workdir) + "/metrics.json"))
  out = {"checkpoint": checkpoint or "zero_shot", "step": step, "eval": results}
  if jax.process_index() == 0:
    io_lib.write_json(os.path.join(workdir, f"evaluate_{tag}.json"), out)
  return out
