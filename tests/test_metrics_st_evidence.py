"""ST-Evidence-Gen / MCQ metrics and DAVIS aggregation on hand-computed cases (REFERENCE.md section 3)."""

import math

import numpy as np
import pytest

from evqa_jax.metrics import st_evidence as st


# ---------------------------------------------------------------------------------------------------------------------
# Answer accuracy.


@pytest.mark.parametrize("answer,expected", [
    ("B", True), (" B ", True), ("A", False), ("E", False), ("", False), (None, False), ("b", False),
    ("BB", False), (1, False),
    # The official script compares any non-letter answer as text: the option text itself is right.
    ("dog", True), (" dog", True), ("Dog", False), ("bird", False)])
def test_answer_is_correct(answer, expected):
  assert st.answer_is_correct(answer, ["cat", " dog ", "bird"], "dog") is expected


def test_answer_letters_past_candidates_and_numbers_compare_as_text():
  # "D" has no candidate among 3: it is compared as the text "D" (right only when the answer is "D").
  assert st.answer_is_correct("D", ["x", "y", "z"], "D") and not st.answer_is_correct("D", ["x", "y", "z"], "x")
  # Letters map only A..F; "G" stays text even with 7 candidates.
  assert not st.answer_is_correct("G", list("abcdefg"), "g") and st.answer_is_correct("F", list("abcdefg"), "f")
  # A number is compared through str(): 2 == "2", 2.0 == "2.0".
  assert st.answer_is_correct(2, ["1", "2"], "2") and st.answer_is_correct(2.0, ["x"], "2.0")


def test_parse_candidates_and_gt_segments():
  assert st.parse_candidates("['a b', \"c\", 3]") == ["a b", "c", "3"]
  assert st.parse_segments("[[0, 1.5], [2, 3]]") == [(0.0, 1.5), (2.0, 3.0)]
  assert st.parse_segments([[1, 2]]) == [(1.0, 2.0)]
  assert st.parse_segments("") == [] and st.parse_segments(None) == [] and st.parse_segments("[]") == []
  # Shapes the official ground-truth loader reads: extra elements (first two used), numeric strings, reversed.
  assert st.parse_segments("[[0, 1, 2]]") == [(0.0, 1.0)]
  assert st.parse_segments("[['1.5', 3]]") == [(1.5, 3.0)]
  assert st.parse_segments("[[3, 1]]") == [(3.0, 1.0)]
  # What the official loader silently drops is a malformed ground truth here, named.
  for bad in ("[[0, 1]", "[['a', 1]]", "[[5]]", "[(0, 1)]", "5", "[[0, nan]]", "[[0, inf]]"):
    with pytest.raises(ValueError, match="row 7"):
      st.parse_segments(bad, where="row 7")
  with pytest.raises(ValueError, match="row 3"):
    st.parse_candidates("['a',", where="row 3")


@pytest.mark.parametrize("value,segments,kind", [
    ([[0, 1], [2, 3]], [(0, 1), (2, 3)], None),
    ([0, 1, 2, 3], [(0, 1), (2, 3)], None),                            # flat list of numbers
    ([0, 1, 2], [(0, 1)], None),                                       # odd flat list: last number dropped silently
    ([True, 2], [(1, 2)], None),                                       # booleans are numbers to the official check
    ([{"start": 1, "end": 2}, {"start_time": "3", "end_time": 4.5}], [(1, 2), (3, 4.5)], None),
    ([["1.5", " 2 "], [4, 6, 99, "x"]], [(1.5, 2), (4, 6)], None),     # numeric strings; extra elements ignored
    ([[5, 3]], [(5, 3)], None),                                        # reversed: kept, length 0 later
    ([[0, 1], [2]], [(0, 1)], "malformed_segments"),
    ([[0, 1], "0-1"], [(0, 1)], "malformed_segments"),
    (["0", "1"], [], "malformed_segments"),                            # strings are not a flat list of numbers
    ([{"begin": 0, "end": 1}, {"start": None, "end": 1}], [], "malformed_segments"),
    ([["a", 1], [[0, 1], [2, 3]]], [], "malformed_segments"),
    ([0, [1, 2]], [(1, 2)], "malformed_segments"),
    ([], [], "empty_segments"),
    (None, [], "parse_errors"), ("[[0, 1]]", [], "parse_errors"), ({"start": 0, "end": 1}, [], "parse_errors"),
])
def test_parse_pred_segments_official_shapes(value, segments, kind):
  got, got_kind = st.parse_pred_segments(value)
  assert got == [tuple(map(float, s)) for s in segments] and got_kind == kind


