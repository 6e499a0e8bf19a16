"""The run directory (a workdir): what a training run leaves behind and how it is read back.

- checkpointing: the Orbax checkpoints of {train state, data iterator, experiment identity}, verified on every
  restore; `load_params(workdir)`, the parameters of an earlier run that a second training stage starts from.
- data_iterator: the data iterator's part of a checkpoint (its position, checksummed).
- workdir: the experiment identity (config.json) a workdir's checkpoints must match, and the code version.
- safeguards: the workdir lock (local fcntl, gs:// lease), array checksums, what a resumed workdir already holds.
- history: train_history.jsonl, cut back to the restored step on resume.
"""
