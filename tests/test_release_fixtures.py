"""The release-shaped fixtures (data_prep/fixtures.py) read by our loaders exactly as the authors' loaders read
the real files: every key used, none left over, dtypes and ids as released."""

import json
import os

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sentencepiece")

from data_prep import fixtures as R  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope="module")
def deberta(tmp_path_factory):
  return R.deberta_v2_dir(str(tmp_path_factory.mktemp("release") / "deberta-v2-xlarge"))


def test_deberta_folder_loads_every_weight(deberta):
  from evqa_jax.models import deberta_v2 as D
  assert sorted(os.listdir(deberta["path"])) == ["config.json", "pytorch_model.bin", "spm.model",
                                                 "tokenizer_config.json"]
  config = D.DebertaV2Config.from_hf_dir(deberta["path"])
  assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (32, 2, deberta["spm_pieces"] + 4)
  params, report = D.load_hf_params(config, deberta["path"])
  assert not report.missing and not report.unused
  np.testing.assert_array_equal(np.asarray(params["deberta"]["embeddings"]["word_embeddings"]["embedding"]),
                                deberta["state_dict"]["deberta.embeddings.word_embeddings.weight"].numpy())


def test_frozenbilm_checkpoint_keys(deberta, tmp_path):
  from evqa_jax.models import deberta_v2 as D
  path = str(tmp_path / "frozenbilm.pth")
  sd = R.frozenbilm_checkpoint(path, deberta["state_dict"], deberta["config"], features_dim=768, n_ans=5)
  ckpt = torch.load(path, map_location="cpu", weights_only=False)
  assert set(ckpt) == {"model", "optimizer", "epoch", "args"} and ckpt["args"].max_feats == 10
  assert ckpt["model"]["deberta.encoder.layer.1.output.adapter.down.weight"].shape == (4, 32)
  config = D.DebertaV2Config.from_hf_dir(deberta["path"], num_visual_tokens=10, visual_dim=768, use_adapters=True,
                                         adapter_reduction=8)
  params, report = D.load_frozenbilm_checkpoint(config, path)
  assert not report.missing
  assert report.unused == ["answer_bias", "answer_embeddings.weight"]
  np.testing.assert_allclose(np.asarray(params["deberta"]["embeddings"]["visual_proj"]["dense"]["kernel"]),
                             sd["deberta.embeddings.linear_video.weight"].numpy().T)


def test_msrvtt_qa_release_converts(tmp_path):
  from data_prep import features as features_lib
  from data_prep import ovqa as prep
  rel = R.msrvtt_qa(str(tmp_path / "MSRVTT-QA"))
  train = pd.read_csv(os.path.join(rel["dir"], "train.csv"))
  assert list(train.columns) == ["question", "answer", "category_id", "video_id", "id", "type"]
  assert train["video_id"].dtype == np.int64 and train["type"].tolist()[:5] == [0, 4, 0, 0, 2]
  raw = torch.load(os.path.join(rel["dir"], "clipvitl14.pth"), weights_only=True)
  assert all(isinstance(k, int) and v.dtype == torch.float16 and v.shape[1] == 768 for k, v in raw.items())
  with features_lib.FeatureStore(os.path.join(rel["dir"], "clipvitl14.pth")) as store:
    np.testing.assert_array_equal(store["7010"], rel["features"][7010])
  summary = prep.convert(rel["dir"], os.path.join(rel["dir"], "clipvitl14.pth"), str(tmp_path / "out"),
                         verbose=False)
  assert {s: v["converted"] for s, v in summary.items()} == {"train": 10, "val": 2, "test": 5}


def test_ovqa_authors_files_layout(tmp_path):
  train = [a for _, a, _ in R.MSRVTT_ROWS["train"]]
  test = [a for _, a, _ in R.MSRVTT_ROWS["test"]]
  rel = R.ovqa_authors_files(str(tmp_path), train, test)
  with open(tmp_path / "test_vocab.json") as f:
    test_vocab = json.load(f)
  assert test_vocab == {"guitar": 0, "red": 1, "song": 2, "night": 3, "man": 4}
  assert rel["train_vocab"]["guitar"] == 0 and rel["train_vocab"]["woman"] == 1  # 3 and 2 train rows
  with open(tmp_path / "ans2cat.json") as f:
    assert json.load(f)["song"] == "unseen"
  edges = torch.load(tmp_path / "answer_graph" / "test_edge_index.pth", weights_only=True)
  x = torch.load(tmp_path / "answer_graph" / "test_x.pth", weights_only=True)
  assert edges.dtype == torch.int64 and edges.shape == (2, 5) and x.dtype == torch.float32 and x.shape == (7, 32)


