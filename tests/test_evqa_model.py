"""E-VQA model pieces: CLIP vision parity with Hugging Face, frame encoder, evidence heads, sharding, learning."""

import os
import tempfile

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import common
from evqa_jax.models import bert
from evqa_jax.models import clip_vision
from evqa_jax.models import evidence_heads
from evqa_jax.projects.evqa import model as evqa_model
from evqa_jax.projects.evqa import frame_encoder
from evqa_jax.train import sharding
from hf_towers import saved_tiny_model


# ------------------------------------------------------------------------------------------------ CLIP


@pytest.fixture(scope="module")
def hf_clip_dir():
  pytest.importorskip("torch")
  from transformers import CLIPVisionConfig, CLIPVisionModel
  cfg = CLIPVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         image_size=16, patch_size=4, layer_norm_eps=1e-5)
  return saved_tiny_model(CLIPVisionModel, cfg, "tiny_clip_")


def _assert_clip_vision_matches(path, hf_model, x):
  """Our import of the CLIP folder `path` (nothing missing, nothing unused) computes `hf_model`'s last hidden state
  and pooled output on the pixels `x` `[n, 3, S, S]` to 1e-5 (fp32) -> our config of the folder."""
  import torch
  cfg = clip_vision.CLIPVisionConfig.from_hf_dir(path)
  params, report = clip_vision.load_hf_params(cfg, path)
  assert not report.missing and not report.unused
  with torch.no_grad():
    ref = hf_model.eval()(pixel_values=torch.from_numpy(x))
  out = jax.jit(clip_vision.CLIPVisionModel(cfg).apply)({"params": params}, jnp.asarray(x.transpose(0, 2, 3, 1)))
  np.testing.assert_allclose(np.asarray(out["last_hidden_state"]), ref.last_hidden_state.numpy(), atol=1e-5, rtol=0)
  np.testing.assert_allclose(np.asarray(out["pooler_output"]), ref.pooler_output.numpy(), atol=1e-5, rtol=0)
  return cfg


def test_clip_vision_matches_hugging_face(hf_clip_dir):
  path, hf_model = hf_clip_dir
  cfg = _assert_clip_vision_matches(path, hf_model, np.random.RandomState(0).randn(3, 3, 16, 16).astype(np.float32))
  assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.patch_size, cfg.num_patches) == (32, 2, 4, 16)


def test_clip_import_checks_shapes_and_full_clip_prefix(hf_clip_dir):
  path, hf_model = hf_clip_dir
  from evqa_jax.models import hf_utils
  cfg = clip_vision.CLIPVisionConfig.from_hf_dir(path)
  # A full CLIPModel state dict: "vision_model." prefix plus a text tower that must be ignored.
  sd = {"vision_model." + k: v.numpy() for k, v in hf_model.state_dict().items()}
  sd["text_model.embeddings.token_embedding.weight"] = np.zeros((10, 32), np.float32)
  sd["logit_scale"] = np.zeros((), np.float32)
  d = tempfile.mkdtemp(prefix="full_clip_")
  from safetensors.numpy import save_file
  save_file({k: np.ascontiguousarray(v) for k, v in sd.items()}, os.path.join(d, "model.safetensors"))
  params, report = clip_vision.load_hf_params(cfg, d)
  assert not report.unused and len(report.loaded) == len(hf_utils.flatten_params(params))
  wrong = clip_vision.CLIPVisionConfig.from_hf_dir(path, intermediate_size=40)
  with pytest.raises(ValueError, match=r"encoder_layers_0/mlp/fc1/(kernel|bias)"):
    clip_vision.load_hf_params(wrong, path)


