"""Every config file and variant builds; durations convert in one vocabulary; unknown variants are refused."""

import glob
import importlib.util
import itertools
import os
import sys

import ml_collections
import pytest

from evqa_jax import projects
from evqa_jax.train import durations

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
CONFIGS = sorted(p for p in glob.glob(os.path.join(REPO, "configs", "*.py"))
                 if os.path.basename(p) not in ("__init__.py", "common.py") and not p.endswith("_common.py"))


def _load(path):
  spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_every_variant_builds(path):
  module = _load(path)
  variants = sorted(module.VARIANTS)  # every config file declares its variants (launch/*.py --help lists them)
  built = 0
  for r in range(0, 3):
    for combo in itertools.combinations(variants, r):
      if _foreign(module, combo):
        with pytest.raises(ValueError, match=r"has no \S+ counterpart and does not combine with '\w+'"):
          module.get_config(",".join(combo))
        continue
      try:
        config = module.get_config(",".join(combo) or None)
      except ValueError as e:  # a pair the config refuses by name (e.g. violin's glove with crossmodal)
        assert "not combine" in str(e), (path, combo, e)  # "does not combine", "they do not combine"
        continue
      assert isinstance(config, ml_collections.ConfigDict)
      assert config.task in projects.TASKS
      # Exactly one duration unit is set for the total.
      total = [k for k in ("total_steps", "total_epochs", "total_examples") if config.get(k) is not None]
      assert len(total) == 1, (path, combo, total)
      assert config.batch_size > 0
      built += 1
  assert built >= 1
  with pytest.raises(ValueError, match="unknown variant"):
    module.get_config("no_such_variant")


def _foreign(module, combo) -> bool:
  """`combo` picks an OVQA backbone and holds a variant of another backbone's own (configs/ovqa_common.py BACKBONES:
  FrozenBiLM's cvqa_mlp or xxlarge with justask or allinone)."""
  if "ovqa_common" not in open(module.__file__).read():
    return False
  backbones = importlib.import_module("configs.ovqa_common").BACKBONES
  picked = [m for name, m in backbones.items() if name in combo] or [next(iter(backbones.values()))]
  return any(set(combo) & (m.OWN_VARIANTS - picked[0].OWN_VARIANTS) for m in backbones.values())


def test_durations_vocabulary():
  c = ml_collections.ConfigDict(dict(total_steps=None, total_epochs=2.5, total_examples=None))
  assert durations.to_steps(c, "total", steps_per_epoch=10, batch_size=32) == 25
  c = ml_collections.ConfigDict(dict(total_steps=None, total_epochs=None, total_examples=100))
  assert durations.to_steps(c, "total", steps_per_epoch=10, batch_size=32) == 4  # ceil(100 / 32)
  c = ml_collections.ConfigDict(dict(total_steps=7, total_epochs=1, total_examples=None))
  with pytest.raises(ValueError, match="set only one"):
    durations.to_steps(c, "total", steps_per_epoch=10, batch_size=32)
  c = ml_collections.ConfigDict(dict(eval_every_steps=None))
  assert durations.to_steps(c, "eval_every", steps_per_epoch=10, batch_size=32, required=False) is None
  for bad, msg in (("10", "is not a number"), (2.5, "is not a whole number"), (-1, "is negative")):
    c = ml_collections.ConfigDict(dict(total_steps=bad))
    with pytest.raises(ValueError, match=f"config.total_steps = .* {msg}"):
      durations.to_steps(c, "total", steps_per_epoch=10, batch_size=32)


def test_durations_switch_units_from_the_command_line(tmp_path):
  # The demo counts epochs; a user switches to steps on the command line (None unsets a duration field).
  import subprocess
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  code = ("import sys; from absl import flags; from ml_collections import config_flags; "
          "config_flags.DEFINE_config_file('config'); flags.FLAGS(sys.argv); c = flags.FLAGS.config; "
          "print(c.total_steps, c.total_epochs, c.checkpoint_every_epochs)")
  out = subprocess.run([sys.executable, "-c", code, "--config=configs/ovqa_msrvtt.py:demo", "--config.total_steps=20",
                        "--config.total_epochs=None", "--config.checkpoint_every_epochs=0.5"],
                       cwd=repo, capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONPATH=repo))
  assert out.stdout.split() == ["20", "None", "0.5"]


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_model_keys_are_the_model_fields(path):
  """`Model(**config.model)`: every key of config.model is a field of the project's model class (no hand mapping)."""
  import dataclasses
  module = _load(path)
  variants = sorted(module.VARIANTS)
  for r in range(0, 2):
    for combo in itertools.combinations(variants, r):
      if _foreign(module, combo):
        continue
      config = module.get_config(",".join(combo) or None)
      if config.task == "ovqa":  # the model of the backbone's table entry
        from evqa_jax.projects.ovqa import backbones
        cls = backbones.backbone_class(config.model.backbone).model_class
      else:
        model_module = importlib.import_module(f"evqa_jax.projects.{config.task}.model")
        cls = getattr(model_module, "model_class", lambda c: model_module.Model)(config)
      fields = {f.name for f in dataclasses.fields(cls)} - {"parent", "name"}
      assert set(config.model) <= fields, (path, combo, sorted(set(config.model) - fields))


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_experiment_identity_survives_a_json_round_trip(path):
  """A resumed run compares its identity with the one read back from the checkpoint's JSON: tuple-valued entries
  (config.trainable) must not read as a different experiment."""
  import json
  from evqa_jax.runs import workdir
  identity = workdir.config_identity(_load(path).get_config())
  assert "trainable" in identity and "pretrained" in identity
  assert workdir.identity_diffs(identity, json.loads(json.dumps(identity))) == []


