"""E-VQA: 8x1, 4x2 and 2x4 meshes give the same losses (tests/mesh_equivalence.py; a module of its own so that
the xdist workers share the tasks' compiles)."""

import pytest

import mesh_equivalence

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_meshes_8x1_4x2_2x4_give_the_same_losses(monkeypatch):
  mesh_equivalence.assert_meshes_give_the_same_losses(mesh_equivalence.config_in_repo("evqa", monkeypatch))
