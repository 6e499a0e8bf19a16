"""The OVQA paper's Table 6 Random and CLIP rows: zero-shot baselines over converted OVQA records.

    python launch/ovqa_zero_shot_baselines.py --data RECORDS --baseline random [--seed 0] --out DIR
    python launch/ovqa_zero_shot_baselines.py --data RECORDS --baseline clip --clip-dir CLIP_DIR [--batch-size 256] \
        --out DIR

Both answer each test question from the records' closed vocabulary (vocab.json's vocab_cvqa: convert with
`--cvqa-vocab vocab1000.json` for FrozenBiLM's top-1000 answers, which the paper's 0.1% Random row implies):
  random  one answer drawn uniformly per question (numpy's default_rng(--seed)).
  clip    FrozenBiLM's CLIP baseline (videoqa_clip.py, datasets/videoqa_dataset_clip.py in antoyang/FrozenBiLM):
          for every answer a the text "Question: {q}? Answer: {a}" (q capitalised as the authors do; " Subtitles:
          {s}" appended when the record has subtitles, as their default use_context, which TGIF lacks), CLIP's
          text tower (evqa_jax/models/clip_text.py, a local Hugging Face CLIP folder: CLIPModel or
          CLIPTextModelWithProjection, the OpenAI ViT-L/14 one for the paper's frame features) at 77 tokens, its
          projected end-of-text feature dotted with the question's first frame feature (the records' video[0]: their
          `--max_feats=1`, no normalisation, as `encode_text` and `bmm` there); the highest scoring answer.
Writes DIR/predictions.csv (the official `index,prediction`) and DIR/metrics.json, scored by evqa_jax.evaluate.ovqa
with the records' train.csv / test.csv (docs/ovqa.md, Table 6).
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from evqa_jax import cli  # noqa: E402
from evqa_jax import io as evqa_io  # noqa: E402


def clip_text(question: str, answer: str, subtitles: str) -> str:
  """The text FrozenBiLM's CLIP dataset builds for one candidate (prefix and suffix empty, their defaults)."""
  q = question.capitalize().strip()
  if q and q[-1] != "?":
    q += "?"
  text = f" Question: {q} Answer: {answer}"
  if subtitles:
    text += f" Subtitles: {subtitles}"
  return text.strip()


def _test_examples(data: str) -> list[dict]:
  from evqa_jax.data import records, source  # pylint: disable=g-import-not-at-top
  src = source.TFRecordDataSource(records.split_paths(data, "test"), records.load_spec(data, "test"))
  return [src[i] for i in range(len(src))]


class ClipScorer:
  """CLIP text features of texts, jitted at a fixed [batch, 77] shape."""

  def __init__(self, clip_dir: str, batch_size: int):
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    from evqa_jax import spm_tokenizer  # pylint: disable=g-import-not-at-top
    from evqa_jax.models import clip_text as clip_text_lib  # pylint: disable=g-import-not-at-top
    self.config = clip_text_lib.CLIPTextConfig.from_hf_dir(clip_dir)
    params, _ = clip_text_lib.load_hf_params(self.config, clip_dir)
    self.tokenizer = spm_tokenizer.load_tokenizer(clip_dir, config_key="--clip-dir")
    self.length, self.batch_size = self.config.max_position_embeddings, batch_size
    model = clip_text_lib.CLIPTextModel(self.config)
    self._embed = jax.jit(lambda ids: model.apply({"params": params}, ids)["text_embeds"])
    self._jnp = jnp

  def __call__(self, texts: list[str]) -> np.ndarray:
    enc = self.tokenizer(texts, truncation=True, max_length=self.length, padding="max_length")
    ids = np.asarray(enc["input_ids"], np.int32)
    out = []
    for start in range(0, len(ids), self.batch_size):
      chunk = ids[start:start + self.batch_size]
      pad = self.batch_size - len(chunk)
      chunk = np.concatenate([chunk, np.zeros((pad, self.length), np.int32)]) if pad else chunk
      out.append(np.asarray(self._embed(self._jnp.asarray(chunk)))[:len(chunk) - pad])
    return np.concatenate(out)


def run(data: str, baseline: str, out_dir: str, clip_dir: str | None = None, seed: int = 0,
        batch_size: int = 256) -> dict:
  from evqa_jax.evaluate import ovqa as ovqa_eval  # pylint: disable=g-import-not-at-top
  from evqa_jax.projects.ovqa import evaluator  # pylint: disable=g-import-not-at-top
  vocab = evqa_io.load_json(os.path.join(data, "vocab.json"), "answer vocabulary")["vocab_cvqa"]
  if not vocab:
    raise ValueError(f"{data}/vocab.json: vocab_cvqa is empty")
  examples = _test_examples(data)
  if baseline == "random":
    picks = np.random.default_rng(seed).integers(len(vocab), size=len(examples))
  elif baseline == "clip":
    if not clip_dir:
      raise ValueError("--baseline clip needs --clip-dir (a local Hugging Face CLIP folder)")
    scorer = ClipScorer(clip_dir, batch_size)
    picks = []
    for ex in examples:
      video = np.asarray(ex["video"], np.float32)[0]  # the first frame, as their max_feats=1
      if video.shape[0] != scorer.config.projection_dim:
        raise ValueError(f"{data}: frame features are {video.shape[0]}-d but {clip_dir}'s text projection is "
                         f"{scorer.config.projection_dim}-d (the features must come from the same CLIP)")
      texts = [clip_text(str(ex["question"]), a, str(ex["subtitles"])) for a in vocab]
      picks.append(int(np.argmax(scorer(texts) @ video)))
  else:
    raise ValueError(f"--baseline {baseline!r}: expected random or clip")
  evqa_io.makedirs(out_dir)
  pred_path = os.path.join(out_dir, "predictions.csv")
  evaluator.write_predictions(pred_path, [int(ex["index"]) for ex in examples], [vocab[i] for i in picks])
  metrics = ovqa_eval.evaluate_files(os.path.join(data, "train.csv"), os.path.join(data, "test.csv"), pred_path)
  evqa_io.write_json(os.path.join(out_dir, "metrics.json"), metrics)
  return metrics


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--data", required=True, help="converted OVQA records (python -m data_prep.ovqa)")
  p.add_argument("--baseline", required=True, choices=("random", "clip"))
  p.add_argument("--clip-dir", default=None, help="local Hugging Face CLIP folder (config.json, weights, tokenizer)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--batch-size", type=int, default=256, help="texts per CLIP text-tower call")
  p.add_argument("--out", required=True, help="output folder: predictions.csv, metrics.json")
  a = p.parse_args(argv)
  evqa_io.check_args(a, ["out"])
  metrics = run(a.data, a.baseline, a.out, a.clip_dir, a.seed, a.batch_size)
  print(json.dumps({k: metrics[k] for k in ("base", "common", "rare", "unseen", "total", "mAcc") if k in metrics}))
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main))