def test_clip_frame_encoder_normalises_and_drops_class_token(hf_clip_dir):
  path, _ = hf_clip_dir
  cfg = clip_vision.CLIPVisionConfig.from_hf_dir(path)
  params, _ = clip_vision.load_hf_params(cfg, path)
  frames = np.random.RandomState(1).randint(0, 256, size=(2, 3, 16, 16, 3)).astype(np.uint8)
  feats = jax.jit(clip_vision.ClipFrameEncoder(cfg).apply)({"params": {"clip": params}}, jnp.asarray(frames))
  assert feats.shape == (2, 3, 16, 32)
  x = (frames.reshape(6, 16, 16, 3) / 255.0 - np.asarray(clip_vision.CLIP_MEAN)) / np.asarray(clip_vision.CLIP_STD)
  ref = jax.jit(clip_vision.CLIPVisionModel(cfg).apply)({"params": params}, jnp.asarray(x, jnp.float32))
  np.testing.assert_allclose(np.asarray(feats).reshape(6, 16, 32), np.asarray(ref["last_hidden_state"][:, 1:]),
                             atol=1e-5)


# ------------------------------------------------------------------------------------------------ frame encoder


@pytest.mark.parametrize("patch,stride,grid", [(4, 0, (4, 4)), (4, 2, (8, 8)), (8, 4, (4, 4))])
def test_frame_encoder_grid(patch, stride, grid):
  enc = frame_encoder.FrameEncoder(dim=8, patch_size=patch, num_blocks=1, image_size=(16, 16), output_stride=stride)
  frames = jnp.asarray(np.random.RandomState(0).randint(0, 256, (2, 3, 16, 16, 3)), jnp.uint8)
  params = jax.jit(enc.init)(jax.random.key(0), frames)
  apply = jax.jit(enc.apply)
  out = apply(params, frames)
  assert enc.grid == grid and out.shape == (2, 3, grid[0] * grid[1], 8)
  # Frames are encoded independently: changing frame 1 of video 0 changes nothing else.
  frames2 = frames.at[0, 1].set(0)
  out2 = apply(params, frames2)
  diff = np.abs(np.asarray(out2 - out)).max(axis=(2, 3))
  assert diff[0, 1] > 1e-3 and np.all(np.delete(diff.reshape(-1), 1) == 0)


def test_pool_frames_hand_computed():
  f = jnp.asarray([[[[1.0, -2.0], [3.0, 0.0]], [[5.0, 5.0], [1.0, 1.0]]]])  # [1, T=2, P=2, D=2]
  pooled = frame_encoder.pool_frames(f, jnp.asarray([[1, 0]]))
  np.testing.assert_allclose(np.asarray(pooled), [[[2.0, -1.0, 3.0, 0.0], [0, 0, 0, 0]]])


# ------------------------------------------------------------------------------------------------ heads

# Jitted once per shape: eagerly, each of their ops would be compiled on its own.
_mask_geometry = jax.jit(evidence_heads.mask_geometry, static_argnums=1,
                         static_argnames=("shape_window", "shape_radius"))
_evidence_readout = jax.jit(evidence_heads.evidence_readout)
_frame_descriptors = jax.jit(evidence_heads.frame_descriptors, static_argnums=2)


def _exact_geometry(grid_logits, window=0, radius=0.0):
  """float64 reference of `mask_geometry` on saturated logits: the exact sigmoid (sigmoid(+-30) is 1 - 9e-14 and
  9e-14, not 1 and 0), the centroid's denominator mass + 1e-4, and the silhouette sampled by scipy's bilinear
  map_coordinates (grid-constant: interpolating towards 0 outside the grid), so the comparisons can be tight."""
  from scipy import ndimage
  b, t, gh, gw = grid_logits.shape
  m = 1.0 / (1.0 + np.exp(-grid_logits.astype(np.float64)))
  conf = m * (m > 0.5)
  mass = conf.sum((2, 3))
  ys, xs = np.mgrid[:gh, :gw]
  c = np.stack([(conf * xs / gw).sum((2, 3)), (conf * ys / gh).sum((2, 3))], -1) / (mass[..., None] + 1e-4)
  off = np.linspace(-radius, radius, window)
  sil = np.asarray([[ndimage.map_coordinates(m[i, k], np.meshgrid(c[i, k, 1] * gh + off, c[i, k, 0] * gw + off,
                                                                   indexing="ij"), order=1, mode="grid-constant")
                     .ravel() for k in range(t)] for i in range(b)])
  return m.reshape(b, t, gh * gw), mass, c, sil