# ---------------------------------------------------------------------------------------------------------------------
# Temporal.


@pytest.mark.parametrize("gt,pred,iou,iop", [
    ([[0, 10]], [[5, 15]], 5 / 15, 0.5),
    # Unmerged pairs: two copies of the same predicted segment count the GT time twice -> IoU = 20 / 10 = 2.
    ([[0, 10]], [[0, 10], [0, 10]], 2.0, 1.0),
    # Overlapping but different predictions: inter = 10 + 5 = 15, union = 10 + 15 - 15 = 10.
    ([[0, 10]], [[0, 10], [5, 10]], 1.5, 1.0),
    ([[0, 2], [4, 6]], [[1, 5]], 2 / 6, 0.5),
    ([[0, 10]], [], 0.0, 0.0),
    ([[0, 10]], [[20, 30]], 0.0, 0.0),
    # Zero-length prediction: IoP would divide by zero -> 0.
    ([[0, 10]], [[5, 5]], 0.0, 0.0),
    # Duplicated segments on both sides make the union 0: scored 0, not a division error.
    ([[0, 10], [0, 10]], [[0, 10], [0, 10]], 0.0, 2.0),
    # A reversed predicted segment has length 0 and intersects nothing: inter 2, pred_len 2, union 10.
    ([[0, 10]], [[8, 2], [4, 6]], 0.2, 1.0),
    # Only reversed predictions: pred_len 0 -> IoP 0; union 10 -> IoU 0.
    ([[0, 10]], [[6, 4]], 0.0, 0.0),
    # Empty ground truth: 0 whatever the prediction.
    ([], [[0, 10]], 0.0, 0.0),
])
def test_temporal_iou_iop(gt, pred, iou, iop):
  got_iou, got_iop = st.temporal_iou_iop(gt, pred)
  assert got_iou == pytest.approx(iou)
  assert got_iop == pytest.approx(iop)


def test_temporal_thresholds_exactly_at_boundaries():
  # IoU 0.3 exactly, IoU 0.5 exactly, IoP 0.3 exactly (IoU 0.3 too), IoP 0.5 exactly (IoU 0.5), just below 0.3.
  cases = [([[0, 10]], [[0, 3]]), ([[0, 10]], [[0, 5]]), ([[0, 3]], [[0, 10]]), ([[0, 5]], [[0, 10]]),
           ([[0, 100]], [[0, 29.999]])]
  scores = [st.temporal_iou_iop(g, p) for g, p in cases]
  ious = [s[0] for s in scores]
  iops = [s[1] for s in scores]
  assert ious[:4] == [0.3, 0.5, 0.3, 0.5] and iops[:4] == [1.0, 1.0, 0.3, 0.5]
  out = st.temporal_summary(ious, iops)
  assert out["tIoU@0.3"] == pytest.approx(80.0)  # all but the last
  assert out["tIoU@0.5"] == pytest.approx(40.0)  # cases 2 and 4
  assert out["tIoP@0.3"] == pytest.approx(100.0)
  assert out["tIoP@0.5"] == pytest.approx(80.0)  # all but case 3
  assert out["mIoU"] == pytest.approx(100 * (0.3 + 0.5 + 0.3 + 0.5 + 0.29999) / 5)
  assert out["mIoP"] == pytest.approx(100 * (1 + 1 + 0.3 + 0.5 + 1) / 5)
  assert out["t_mean"] == pytest.approx(100 * np.mean([(a + b) / 2 for a, b in zip(ious, iops)]))


