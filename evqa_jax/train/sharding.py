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


def fit_to_shape(named: NamedSharding, shape: Sequence[int]) -> NamedSharding:
  """`named` with the mesh axes dropped from every dimension they do not divide (that dimension is replicated).

  A BERT vocabulary of 30522 rows splits over a model axis of 2 but not of 4: rather than refuse the mesh, such a
  parameter is kept whole on each device along that dimension (as MaxText and big_vision do for odd sizes).
  """
  spec = list(named.spec) + [None] * (len(shape) - len(named.spec))
  for i, axes in enumerate(spec[:len(shape)]):
    if axes is None:
      continue
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    if shape[i] % int(np.prod([named.mesh.shape[a] for a in names])):
      spec[i] = None
  return NamedSharding(named.mesh, P(*spec[:len(shape)]), memory_kind=named.memory_kind)


def tree_shardings(abstract_boxed_tree, mesh: Mesh, rules):
  """NamedShardings for a tree of (possibly LogicallyPartitioned) abstract values, e.g. jax.eval_shape(init).

  A mesh axis that does not divide a parameter's dimension leaves that dimension replicated (`fit_to_shape`).
  """
  specs = nn.get_partition_spec(abstract_boxed_tree)
  shardings = nn.logical_to_mesh_sharding(specs, mesh, rules_tuple(rules))
  return jax.tree.map(lambda s, x: fit_to_shape(s, x.shape), shardings, nn.meta.unbox(abstract_boxed_tree),
                      is_leaf=lambda x: isinstance(x, NamedSharding))


def fsdp_sharding(named: NamedSharding, shape: Sequence[int], axis: str = "data") -> NamedSharding:
  """`named` with mesh `axis` added to the largest dimension of `shape` that no mesh axis splits yet and that `axis`
  divides (FSDP / ZeRO-3 storage: each device holds 1 / |axis| of the array, and XLA all-gathers it where it is
  used). Arrays of fewer than 2 dimensions, arrays already split over `axis`, and arrays with no such dimension
  are returned unchanged (a bias or a LayerNorm scale is not worth a collective)."""
  size = named.mesh.shape.get(axis, 1)
  spec = list(named.spec) + [None] * (len(shape) - len(named.spec))
  used = {a for axes in spec if axes is not None for a in ((axes,) if isinstance(axes, str) else axes)}
  if size <= 1 or len(shape) < 2 or axis in used:
    return named
  free = [i for i in range(len(shape)) if spec[i] is None and shape[i] % size == 0]
  if not free:
    return named
  spec[max(free, key=lambda i: (shape[i], -i))] = axis
  return NamedSharding(named.mesh, P(*spec), memory_kind=named.memory_kind)


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