def _seg_inputs(b=8, t=3, p=16, d=8, h=12, seed=0):
  rs = np.random.RandomState(seed)
  return (jnp.asarray(rs.randn(b, t, p, d), jnp.float32), jnp.asarray(rs.randn(b, h), jnp.float32),
          jnp.asarray(rs.randn(b, t, h), jnp.float32))


def test_segmentation_head_upsamples_grid_logits_bilinearly():
  head = evidence_heads.SegmentationHead(grid=(4, 4), out_size=(12, 16), dim=8, num_heads=2, mlp_dim=16)
  feats, q, h_vis = _seg_inputs(b=2)
  params = jax.jit(head.init)(jax.random.key(0), feats, q, h_vis)
  grid_logits, pixel_logits = jax.jit(head.apply)(params, feats, q, h_vis)
  assert grid_logits.shape == (2, 3, 4, 4) and pixel_logits.shape == (2, 3, 12, 16)
  # Bilinear with half-pixel centres: output pixel (y, x) samples the grid at
  # ((y + .5) * 4/12 - .5, (x + .5) * 4/16 - .5).
  g = np.asarray(grid_logits[0, 0], np.float64)

  def sample(yy, xx):
    yy, xx = np.clip(yy, 0, 3), np.clip(xx, 0, 3)
    y0, x0 = int(np.floor(yy)), int(np.floor(xx))
    y1, x1 = min(y0 + 1, 3), min(x0 + 1, 3)
    wy, wx = yy - y0, xx - x0
    return ((1 - wy) * (1 - wx) * g[y0, x0] + (1 - wy) * wx * g[y0, x1] + wy * (1 - wx) * g[y1, x0]
            + wy * wx * g[y1, x1])

  for y, x in [(0, 0), (5, 7), (11, 15), (6, 2)]:
    ref = sample((y + 0.5) * 4 / 12 - 0.5, (x + 0.5) * 4 / 16 - 0.5)
    assert abs(float(pixel_logits[0, 0, y, x]) - ref) < 1e-5


def test_segmentation_head_sharded_matches_single_device():
  assert jax.device_count() >= 8, "tests/conftest.py sets 8 host devices"
  head = evidence_heads.SegmentationHead(grid=(4, 4), out_size=(16, 16), dim=16, num_heads=4, mlp_dim=32,
                                         num_queries=2)
  feats, q, h_vis = _seg_inputs(b=8, d=8)
  params = nn.meta.unbox(jax.jit(head.init)(jax.random.key(1), feats, q, h_vis))
  with jax.default_device(jax.devices()[0]):
    ref = jax.jit(head.apply)(params, feats, q, h_vis)

  cfg = common.base_config()
  rules = sharding.rules_tuple(cfg.logical_axis_rules)
  mesh = sharding.make_mesh((4, 2), ("data", "model"))
  with nn.logical_axis_rules(rules):
    abstract = jax.eval_shape(lambda: head.init(jax.random.key(1), feats, q, h_vis))
    param_shardings = sharding.tree_shardings(abstract, mesh, cfg.logical_axis_rules)["params"]
    batch_shard = sharding.batch_sharding(mesh, cfg.logical_axis_rules)
    sharded_params = jax.device_put(params["params"], param_shardings)
    inputs = [jax.device_put(x, batch_shard) for x in (feats, q, h_vis)]
    fn = jax.jit(lambda p, *a: head.apply({"params": p}, *a), out_shardings=(batch_shard, batch_shard))
    with jax.set_mesh(mesh):
      out = fn(sharded_params, *inputs)
  # The parameters really are split over the model axis and the outputs over the data axis.
  kernel = sharded_params["cross_attention"]["query"]["kernel"]
  assert tuple(kernel.sharding.spec)[:2] == (None, "model") and len(kernel.addressable_shards) == 8
  assert kernel.addressable_shards[0].data.shape == (16, 2, 4)
  assert out[1].sharding.spec[0] == "data" and out[1].addressable_shards[0].data.shape[0] == 2
  for a, b in zip(out, ref):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)


