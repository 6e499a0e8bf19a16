"""Mesh construction and logical-axis sharding, all driven by the config.

Modules name logical axes only (`batch`, `length`, `embed`, `mlp`, `heads`, `kv`, `vocab`, `nodes`, ...);
`config.logical_axis_rules` maps them onto the mesh axes named in `config.mesh_axes`.
"""

from typing import Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P


def make_mesh(mesh_shape: Sequence[int], mesh_axes: Sequence[str], devices=None) -> Mesh:
  """A mesh over all (global) devices; one -1 entry in `mesh_shape` takes the remaining devices."""
  devices = list(jax.devices() if devices is None else devices)
  shape = list(mesh_shape)
  if len(shape) != len(mesh_axes):
    raise ValueError(f"config.mesh_shape {tuple(mesh_shape)} and config.mesh_axes {tuple(mesh_axes)} differ in length")
  if shape.count(-1) > 1:
    raise ValueError(f"config.mesh_shape {tuple(mesh_shape)} has more than one -1")
  known = int(np.prod([s for s in shape if s != -1]))
  if -1 in shape:
    if len(devices) % known:
      raise ValueError(f"config.mesh_shape {tuple(mesh_shape)} does not divide the {len(devices)} devices")
    shape[shape.index(-1)] = len(devices) // known
  if int(np.prod(shape)) != len(devices):
    raise ValueError(f"config.mesh_shape {tuple(shape)} needs {int(np.prod(shape))} devices, "
                     f"found {len(devices)}")
  try:
    from jax.experimental import mesh_utils
    device_array = mesh_utils.create_device_mesh(shape, devices=devices)
  except Exception:  # host-platform devices have no topology: plain reshape
    device_array = np.asarray(devices).reshape(shape)
  return Mesh(device_array, tuple(mesh_axes), axis_types=(AxisType.Auto,) * len(shape))


def rules_tuple(rules) -> tuple:
  """Config rules (lists or tuples, possibly ml_collections-wrapped) as a tuple of (logical, mesh-or-None)."""
  out = []
  for rule in rules:
    logical, physical = rule
    out.append((str(logical), None if physical is None else (physical if isinstance(physical, str) else tuple(physical))))
  return tuple(out)


def logical_sharding(logical_spec: P, mesh: Mesh, rules) -> NamedSharding:
  return nn.logical_to_mesh_sharding(logical_spec, mesh, rules_tuple(rules))


def tree_shardings(abstract_boxed_tree, mesh: Mesh, rules):
  """NamedShardings for a tree of (possibly LogicallyPartitioned) abstract values, e.g. jax.eval_shape(init)."""
  specs = nn.get_partition_spec(abstract_boxed_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules_tuple(rules))


def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
  """Sharding of the leading (batch) axis of every input array."""
  return logical_sharding(P("batch"), mesh, rules)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(local_batch: dict, sharding: NamedSharding) -> dict:
  """Per-process numpy batch -> global jax.Arrays (each process holds its own rows)."""
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local_batch)


def host_to_global(tree, shardings):
  """A host (numpy) tree identical on every process -> global arrays with the given shardings."""
  def put(x, s):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, s, lambda idx: x[idx])
  return jax.tree.map(put, tree, shardings)