@pytest.mark.parametrize("name", ["evqa_gen", "evqa_mcq"])
def test_evqa_paper_configs_enable_the_features_the_demo_needed(name):
  """Evidence readout with the mask's silhouette, mask descriptors in the temporal head and factorised masks (README,
  E-VQA: what took the demo from 49 to 76 % answer accuracy) are on for real data too, not only in :demo."""
  m = _load(os.path.join(REPO, "configs", f"{name}.py")).get_config().model
  assert m.frame_encoder == "clip" and m.evidence_readout and m.frame_descriptors and m.factorized_masks
  assert m.shape_window > 0 and m.shape_radius > 0


def test_ovqa_xxlarge_variant_is_deberta_v2_xxlarge():
  """`:xxlarge`: DeBERTa-v2-xxlarge (1.5B; hidden 1536, 48 layers, 24 heads, FFN 6144, vocab 128100, relative
  attention as xlarge); with `shapes_only` its architecture needs no checkpoint (traced only, nothing compiled)."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  from configs import ovqa_msrvtt
  from evqa_jax.models import encoders
  from evqa_jax.models import deberta_v2
  from evqa_jax.train import partition
  c = ovqa_msrvtt.get_config("xxlarge")
  assert c.pretrained.dir == "~/models/deberta-v2-xxlarge" and c.pretrained.shape is None
  assert not c.pretrained.init_from_required  # FrozenBiLM released no xxlarge checkpoint
  c = ovqa_msrvtt.get_config("scale,xxlarge,shapes_only")
  enc = encoders.encoder_config(c.model.encoder, c.pretrained)
  assert enc == deberta_v2.DebertaV2Config.xlarge(num_hidden_layers=48)  # xlarge's layer, twice as many
  assert (enc.hidden_size, enc.num_hidden_layers, enc.num_attention_heads, enc.intermediate_size,
          enc.vocab_size, enc.relative_attention, enc.position_buckets) == (1536, 48, 24, 6144, 128100, True, 256)
  shapes = jax.eval_shape(lambda: deberta_v2.DebertaV2LM(enc).init(
      jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32)))
  n = partition.count_params(nn.meta.unbox(shapes)["params"])
  # Per layer: q, k, v, o (4 H^2 + 4 H), FFN (2 H F + F + H), 2 LayerNorms (4 H); word embeddings V H. The rest is
  # under 5 H^2 + 2 x 512 H + V + 20 H: the conv layer (3 H^2), the MLM transform (H^2), the EMD's absolute and the
  # 2 x 256 relative position embeddings, the MLM bias, LayerNorms. About 1.57B: the model card's "1.5B".
  h, f, v = 1536, 6144, 128100
  per_layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
  assert 48 * per_layer + v * h < n < 48 * per_layer + v * h + 5 * h * h + 2 * 512 * h + v + 20 * h, n
  assert 1.5e9 < n < 1.6e9, n


def test_ovqa_synthetic_variants_name_one_world():
  """Every demo variant's records folder is the one its preset is generated in (ensure_synthetic_world builds
  config.data.synthetic into config.data.dir), for both backbones: nbrworld's world, never the default one."""
  from configs import ovqa_common
  from configs import ovqa_msrvtt
  from data_prep import synthetic_ovqa
  assert set(ovqa_common.SYNTHETIC_WORLDS) == set(synthetic_ovqa.PRESETS)
  for backbone in ("", ",justask"):
    for variant, preset in (("demo", "default"), ("nbrworld", "neighbours"), ("demo,nbrworld", "neighbours"),
                            ("demo,small", "small"), ("demo,scale", "msrvtt_scale")):
      c = ovqa_msrvtt.get_config(variant + backbone)
      assert (c.data.synthetic, c.data.dir) == (preset, ovqa_common.SYNTHETIC_WORLDS[preset]), variant + backbone
  assert len(set(ovqa_common.SYNTHETIC_WORLDS.values())) == len(ovqa_common.SYNTHETIC_WORLDS)
  with pytest.raises(ValueError, match="'nbrworld'.*does not combine with 'small'"):
    ovqa_msrvtt.get_config("nbrworld,small")


def test_ovqa_backbone_tables_agree():
  """The configs' backbone table (configs/ovqa_common.py) and the library's (evqa_jax/projects/ovqa/backbones/) name
  the same backbones; each config entry builds config.model.backbone = its name, picked by the variant of its name
  (none for the default), and the library entry names that variant and its own Flax model."""
  import dataclasses
  from configs import ovqa_common, ovqa_msrvtt
  from evqa_jax.projects.ovqa import backbones
  assert list(ovqa_common.BACKBONES) == list(backbones.BACKBONES)
  for name in backbones.BACKBONES:
    variant = "" if name == ovqa_common.DEFAULT_BACKBONE else name
    cls = backbones.backbone_class(name)
    assert cls.variant == variant and cls.model_class.__module__.startswith("evqa_jax.projects.ovqa."), name
    config = ovqa_msrvtt.get_config(",".join(filter(None, ("tiny", variant))))
    assert config.model.backbone == name
    assert set(config.model) <= {f.name for f in dataclasses.fields(cls.model_class)}
  with pytest.raises(ValueError, match=r"config.model.backbone = 'nope': expected one of \('frozenbilm', 'justask', 'allinone', 'violet'"):
    backbones.backbone_class("nope")