def test_evidence_readout_recovers_motion():
  # One object of one cell moving right by one cell per frame on a 4x4 grid, frames 0..3 all evidence.
  b, t, gh, gw, d = 1, 4, 4, 4, 3
  grid_logits = np.full((b, t, gh, gw), -30.0, np.float32)
  for k in range(t):
    grid_logits[0, k, 1, k] = 30.0
  feats = np.zeros((b, t, gh * gw, d), np.float32)
  feats[..., 0] = 1.0  # every patch has feature (1, 0, 0)
  geometry = _mask_geometry(jnp.asarray(grid_logits), (gh, gw))
  out = _evidence_readout(jnp.asarray(feats), geometry, jnp.full((b, t), 30.0), jnp.ones((b, t)))
  out = np.asarray(out)[0]
  # The documented readout in float64 on the exact geometry, with its 1e-4 / 1e-2 denominators (weights all ~1).
  m, mass, c, _ = _exact_geometry(grid_logits)
  w = 1.0 / (1.0 + np.exp(-30.0))
  fw, tau = w * np.minimum(mass[0], 1.0), np.arange(t)
  fw_sum = fw.sum() + 1e-4
  tau_mean, c_mean = fw @ tau / fw_sum, fw @ c[0] / fw_sum
  velocity = ((tau - tau_mean) * fw) @ (c[0] - c_mean) / (((tau - tau_mean) ** 2 * fw).sum() + 1e-2)
  exact = np.concatenate([[w * m.sum() / (w * m.sum() + 1e-4), 0, 0], 30 * velocity, c_mean,
                          [fw @ mass[0] / fw_sum / (gh * gw)]])
  # The hand-computed meaning: x moves 1/4 of the frame per frame, mean centroid (1.5/4, 1/4), area one cell of 16.
  hand = np.asarray([1, 0, 0, 30 * 0.25, 0, 1.5 / 4, 1 / 4, 1 / 16])
  np.testing.assert_allclose(exact, hand, atol=0.02)
  np.testing.assert_allclose(out, exact, atol=2e-6)  # measured 4.5e-7 (values up to 7.5); bound 2e-6
  # Without the centroid's 1e-4 (the hand values) the mean centroid is 4.7e-5 off: the old 1e-3 could not see it.
  assert np.abs(out[5:7] - hand[5:7]).max() > 10 * 2e-6


def test_evidence_readout_silhouette_is_the_mask_around_its_centroid():
  # A plus-shaped mask (5 cells) centred at (row 4, col 5) of a 9x9 grid on frame 0, at (row 2, col 2) on frame 1:
  # the silhouette on a 3x3 lattice of +-1 cell is the plus wherever it sits.
  b, t, gh, gw = 1, 2, 9, 9
  grid_logits = np.full((b, t, gh, gw), -30.0, np.float32)
  for k, (r, c) in enumerate([(4, 5), (2, 2)]):
    for dr, dc in [(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)]:
      grid_logits[0, k, r + dr, c + dc] = 30.0
  feats = np.zeros((b, t, gh * gw, 2), np.float32)
  geometry = _mask_geometry(jnp.asarray(grid_logits), (gh, gw), shape_window=3, shape_radius=1.0)
  out = _evidence_readout(jnp.asarray(feats), geometry, jnp.full((b, t), 30.0), jnp.ones((b, t)))
  out = np.asarray(out)[0]
  assert out.shape == (evidence_heads.readout_dim(2, 3),) == (2 + 5 + 9,)
  _, mass, _, sil = _exact_geometry(grid_logits, 3, 1.0)
  fw = np.minimum(mass[0], 1.0) / (1.0 + np.exp(-30.0))  # frame weights, each ~1, summed with + 1e-4
  exact = fw @ sil[0] / (fw.sum() + 1e-4)
  np.testing.assert_allclose(exact.reshape(3, 3), [[0, 1, 0], [1, 1, 1], [0, 1, 0]], atol=1e-3)  # the hand case
  np.testing.assert_allclose(out[7:], exact, atol=1e-6)  # measured 1.8e-7; bound 1e-6 (silhouette values 0-1)
  # The centroid's own 1e-4 (a 1e-4 cell shift of the lattice) moves it 1.8e-4 from the hand values: the old 1e-3
  # could not see it.
  assert np.abs(out[7:] - [0, 1, 0, 1, 1, 1, 0, 1, 0]).max() > 10 * 1e-6
  # Half-cell lattice: bilinear samples between cells; a corner sample averages 3 mask cells and 1 background cell.
  geometry = _mask_geometry(jnp.asarray(grid_logits[:, :1]), (gh, gw), shape_window=3, shape_radius=0.5)
  out = np.asarray(_evidence_readout(jnp.asarray(feats[:, :1]), geometry, jnp.full((b, 1), 30.0),
                                                   jnp.ones((b, 1))))[0]
  exact = _exact_geometry(grid_logits[:, :1], 3, 0.5)[3][0, 0] * fw[0] / (fw[0] + 1e-4)
  np.testing.assert_allclose(exact.reshape(3, 3), [[0.75, 1, 0.75], [1, 1, 1], [0.75, 1, 0.75]], atol=1e-3)
  np.testing.assert_allclose(out[7:], exact, atol=1e-6)  # measured 1.1e-7; bound 1e-6


