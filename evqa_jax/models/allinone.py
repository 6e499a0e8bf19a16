"""All-in-one (Wang et al., "All in One: Exploring Unified Video-Language Pre-training", CVPR 2023, arXiv 2203.07303)
in Flax: one ViT over [text tokens; frame patch tokens] with temporal token rolling.

Follows the authors' code (github.com/showlab/all-in-one, AllInOne/modules/allinone_module.py `infer`,
base_vision_transformer.py `VisionTransformer.visual_embed` / `Block`, temporal_roll.py `TemporalRoll(v=0)`,
heads.py `Pooler`) exactly, at every size:
- text: BERT's embeddings (word + position + BERT's own token type 0, LayerNorm eps 1e-12, dropout) of the question
  ids, plus the model's `token_type_embeddings[0]`; repeated for each of the T frames;
- frames: uint8 `[B, T, H, W, 3]` -> /255 -> ImageNet mean/std (their VideoTransform) -> patch conv (with bias) ->
  `[B*T, P, D]` + pos_embed[1:] + temporal_embed[t]; the class token + pos_embed[0] in front (no temporal embedding);
  pos_drop; plus `token_type_embeddings[1]`;
- `x = [text; image]` `[B*T, L + 1 + P, D]`, key mask [text mask; ones]; before every block i (the first included),
  the image part is rolled along time (`temporal_roll`): of its l = 1 + P tokens (class token first), fold = l // 8;
  tokens 1..fold move one frame forward (torch.roll(+1) over T), the last fold tokens one frame back (roll -1), the
  class token and the middle stay. (At fold = 0, l < 8, their `x[:, :, -0:]` is the whole sequence: every image token,
  the class token too, rolls back one frame; kept as they compute it.)
- timm pre-LN blocks: x + drop_path(dropout(attn(norm1(x)))), x + drop_path(mlp(norm2(x))) with LayerNorm eps 1e-6,
  qkv with bias, exact-erf GELU, dropout after GELU and after fc2 (config drop_rate), stochastic depth linear in depth
  from 0 to drop_path_rate (timm's `dpr`); attention with a key-padding mask;
- final `norm` (eps 1e-6), reshape `[B, T, S, D]`, mean over T; `pooler`: tanh(dense(x[:, 0])) of the text [CLS].

Parameter paths (the authors' names, `AllinoneTransformerSS.state_dict()`, in `checkpoint_rules`):
  text_embeddings/{word_embeddings,position_embeddings,token_type_embeddings}/embedding, text_embeddings/LayerNorm
  token_type_embeddings/embedding; patch_embed/{kernel,bias}; cls_token, pos_embed, temporal_embed
  blocks_{i}/{norm1,norm2}, blocks_{i}/attn/{q_proj,k_proj,v_proj,out_proj} (their fused qkv split),
  blocks_{i}/mlp/{fc1,fc2}; norm; pooler/{kernel,bias}.
The blocks reuse the CLIP towers' attention (clip_common.CLIPAttention); the text embeddings are bert.BertEmbeddings.
"""

import dataclasses
from typing import Any, Dict

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from evqa_jax.models import bert, clip_common, hf_utils, layers
from evqa_jax.models.layers import ACTIVATIONS