def test_violin_release_converts(tmp_path):
  from data_prep import violin as prep
  rel = R.violin_release(str(tmp_path / "feat"))
  counts = prep.convert(os.path.join(rel["dir"], "violin_annotation.json"), rel["h5"], str(tmp_path / "out"),
                        verbose=False)
  assert {s: (c["converted_clips"], c["converted_records"]) for s, c in counts.items()} == {
      "train": (2, 6), "validate": (1, 3), "test": (1, 3)}
  from evqa_jax.data import records
  meta = records.load_metadata(str(tmp_path / "out"))
  assert meta["feature_dim"] == 2048


def test_trained_only_checkpoint_over_the_hf_weights(deberta, tmp_path):
  """Most FrozenBiLM checkpoints hold only the trained parameters: the rest must come from the DeBERTa folder."""
  from evqa_jax.models import deberta_v2 as D
  path = str(tmp_path / "frozenbilm_msrvtt.pth")
  sd = R.frozenbilm_checkpoint(path, deberta["state_dict"], deberta["config"], trained_only=True, seed=3)
  assert not any("word_embeddings" in k or "query_proj" in k for k in sd)
  config = D.DebertaV2Config.from_hf_dir(deberta["path"], num_visual_tokens=10, visual_dim=768, use_adapters=True)
  hf, _ = D.load_hf_params(config, deberta["path"])  # linear_video / adapters absent there: initialised
  params, report = D.load_frozenbilm_checkpoint(config, path, hf)
  assert "deberta/encoder/layer_0/attention/self/query_proj/kernel" in report.missing
  np.testing.assert_array_equal(np.asarray(params["deberta"]["encoder"]["layer_0"]["attention"]["self"]["query_proj"]
                                           ["kernel"]),
                                np.asarray(hf["deberta"]["encoder"]["layer_0"]["attention"]["self"]["query_proj"]
                                           ["kernel"]))
  np.testing.assert_allclose(np.asarray(params["deberta"]["encoder"]["layer_1"]["output"]["adapter_ffn"]["up"]["bias"]),
                             sd["deberta.encoder.layer.1.output.adapter.up.bias"].numpy())
  np.testing.assert_allclose(np.asarray(params["deberta"]["encoder"]["LayerNorm"]["scale"]),
                             sd["deberta.encoder.LayerNorm.weight"].numpy())


def test_fixtures_command_writes_every_release_whole(tmp_path, capsys):
  """`python -m data_prep.fixtures --out DIR` writes each paper's release layout under DIR/<paper>/ and never writes
  over an existing one."""
  import h5py
  R.main(["--out", str(tmp_path), "--paper", "violin", "evqa", "ovqa"])
  ann = json.load(open(tmp_path / "violin" / "violin_annotation.json"))
  assert sorted(c["split"] for c in ann.values()) == ["test", "train", "train", "validate"]
  with h5py.File(tmp_path / "violin" / "all_res101_pool5_feat.h5") as f:
    assert sorted(f) == sorted(ann) and all(f[c]["resnet_features"].shape[1] == 2048 for c in ann)
  gen = pd.read_csv(tmp_path / "evqa" / "st_evidence_gen" / "st_evidence_gen.csv")
  assert list(gen.columns) == ["entry_id", "video_id", "video_path", "question", "candidates", "answer", "segment"]
  assert all((tmp_path / "evqa" / "st_evidence_gen" / p).is_file() for p in gen["video_path"])
  cfg = json.load(open(tmp_path / "ovqa" / "models" / "deberta-v2-xlarge" / "config.json"))
  x = torch.load(tmp_path / "ovqa" / "meta_data" / "msrvtt" / "answer_graph" / "train_x.pth", weights_only=True)
  assert x.shape[1] == cfg["hidden_size"]  # the authors' node features are in the LM's hidden size
  ckpt = torch.load(tmp_path / "ovqa" / "models" / "frozenbilm.pth", weights_only=False)
  assert ckpt["model"]["deberta.embeddings.linear_video.weight"].shape == (cfg["hidden_size"], 768)
  assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
  before = sorted(os.listdir(tmp_path / "violin"))
  with pytest.raises(SystemExit):
    R.main(["--out", str(tmp_path), "--paper", "violin"])
  assert "violin already exists" in capsys.readouterr().err and sorted(os.listdir(tmp_path / "violin")) == before