def test_frame_descriptors_hand_computed():
  # One cell moving right by one cell per frame on a 4x4 grid in frames 0-3, nothing in frame 4.
  grid_logits = np.full((1, 5, 4, 4), -30.0, np.float32)
  for k in range(4):
    grid_logits[0, k, 1, k] = 30.0
  geometry = _mask_geometry(jnp.asarray(grid_logits), (4, 4), shape_window=3, shape_radius=1.0)
  d = np.asarray(_frame_descriptors(geometry, jnp.ones((1, 5)), (4, 4)))[0]
  assert d.shape == (5, 9 + 5)
  _, mass, c, sil = _exact_geometry(grid_logits, 3, 1.0)
  step = np.diff(c[0, :4], axis=0)
  velocity = np.concatenate([step[:1], (step[1:] + step[:-1]) / 2, step[-1:]])  # one-sided at both ends of the run
  exact = np.concatenate([sil[0, :4], c[0, :4], mass[0, :4, None] / 16, 30 * velocity], axis=1)
  # The hand-computed meaning: a lone cell, centroid x 0, 1/4, 1/2, 3/4 and y 1/4, area 1/16, x velocity 30/4.
  np.testing.assert_allclose(exact, np.tile([0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0.25, 1 / 16, 7.5, 0], (4, 1))
                             + np.eye(14)[9] * [[0], [0.25], [0.5], [0.75]], atol=1e-3)
  np.testing.assert_allclose(d[:4], exact, atol=4e-6)  # measured 8.1e-7 (values up to 7.5); bound 4e-6
  # Without the centroid's 1e-4 (the hand values) centroid x is 7.5e-5 off: the old 1e-3 could not see it.
  assert np.abs(d[:4, 9] - [0, 0.25, 0.5, 0.75]).max() > 10 * 4e-6
  np.testing.assert_allclose(d[4], 0.0, atol=1e-6)  # no mask: all zero


def test_factorized_mask_logits_are_the_product_of_probabilities():
  rng = np.random.RandomState(0)
  f = jnp.asarray(rng.randn(2, 3) * 5)
  m = jnp.asarray(rng.randn(2, 3, 4, 4) * 5)
  out = evidence_heads.factorized_mask_logits(f, m)
  want = jax.nn.sigmoid(f)[..., None, None] * jax.nn.sigmoid(m)
  np.testing.assert_allclose(np.asarray(jax.nn.sigmoid(out)), np.asarray(want), atol=1e-6)
  g = jax.grad(lambda f, m: jnp.sum(evidence_heads.factorized_mask_logits(f, m)), argnums=(0, 1))(f, m)
  assert all(np.isfinite(np.asarray(x)).all() for x in g)


