"""Tiny Hugging Face towers saved to a folder, for the parity tests of our imports (tests/test_clip_text.py,
tests/test_evqa_model.py)."""

import tempfile

import pytest


def saved_tiny_model(model_class, config, prefix: str):
  """`model_class(config)` (torch seeded 0, eval mode) with its LayerNorm parameters moved off their ones / zeros
  start by 0.1 N(0, 1), so that their import is checked too, saved in a new temporary folder -> (folder, model).
  Skips the test without torch."""
  torch = pytest.importorskip("torch")
  torch.manual_seed(0)
  model = model_class(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  folder = tempfile.mkdtemp(prefix=prefix)
  model.save_pretrained(folder)
  return folder, model