def test_temporal_summary_iou_above_one_and_missing_entries():
  # Entry 1 has IoU 2 (duplicated segments); entries 2, 3 are an empty prediction and a missing entry (0, 0).
  ious = [st.temporal_iou_iop([[0, 10]], [[0, 10], [0, 10]])[0], 0.0, 0.0]
  iops = [1.0, 0.0, 0.0]
  out = st.temporal_summary(ious, iops)
  assert out["mIoU"] == pytest.approx(200 / 3)
  assert out["mIoP"] == pytest.approx(100 / 3)
  assert out["t_mean"] == pytest.approx(100 * 1.5 / 3)
  assert out["tIoU@0.5"] == pytest.approx(100 / 3)


# ---------------------------------------------------------------------------------------------------------------------
# Masks.


def _square(shape, y0, y1, x0, x1):
  m = np.zeros(shape, dtype=bool)
  m[y0:y1, x0:x1] = True
  return m


def test_seg2bmap_square_ring():
  # A 4x4 square at rows/cols 2..5: the DAVIS boundary is the 16-pixel ring of rows/cols 1..5 (offset towards origin).
  b = st.seg2bmap(_square((10, 10), 2, 6, 2, 6))
  expected = np.zeros((10, 10), dtype=bool)
  expected[1, 1:6] = expected[5, 1:6] = expected[1:6, 1] = expected[1:6, 5] = True
  np.testing.assert_array_equal(b, expected)


def test_seg2bmap_last_row_column_rules():
  seg = np.zeros((3, 3), dtype=bool)
  seg[2, 2] = True  # bottom-right pixel: never itself a boundary
  expected = np.array([[0, 0, 0], [0, 1, 1], [0, 1, 0]], dtype=bool)
  np.testing.assert_array_equal(st.seg2bmap(seg), expected)
  # A full mask has no boundary at all under the DAVIS rule.
  assert not st.seg2bmap(np.ones((4, 5))).any()
  # Object in the last column: the last column compares with its south neighbour only.
  seg = np.zeros((3, 3), dtype=bool)
  seg[0, 2] = True
  expected = np.array([[0, 1, 1], [0, 0, 0], [0, 0, 0]], dtype=bool)
  np.testing.assert_array_equal(st.seg2bmap(seg), expected)


def test_boundary_radius_and_disk():
  assert st.boundary_radius((10, 10)) == 1          # ceil(0.008 * 14.14)
  assert st.boundary_radius((480, 854)) == 8        # ceil(0.008 * 979.7) = ceil(7.84)
  assert st.boundary_radius((1080, 1920)) == 18     # ceil(0.008 * 2202.9) = ceil(17.62)
  d = st.disk(2)
  assert d.sum() == 13 and d[0, 2] and not d[0, 1] and d[1, 1]


def test_boundary_f_square_vs_shifted_square():
  gt = _square((10, 10), 2, 6, 2, 6)
  # Shifted right by one: every ring pixel has a partner within r = 1 -> F = 1, while J = (3 x 4) / (5 x 4).
  one = _square((10, 10), 2, 6, 3, 7)
  assert st.f_measure(one, gt) == pytest.approx(1.0)
  assert st.db_eval_iou(gt, one) == pytest.approx(12 / 20)
  # Shifted right by two: 10 of the 16 ring pixels lie within the plus-shaped r = 1 disk of the other ring (both ways):
  # P = R = 10/16 -> F = 0.625; J = 8 / 24.
  two = _square((10, 10), 2, 6, 4, 8)
  assert st.f_measure(two, gt) == pytest.approx(0.625)
  assert st.f_measure(gt, two) == pytest.approx(0.625)
  assert st.db_eval_iou(gt, two) == pytest.approx(1 / 3)
  assert st.frame_scores(gt, two) == pytest.approx((1 / 3, 0.625))