def test_temporal_shift_hand_computed():
  # 1 video, 3 frames (the last padded), 1x1 grid, 4 channels: channel 0 comes from t-1, channel 1 from t+1.
  x = np.arange(12, dtype=np.float32).reshape(3, 1, 1, 4) + 1.0  # frame f has channels 4f+1 .. 4f+4
  out = np.asarray(frame_encoder.temporal_shift(jnp.asarray(x), 3, 1, jnp.asarray([[1, 1, 0]])))[:, 0, 0]
  np.testing.assert_array_equal(out, [[0, 6, 3, 4], [1, 0, 7, 8], [5, 0, 11, 12]])
  np.testing.assert_array_equal(np.asarray(frame_encoder.temporal_shift(jnp.asarray(x), 3, 0)), x)
  with pytest.raises(ValueError, match="2 x 3 channels"):
    frame_encoder.temporal_shift(jnp.asarray(x), 3, 3)


def test_frame_differences_hand_computed():
  # 1 video, 4 frames (the last padded), 1x1 pixel, 1 channel with values 1, 3, 7, 100.
  x = jnp.asarray([1.0, 3.0, 7.0, 100.0]).reshape(4, 1, 1, 1)
  out = np.asarray(frame_encoder.frame_differences(x, 4, jnp.asarray([[1, 1, 1, 0]])))[:, 0, 0]
  np.testing.assert_array_equal(out, [[0, 2], [2, 4], [4, 0], [0, 0]])  # (x_t - x_{t-1}, x_{t+1} - x_t)


def test_frame_encoder_with_shift_sees_neighbouring_frames():
  enc = frame_encoder.FrameEncoder(dim=8, patch_size=4, num_blocks=1, image_size=(8, 8), temporal_shift=0.25)
  frames = jnp.asarray(np.random.RandomState(0).randint(0, 255, (1, 3, 8, 8, 3)), jnp.uint8)
  params = jax.jit(enc.init)(jax.random.key(0), frames)
  # conv2 starts at zero (identity blocks); perturb it so the block output depends on its input.
  leaves, treedef = jax.tree_util.tree_flatten(params)
  rng = np.random.RandomState(1)
  params = jax.tree_util.tree_unflatten(treedef, [p + 0.3 * rng.randn(*p.shape) for p in leaves])
  apply = jax.jit(enc.apply)
  base = np.asarray(apply(params, frames))
  changed = np.asarray(apply(params, frames.at[0, 2].set(0)))
  assert np.abs(changed[0, 1] - base[0, 1]).max() > 1e-3  # frame 1 sees frame 2 through the shift
  assert np.abs(changed[0, 0] - base[0, 0]).max() < 1e-6  # frame 0 does not (it sees frames 0 and 1 only)
  still = frame_encoder.FrameEncoder(dim=8, patch_size=4, num_blocks=1, image_size=(8, 8))
  apply = jax.jit(still.apply)
  a = np.asarray(apply(params, frames))
  b = np.asarray(apply(params, frames.at[0, 2].set(0)))
  np.testing.assert_array_equal(a[0, :2], b[0, :2])  # without the shift, frames are independent