# Their VideoTransform (backend "a100", the config default): torchvision's ImageNet statistics.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclasses.dataclass(frozen=True)
class AllInOneConfig:
  """The authors' config keys (config.py) that shape the model; `dtype` is the compute dtype."""
  vocab_size: int = 30522
  hidden_size: int = 768
  num_hidden_layers: int = 12  # num_layers
  num_attention_heads: int = 12  # num_heads
  mlp_ratio: int = 4
  image_size: int = 224
  patch_size: int = 16
  num_frames: int = 3
  max_text_len: int = 40  # BERT position embeddings
  drop_rate: float = 0.1  # dropout of the text embeddings, pos_drop, the blocks' projections and MLP
  drop_path_rate: float = 0.1  # timm VisionTransformer's default (the authors do not override it)
  roll_div: int = 8  # TemporalRoll's n_div
  layer_norm_eps: float = 1e-6  # timm's ViT norm_layer
  text_layer_norm_eps: float = 1e-12  # BERT's embeddings LayerNorm
  initializer_range: float = 0.02
  hidden_act: str = "gelu"  # nn.GELU(): exact erf
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  remat: str = "none"  # per-block jax.checkpoint policy (layers.REMAT_POLICIES)

  def __post_init__(self):
    layers.check_remat(self.remat)
    layers.check_encoder_config(self)
    if self.image_size % self.patch_size:
      raise ValueError(f"AllInOneConfig: image_size {self.image_size} is not a multiple of patch_size "
                       f"{self.patch_size}")
    if self.num_frames < 1 or self.roll_div < 1:
      raise ValueError(f"AllInOneConfig: num_frames {self.num_frames} and roll_div {self.roll_div} must be >= 1")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @property
  def intermediate_size(self) -> int:
    return self.hidden_size * self.mlp_ratio

  @property
  def grid(self) -> int:
    return self.image_size // self.patch_size

  @property
  def num_patches(self) -> int:
    return self.grid * self.grid

  @property
  def text_config(self) -> bert.BertConfig:
    """Their `BertConfig` for `BertEmbeddings` (max_position_embeddings = max_text_len, dropout drop_rate)."""
    return bert.BertConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size, num_hidden_layers=1,
                           num_attention_heads=self.num_attention_heads, intermediate_size=self.intermediate_size,
                           max_position_embeddings=self.max_text_len, layer_norm_eps=self.text_layer_norm_eps,
                           hidden_dropout_prob=self.drop_rate, attention_probs_dropout_prob=self.drop_rate,
                           initializer_range=self.initializer_range, dtype=self.dtype, param_dtype=self.param_dtype)

  @classmethod
  def from_dict(cls, d: Dict[str, Any], **overrides) -> "AllInOneConfig":
    """Our field names or the authors' config keys (num_layers, num_heads, vit's patch size); others ignored."""
    d = dict(d)
    for theirs, ours in (("num_layers", "num_hidden_layers"), ("num_heads", "num_attention_heads")):
      if theirs in d:
        d.setdefault(ours, d.pop(theirs))
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - names)
    if unknown:
      raise ValueError(f"AllInOneConfig: unknown override(s) {unknown}; fields are {sorted(names)}")
    kwargs = {k: v for k, v in d.items() if k in names}
    kwargs.update(overrides)
    return cls(**kwargs)


def temporal_roll(x, num_frames: int, roll_div: int = 8):
  """The authors' TemporalRoll(v=0) on image tokens `[B*T, l, C]` (class token first): see the module docstring."""
  nt, length, c = x.shape
  x = x.reshape(nt // num_frames, num_frames, length, c)
  fold = length // roll_div
  if fold == 0:  # their out[:, :, -0:] = roll(x[:, :, -0:], -1): everything rolls back one frame
    out = jnp.roll(x, -1, axis=1)
  else:
    out = jnp.concatenate([x[:, :, :1], jnp.roll(x[:, :, 1:fold + 1], 1, axis=1), x[:, :, fold + 1:length - fold],
                           jnp.roll(x[:, :, length - fold:], -1, axis=1)], axis=2)
  return out.reshape(nt, length, c)


def drop_path(x, rate: float, deterministic: bool, module: nn.Module):
  """timm's stochastic depth: each row of x (an example-frame) kept with p 1 - rate and scaled by 1 / (1 - rate)."""
  if deterministic or rate == 0.0:
    return x
  keep = 1.0 - rate
  mask = jax.random.bernoulli(module.make_rng("dropout"), keep, (x.shape[0],) + (1,) * (x.ndim - 1))
  return jnp.where(mask, x / keep, 0.0).astype(x.dtype)


class Mlp(nn.Module):
  """timm's Mlp: fc1 -> GELU -> dropout -> fc2 -> dropout."""
  config: AllInOneConfig

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    cfg = self.config
    h = ACTIVATIONS[cfg.hidden_act](layers.encoder_dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "fc1")(x))
    h = nn.Dropout(cfg.drop_rate)(h, deterministic=deterministic)
    h = layers.encoder_dense(cfg, cfg.hidden_size, ("mlp", "embed"), "fc2")(h)
    return nn.Dropout(cfg.drop_rate)(h, deterministic=deterministic)