def test_boundary_f_davis_special_cases():
  gt = _square((10, 10), 2, 6, 2, 6)
  full = np.ones((10, 10), dtype=bool)  # non-empty mask whose DAVIS boundary is empty
  assert st.f_measure(full, gt) == 0.0   # P = 1, R = 0
  assert st.f_measure(gt, full) == 0.0   # P = 0, R = 1
  assert st.f_measure(full, full) == 1.0
  assert st.frame_scores(full, full) == (1.0, 1.0)


def _reference_f(pred, gt, radius):
  """Independent DAVIS boundary F: per-pixel seg2bmap loop and scipy dilation."""
  ndimage = pytest.importorskip("scipy.ndimage")

  def bmap(seg):
    h, w = seg.shape
    out = np.zeros_like(seg)
    for y in range(h):
      for x in range(w):
        east = seg[y, x + 1] if x + 1 < w else False
        south = seg[y + 1, x] if y + 1 < h else False
        se = seg[y + 1, x + 1] if (x + 1 < w and y + 1 < h) else False
        if y == h - 1 and x == w - 1:
          out[y, x] = False
        elif y == h - 1:
          out[y, x] = seg[y, x] != east
        elif x == w - 1:
          out[y, x] = seg[y, x] != south
        else:
          out[y, x] = seg[y, x] != east or seg[y, x] != south or seg[y, x] != se
    return out

  yy, xx = np.mgrid[-radius:radius + 1, -radius:radius + 1]
  selem = xx ** 2 + yy ** 2 <= radius ** 2
  fb, gb = bmap(pred), bmap(gt)
  nf, ng = fb.sum(), gb.sum()
  if nf == 0 and ng > 0:
    p, r = 1.0, 0.0
  elif nf > 0 and ng == 0:
    p, r = 0.0, 1.0
  elif nf == 0 and ng == 0:
    p, r = 1.0, 1.0
  else:
    p = (fb & ndimage.binary_dilation(gb, selem)).sum() / nf
    r = (gb & ndimage.binary_dilation(fb, selem)).sum() / ng
  return 0.0 if p + r == 0 else 2 * p * r / (p + r)


@pytest.mark.parametrize("shape,seed", [((24, 31), 0), ((130, 150), 1), ((7, 60), 2)])
def test_boundary_f_parity_with_reference(shape, seed):
  rng = np.random.default_rng(seed)
  radius = st.boundary_radius(shape)
  for _ in range(4):
    gt = rng.random(shape) < 0.3
    pred = gt ^ (rng.random(shape) < 0.1)
    assert st.f_measure(pred, gt) == pytest.approx(_reference_f(pred, gt, radius))
  for r in (1, 2, 5, 9):
    b = rng.random(shape) < 0.02
    ndimage = pytest.importorskip("scipy.ndimage")
    np.testing.assert_array_equal(st.dilate_disk(b, r), ndimage.binary_dilation(b, st.disk(r)))


def test_frame_scores_empty_rules():
  sq = _square((10, 10), 2, 6, 2, 6)
  empty = np.zeros((10, 10), dtype=bool)
  assert st.frame_scores(empty, empty) == (1.0, 1.0)
  assert st.frame_scores(None, empty) == (1.0, 1.0)   # missing GT PNG = empty
  assert st.frame_scores(None, sq) == (0.0, 0.0)
  assert st.frame_scores(sq, empty) == (0.0, 0.0)
  assert st.frame_scores(empty, sq) == (0.0, 0.0)
  assert st.frame_scores(sq, sq) == (1.0, 1.0)
  with pytest.raises(ValueError, match="shapes differ"):
    st.frame_scores(np.zeros((4, 4)), np.zeros((4, 5)))