def test_answer_head_masks_padded_options():
  head = evidence_heads.AnswerHead(dim=8)
  h = jnp.asarray(np.random.RandomState(0).randn(2, 5, 12), jnp.float32)
  e = jnp.asarray(np.random.RandomState(1).randn(2, 6), jnp.float32)
  valid = jnp.asarray([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
  params = jax.jit(head.init)(jax.random.key(0), h, e, valid)
  logits = np.asarray(jax.jit(head.apply)(params, h, e, valid))
  assert np.all(logits[1, 3:] == -1e9) and np.all(np.abs(logits[:, :3]) < 100)


# ------------------------------------------------------------------------------------------------ whole model


TINY_BERT = dict(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                 max_position_embeddings=64, type_vocab_size=2, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0)


def _tiny_model():
  frame_cfg = dict(dim=8, patch_size=4, num_blocks=1, output_stride=2)
  enc = bert.BertConfig.from_dict(TINY_BERT, num_visual_tokens=4, visual_dim=16, use_adapters=True,
                                  adapter_reduction=4, adapter_dropout=0.0)
  return evqa_model.Model(encoder="bert", encoder_config=enc, use_adapters=True, adapter_reduction=4, dropout=None,
                          frame_encoder="conv", frame=frame_cfg, image_size=(16, 16), temporal_dim=16, seg_dim=8,
                          seg_heads=2, seg_mlp_dim=16, answer_dim=16)


def _tiny_batch(b=4, seed=0):
  rs = np.random.RandomState(seed)
  t, l, c = 4, 10, 5
  frames = rs.randint(0, 60, (b, t, 16, 16, 3)).astype(np.uint8)
  masks = np.zeros((b, t, 16, 16), np.uint8)
  labels = rs.randint(0, c, b)
  for i in range(b):  # a bright square whose colour channel is the answer's parity, present in frames 1..2
    for k in (1, 2):
      frames[i, k, 4:10, 5:11, labels[i] % 3] = 250
      masks[i, k, 4:10, 5:11] = 1
  option_mask = np.zeros((b, c, l), np.int32)
  for k in range(c):
    option_mask[:, k, 4 + k] = 1
  return {"frames": jnp.asarray(frames), "frame_mask": jnp.ones((b, t), jnp.int32),
          "input_ids": jnp.asarray(rs.randint(1, 50, (b, l)), jnp.int32),
          "attention_mask": jnp.ones((b, l), jnp.int32), "token_type_ids": jnp.zeros((b, l), jnp.int32),
          "question_mask": jnp.asarray(np.tile([0, 1, 1, 1] + [0] * (l - 4), (b, 1)), jnp.int32),
          "option_mask": jnp.asarray(option_mask), "option_valid": jnp.ones((b, c), jnp.int32),
          "label": jnp.asarray(labels % 3, jnp.int32),
          "frame_labels": jnp.asarray(np.tile([0.0, 1.0, 1.0, 0.0], (b, 1)), jnp.float32),
          "masks": jnp.asarray(masks)}


def test_model_shapes_and_losses_decrease():
  model = _tiny_model()
  batch = _tiny_batch()
  # Two compiles (init and the train step): run eagerly, each of the model's hundreds of ops would be compiled on its
  # own, and every further jitted function (apply, the loss alone) is another compile of the whole model.
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), batch))["params"]
  out = jax.eval_shape(model.apply, {"params": params}, batch)
  assert out["answer_logits"].shape == (4, 5) and out["frame_logits"].shape == (4, 4)
  assert out["grid_logits"].shape == (4, 4, 8, 8) and out["mask_logits"].shape == (4, 4, 16, 16)

  def loss_fn(p):
    o = model.apply({"params": p}, batch)
    ce = optax.softmax_cross_entropy_with_integer_labels(o["answer_logits"], batch["label"]).mean()
    tb = optax.sigmoid_binary_cross_entropy(o["frame_logits"], batch["frame_labels"]).mean()
    mb = optax.sigmoid_binary_cross_entropy(o["mask_logits"], batch["masks"].astype(jnp.float32)).mean()
    return ce + tb + mb, (ce, tb, mb)

  tx = optax.adam(3e-3)
  opt = tx.init(params)

  @jax.jit
  def step(p, s):
    (l, parts), g = jax.value_and_grad(loss_fn, has_aux=True)(p)
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s, l, parts

  # A step's loss parts are those of the parameters it starts from: step 1's are the initial ones, step 31's those
  # after 30 updates.
  params, opt, _, first = step(params, opt)
  for _ in range(29):
    params, opt, _, _ = step(params, opt)
  _, _, _, last = step(params, opt)
  for a, b in zip(first, last):
    assert float(b) < 0.7 * float(a), (first, last)