class Block(nn.Module):
  """timm's pre-LN ViT block with the CLIP towers' attention (q/k/v/out projections with bias)."""
  config: AllInOneConfig
  drop_path_rate: float = 0.0

  @nn.compact
  def __call__(self, x, bias, deterministic: bool = True):
    cfg = self.config
    h = clip_common.CLIPAttention(cfg, name="attn")(layers.encoder_layer_norm(cfg, "norm1")(x), bias)
    h = nn.Dropout(cfg.drop_rate)(h, deterministic=deterministic)  # proj_drop
    x = x + drop_path(h, self.drop_path_rate, deterministic, self)
    h = Mlp(cfg, name="mlp")(layers.encoder_layer_norm(cfg, "norm2")(x), deterministic)
    x = x + drop_path(h, self.drop_path_rate, deterministic, self)
    return nn.with_logical_constraint(x, ("batch", "length", "embed"))


class AllInOne(nn.Module):
  """frames uint8 `[B, T, H, W, 3]`, text ids / mask `[B, L]` -> {"hidden": `[B, L + 1 + P, D]` (after the final
  norm, mean over frames), "cls_feats": `[B, D]` (the pooler on the text [CLS])}."""
  config: AllInOneConfig

  def setup(self):
    cfg = self.config
    init = lambda axes: layers.encoder_init(cfg, axes)
    self.text_embeddings = bert.BertEmbeddings(cfg.text_config)
    self.token_type_embeddings = nn.Embed(2, cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                                          embedding_init=init((None, "embed")))
    self.patch_embed = nn.Conv(cfg.hidden_size, (cfg.patch_size, cfg.patch_size),
                               strides=(cfg.patch_size, cfg.patch_size), padding="VALID", dtype=cfg.dtype,
                               param_dtype=cfg.param_dtype, kernel_init=init((None, None, None, "embed")),
                               bias_init=layers.zeros(("embed",)))
    self.cls_token = self.param("cls_token", init((None, None, "embed")), (1, 1, cfg.hidden_size), cfg.param_dtype)
    self.pos_embed = self.param("pos_embed", init((None, None, "embed")), (1, cfg.num_patches + 1, cfg.hidden_size),
                                cfg.param_dtype)
    self.temporal_embed = self.param("temporal_embed", layers.zeros((None, None, "embed")),
                                     (1, cfg.num_frames, cfg.hidden_size), cfg.param_dtype)
    self.pos_drop = nn.Dropout(cfg.drop_rate)
    block = layers.maybe_remat(Block, cfg.remat, static_argnums=(3,))
    rates = np.linspace(0.0, cfg.drop_path_rate, cfg.num_hidden_layers) if cfg.num_hidden_layers else []
    self.blocks = [block(cfg, float(r), name=f"blocks_{i}") for i, r in enumerate(rates)]
    self.norm = layers.encoder_layer_norm(cfg, "norm")
    self.pooler = layers.encoder_dense(cfg, cfg.hidden_size, ("embed", "mlp"), "pooler")

  def visual_embed(self, frames, deterministic: bool = True):
    """uint8 `[B, T, H, W, 3]` -> `[B*T, 1 + P, D]` (class token, then the patches row-major)."""
    cfg = self.config
    b, t = frames.shape[:2]
    if frames.shape[1:] != (cfg.num_frames, cfg.image_size, cfg.image_size, 3):
      raise ValueError(f"All-in-one: frames have shape {frames.shape}, expected [batch, {cfg.num_frames}, "
                       f"{cfg.image_size}, {cfg.image_size}, 3] (config.data.num_frames / frame_size)")
    x = frames.reshape((b * t,) + frames.shape[2:]).astype(jnp.float32) / 255.0
    x = ((x - jnp.asarray(IMAGENET_MEAN)) / jnp.asarray(IMAGENET_STD)).astype(cfg.dtype)
    patches = self.patch_embed(x).reshape(b * t, cfg.num_patches, cfg.hidden_size)
    pos = self.pos_embed.astype(cfg.dtype)
    temporal = jnp.tile(self.temporal_embed.astype(cfg.dtype)[0][:, None, :], (b, 1, 1))  # [B*T, 1, D]
    patches = patches + pos[:, 1:] + temporal
    cls = jnp.broadcast_to((self.cls_token + self.pos_embed[:, :1]).astype(cfg.dtype), (b * t, 1, cfg.hidden_size))
    return self.pos_drop(jnp.concatenate([cls, patches], axis=1), deterministic=deterministic)

  def __call__(self, frames, text_ids, text_mask, deterministic: bool = True):
    cfg = self.config
    b, t = frames.shape[0], cfg.num_frames
    text = self.text_embeddings(text_ids, jnp.zeros_like(text_ids), deterministic=deterministic)
    text = text + self.token_type_embeddings(jnp.zeros_like(text_ids))
    image = self.visual_embed(frames, deterministic)
    image = image + self.token_type_embeddings(jnp.ones(image.shape[:2], jnp.int32))
    text = jnp.repeat(text, t, axis=0)
    mask = jnp.concatenate([jnp.repeat(text_mask, t, axis=0), jnp.ones(image.shape[:2], text_mask.dtype)], axis=1)
    bias = jnp.where(mask > 0, 0.0, jnp.finfo(jnp.float32).min)[:, None, None, :]
    x = jnp.concatenate([text, image.astype(text.dtype)], axis=1)
    n_text = text_ids.shape[1]
    for blk in self.blocks:
      x = jnp.concatenate([x[:, :n_text], temporal_roll(x[:, n_text:], t, cfg.roll_div)], axis=1)
      x = blk(x, bias, deterministic)
    x = self.norm(x)
    x = x.reshape(b, t, x.shape[1], x.shape[2]).astype(jnp.float32).mean(axis=1).astype(cfg.dtype)
    return {"hidden": x, "cls_feats": jnp.tanh(self.pooler(x[:, 0]))}