def test_entry_mask_scores_and_summary():
  gt = _square((10, 10), 2, 6, 2, 6)
  two = _square((10, 10), 2, 6, 4, 8)
  empty = np.zeros((10, 10), dtype=bool)
  j, f = st.entry_mask_scores([(gt, gt), (gt, two), (None, empty)])
  assert j == pytest.approx((1 + 1 / 3 + 1) / 3)
  assert f == pytest.approx((1 + 0.625 + 1) / 3)
  assert st.entry_mask_scores([]) == (0.0, 0.0)  # entry without predicted masks
  out = st.mask_summary([j, 0.0], [f, 0.0])
  assert out["J"] == pytest.approx(100 * j / 2)
  assert out["F"] == pytest.approx(100 * f / 2)
  assert out["JF"] == pytest.approx((out["J"] + out["F"]) / 2)
  assert math.isnan(st.mask_summary([], [])["J"])


def test_st_evidence_summary_denominators():
  out = st.st_evidence_summary([True, False, False, False], [1.0, 0.5, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0],
                               [0.5], [1.0])
  assert out["accuracy"] == 25.0
  assert out["mIoU"] == pytest.approx(37.5)
  assert out["J"] == 50.0 and out["F"] == 100.0 and out["JF"] == 75.0
  assert out["num_entries"] == 4 and out["num_mask_entries"] == 1


# ---------------------------------------------------------------------------------------------------------------------
# DAVIS-2017 aggregation.


def test_db_statistics():
  m, r, d = st.db_statistics([1, 1, 1, 1, 0, 0, 0, 0])
  # bins: round(linspace(1, 8, 5)) - 1 = [0, 2, 4, 5, 7] -> first bin v[0:3], last bin v[5:8].
  assert (m, r, d) == (0.5, 0.5, 1.0)
  m, r, d = st.db_statistics([0.2, 0.6, np.nan, 1.0])
  assert m == pytest.approx(0.6) and r == pytest.approx(0.5)


def test_davis_sequence_scores_and_aggregate():
  shape = (10, 10)
  sq = _square(shape, 2, 6, 2, 6)
  two = _square(shape, 2, 6, 4, 8)
  empty = np.zeros(shape, dtype=bool)
  # Two objects, 4 frames; the prediction only has object 1 (object 2 is padded empty).
  gt = np.stack([np.stack([sq, sq, sq, sq]), np.stack([sq, empty, sq, sq])])
  pred = np.stack([np.stack([empty, sq, two, sq])])
  j, f = st.davis_sequence_scores(gt, pred)
  np.testing.assert_allclose(j, [[0, 1, 1 / 3, 1], [0, 1, 0, 0]])
  np.testing.assert_allclose(f, [[0, 1, 0.625, 1], [0, 1, 0, 0]])
  j2, f2 = st.davis_sequence_scores(gt, pred, drop_first_last=True)
  np.testing.assert_allclose(j2, j[:, 1:-1])
  np.testing.assert_allclose(f2, f[:, 1:-1])

  out = st.davis_aggregate({"seq": (j2, f2), "other": (np.ones((1, 3)), np.full((1, 3), 0.5))})
  # Objects: seq_1 J mean (1 + 1/3)/2, seq_2 J 0.5, other_1 J 1.
  assert out["J-Mean"] == pytest.approx(((1 + 1 / 3) / 2 + 0.5 + 1) / 3)
  assert out["F-Mean"] == pytest.approx(((1 + 0.625) / 2 + 0.5 + 0.5) / 3)
  assert out["J&F-Mean"] == pytest.approx((out["J-Mean"] + out["F-Mean"]) / 2)
  assert out["per_object"]["seq_2"]["J-Mean"] == pytest.approx(0.5)
  assert set(out["per_object"]) == {"seq_1", "seq_2", "other_1"}
  with pytest.raises(ValueError, match="objects"):
    st.davis_sequence_scores(gt[:1], np.concatenate([pred, pred]))


# ---------------------------------------------------------------------------------------------------------------------
# MCQ.