def test_grouped_evidence_norm_normalises_feature_and_silhouette_apart_and_passes_geometry():
  rng = np.random.RandomState(0)
  d, s2 = 6, 9
  h = jnp.asarray(rng.randn(2, 3, 8), jnp.float32)
  valid = jnp.ones((2, 3))
  e = rng.randn(2, d + 5 + s2).astype(np.float32)
  grouped = evidence_heads.AnswerHead(16, evidence_norm="grouped", feature_dim=d)
  params = jax.jit(grouped.init)(jax.random.key(0), h, jnp.asarray(e), valid)
  names = set(nn.meta.unbox(params)["params"])
  assert {"evidence_feature_LayerNorm", "evidence_shape_LayerNorm"} <= names and "evidence_LayerNorm" not in names

  applies = {}

  def logits(x, model=grouped, p=params):
    apply = applies.setdefault(id(model), jax.jit(model.apply))
    return np.asarray(apply(p, h, jnp.asarray(x), valid))

  rescaled = e.copy()
  rescaled[:, :d] = 10 * e[:, :d] + 3  # each LayerNorm'd group is invariant to its own scale and shift
  rescaled[:, d + 5:] = 0.2 * e[:, d + 5:] - 1
  # measured 2.1e-5 (LayerNorm's eps makes it not exactly scale-invariant; logits up to 1.5); bound 1e-4
  np.testing.assert_allclose(logits(rescaled), logits(e), atol=1e-4)
  moved = e.copy()
  moved[:, d] += 7.5  # x velocity: passes as it is, so its effect does not depend on the other groups' scale
  moved_rescaled = rescaled.copy()
  moved_rescaled[:, d] += 7.5
  effect = logits(moved) - logits(e)
  assert np.abs(effect).max() > 1e-3
  # measured 2.2e-6 (effects up to 3.9); bound 1e-5
  np.testing.assert_allclose(logits(moved_rescaled) - logits(rescaled), effect, atol=1e-5)
  # One joint LayerNorm: the same velocity step counts for less when the feature values are larger.
  joint = evidence_heads.AnswerHead(16)
  pj = jax.jit(joint.init)(jax.random.key(0), h, jnp.asarray(e), valid)
  joint_gap = np.abs(logits(moved_rescaled, joint, pj) - logits(rescaled, joint, pj)
                     - (logits(moved, joint, pj) - logits(e, joint, pj))).max()
  assert joint_gap > 0.1  # measured 1.55 (the grouped norm's gap above: 2.2e-6)
  with pytest.raises(ValueError, match="evidence_norm"):
    evidence_heads.AnswerHead(16, evidence_norm="grouped").init(jax.random.key(0), h, jnp.asarray(e), valid)
  with pytest.raises(ValueError, match="config.model.evidence_norm"):
    evidence_heads.AnswerHead(16, evidence_norm="per_group").init(jax.random.key(0), h, jnp.asarray(e), valid)


def test_fixture_clip_folder_is_hugging_faces_layout_written_without_torch(tmp_path):
  """`python -m data_prep.fixtures --paper evqa`'s CLIP folder (the E-VQA chain's clip_dir) is written with torch
  unimportable; Hugging Face's CLIPVisionModel loads it with no missing or unexpected key, and our import of it
  computes the same outputs."""
  import subprocess
  import sys
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  path = str(tmp_path / "clip")
  code = ("import sys; sys.modules['torch'] = None; from data_prep import fixtures; "
          f"fixtures.clip_vision_dir({path!r}); print('imported torch:', 'torch' in sys.modules and "
          "sys.modules['torch'] is not None)")
  out = subprocess.run([sys.executable, "-c", code], cwd=repo, env=dict(os.environ, PYTHONPATH=repo),
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0 and out.stdout.strip() == "imported torch: False", out.stderr[-2000:]
  assert sorted(os.listdir(path)) == ["config.json", "model.safetensors"]
  pytest.importorskip("torch")
  from transformers import CLIPVisionModel
  hf_model, info = CLIPVisionModel.from_pretrained(path, output_loading_info=True)
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
  cfg = _assert_clip_vision_matches(path, hf_model, np.random.RandomState(1).randn(2, 3, 32, 32).astype(np.float32))
  assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.image_size, cfg.patch_size) == (16, 1, 32, 8)