# ------------------------------------------------------------------------------------------ weight import


def checkpoint_rules(config: AllInOneConfig, ours: str = "", theirs: str = "") -> Dict[str, hf_utils.Rule]:
  """Our flat param path (under `ours`) -> rule over the authors' state dict (`AllinoneTransformerSS.state_dict()`,
  keys under `theirs`): their `transformer.*` ViT, `text_embeddings.*`, `token_type_embeddings`, `pooler.dense`."""
  d, nh, hd = config.hidden_size, config.num_attention_heads, config.head_dim
  rule, lin = hf_utils.Rule, hf_utils.linear_kernel
  vit = f"{theirs}transformer."
  rules = {f"{ours}{k}": rule((f"{theirs}text_{v.keys[0]}",), v.fn) for k, v in bert.hf_rules(config.text_config).items()
           if k.startswith("embeddings/")}
  rules = {k.replace(f"{ours}embeddings/", f"{ours}text_embeddings/"): v for k, v in rules.items()}
  rules.update({
      f"{ours}token_type_embeddings/embedding": rule((f"{theirs}token_type_embeddings.weight",)),
      # torch Conv2d [out, in, kh, kw] -> flax [kh, kw, in, out]
      f"{ours}patch_embed/kernel": rule((f"{vit}patch_embed.proj.weight",),
                                        lambda w: np.ascontiguousarray(w.transpose(2, 3, 1, 0))),
      f"{ours}patch_embed/bias": rule((f"{vit}patch_embed.proj.bias",)),
      f"{ours}cls_token": rule((f"{vit}cls_token",)),
      f"{ours}pos_embed": rule((f"{vit}pos_embed",)),
      f"{ours}temporal_embed": rule((f"{vit}temporal_embed",)),
      f"{ours}norm/scale": rule((f"{vit}norm.weight",)),
      f"{ours}norm/bias": rule((f"{vit}norm.bias",)),
      f"{ours}pooler/kernel": rule((f"{theirs}pooler.dense.weight",), lin),
      f"{ours}pooler/bias": rule((f"{theirs}pooler.dense.bias",)),
  })
  for i in range(config.num_hidden_layers):
    o, t = f"{ours}blocks_{i}", f"{vit}blocks.{i}"
    for j, name in enumerate(("q_proj", "k_proj", "v_proj")):  # their qkv: [3D, D] rows q, k, v
      rules[f"{o}/attn/{name}/kernel"] = rule((f"{t}.attn.qkv.weight",),
                                              lambda w, j=j: lin(w[j * d:(j + 1) * d]).reshape(d, nh, hd))
      rules[f"{o}/attn/{name}/bias"] = rule((f"{t}.attn.qkv.bias",), lambda b, j=j: b[j * d:(j + 1) * d].reshape(nh, hd))
    rules[f"{o}/attn/out_proj/kernel"] = rule((f"{t}.attn.proj.weight",), lambda w: lin(w).reshape(nh, hd, d))
    rules[f"{o}/attn/out_proj/bias"] = rule((f"{t}.attn.proj.bias",))
    for name in ("fc1", "fc2"):
      rules[f"{o}/mlp/{name}/kernel"] = rule((f"{t}.mlp.{name}.weight",), lin)
      rules[f"{o}/mlp/{name}/bias"] = rule((f"{t}.mlp.{name}.bias",))
    for name in ("norm1", "norm2"):
      rules[f"{o}/{name}/scale"] = rule((f"{t}.{name}.weight",))
      rules[f"{o}/{name}/bias"] = rule((f"{t}.{name}.bias",))
  return rules