def test_mcq_metrics_official_denominators_and_overall():
  gt = {"a": {"qa": 1, "temporal": 0, "spatial": 3}, "b": {"qa": 0, "temporal": 2, "spatial": 1},
        "c": {"qa": 4, "temporal": 1, "spatial": 0}, "d": {"qa": 2, "temporal": 3, "spatial": 2}}
  pred = {"a": {"qa": 1, "temporal": 0, "spatial": 3},        # all right
          "b": {"qa": 0, "temporal": 2, "spatial": 0},        # spatial wrong
          "c": {"qa": 4, "temporal": None}}                   # temporal null, spatial missing
  out = st.mcq_metrics(gt, pred)                              # d absent: not counted (official denominator)
  assert (out["qa"], out["temporal"], out["spatial"]) == (100.0, pytest.approx(200 / 3), pytest.approx(100 / 3))
  assert out["overall_accuracy"] == pytest.approx(100 * 6 / 9) and out["pooled"] == pytest.approx(100 / 3)
  assert (out["temporal_correct"], out["temporal_total"], out["temporal_valid"]) == (2, 3, 2)
  assert out["spatial_coverage"] == pytest.approx(200 / 3)
  assert out["num_entries"] == 3 and out["num_missing_entries"] == 1
  strict = st.mcq_metrics(gt, pred, count_missing=True)
  assert (strict["qa"], strict["temporal"], strict["spatial"], strict["pooled"]) == (75.0, 50.0, 25.0, 25.0)
  assert strict["overall_accuracy"] == 50.0
  # Out-of-range and malformed choices are wrong answers, not errors.
  out = st.mcq_metrics(gt, {"a": {"qa": 7, "temporal": -1, "spatial": "D"}})
  assert (out["qa"], out["temporal"], out["spatial"]) == (0.0, 0.0, 100.0) and out["qa_valid"] == 1


def test_mcq_results_metrics_authors_layout():
  results = {
      "a": {"answer": "A", "gt_answer": "A", "evidence_t": "B", "gt_evidence_t": "B", "evidence_s": "F",
            "gt_evidence_s": "C"},
      "b": {"answer": None, "gt_answer": "B", "evidence_t": "a", "gt_evidence_t": "A", "evidence_s": "D",
            "gt_evidence_s": "D"},
      "c": {"answer": "C", "gt_answer": "C"},
      "d": {"answer": "None", "gt_answer": "", "evidence_t": "", "gt_evidence_t": "C", "evidence_s": "B",
            "gt_evidence_s": "B"},
  }
  m = st.mcq_results_metrics(results)
  assert m["qa"] == {"correct": 2, "total": 3, "valid": 2, "accuracy": pytest.approx(200 / 3),
                     "coverage": pytest.approx(200 / 3)}
  assert m["temporal"] == {"correct": 1, "total": 3, "valid": 2, "accuracy": pytest.approx(100 / 3),
                           "coverage": pytest.approx(200 / 3)}
  assert m["spatial"] == {"correct": 2, "total": 3, "valid": 3, "accuracy": pytest.approx(200 / 3),
                          "coverage": 100.0}
  assert m["overall_accuracy"] == pytest.approx(100 * 5 / 9)
  assert m["pooled"] == 0.0 and m["total_entries"] == 4
  assert st.mcq_results_metrics({})["overall_accuracy"] == 0.0


def test_percentages_use_the_official_float_expression():
  # 100 * 23 / 160 is exactly 14.375 (rounds to 14.38 in the official 2-decimal JSON); a numpy mean of 23 ones in 160
  # gives 14.374999999999998 (14.37): the expression itself must be the official one.
  ious = [0.6] * 23 + [0.0] * 137
  out = st.st_evidence_summary([True] * 23 + [False] * 137, ious, ious, [], [])
  assert out["accuracy"] == 14.375 and out["tIoU@0.5"] == 14.375 and round(out["tIoU@0.3"], 2) == 14.38
  assert math.isnan(out["J"])
  # No entry at all: the official script writes 0, not NaN.
  assert st.st_evidence_summary([], [], [], [], [])["mIoU"] == 0.0