# Keys of their checkpoints that no All-in-one VideoQA model reads: buffers, pretraining heads (MLM, ITM, MPP, the
# contrastive projections, VCOP) and the other downstream heads.
CHECKPOINT_IGNORE = (r"position_ids$", r"^(mlm_score|itm_score|mpp_score|txt_proj|vid_proj|vcop_classifier|"
                     r"rank_output|rank_output_2|mc_vqa_classifier|nlvr2_classifier)\.", r"^transformer\.head\.",
                     r"^transformer\.pre_logits\.", r"^transformer\.mask_token$")


def read_checkpoint(path: str, trust_pickles: bool = False) -> Dict[str, np.ndarray]:
  """The authors' released checkpoint: a PyTorch Lightning .ckpt (its `state_dict`; a pickle, read with torch's
  weights_only unpickler unless config.trust_pickles) or a safetensors export of that state dict. "module." / "model."
  prefixes are stripped. ValueError when it holds no All-in-one ViT."""
  ckpt = hf_utils.read_checkpoint(path, state_dict_key=None, trust_pickles=trust_pickles)
  for prefix in ("module.", "model."):
    ckpt = hf_utils.strip_prefix(ckpt, prefix)
  if "transformer.patch_embed.proj.weight" not in ckpt or "text_embeddings.word_embeddings.weight" not in ckpt:
    raise ValueError(f"{path}: not an All-in-one checkpoint: no transformer.patch_embed.proj.weight / "
                     f"text_embeddings.word_embeddings.weight (keys: {sorted(ckpt)[:6]} ...)")
  return ckpt


def inflate_temporal_embed(ckpt: Dict[str, np.ndarray], num_frames: int) -> Dict[str, np.ndarray]:
  """Their `_inflate_positional_embeds` ('zeros'): a temporal_embed trained with more frames is cut to num_frames,
  one with fewer is padded with zeros."""
  key = "transformer.temporal_embed"
  if key in ckpt and ckpt[key].shape[1] != num_frames:
    old = ckpt[key]
    new = np.zeros((old.shape[0], num_frames, old.shape[2]), old.dtype)
    n = min(num_frames, old.shape[1])
    new[:, :n] = old[:, :n]
    ckpt = dict(ckpt, **{key: new})
  return ckpt
