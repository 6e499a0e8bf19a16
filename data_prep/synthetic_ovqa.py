"""The built-in synthetic OVQA world: a deterministic, download-free miniature of MSRVTT-QA.

    python -m data_prep.synthetic_ovqa --out DIR [--seed 0] [--small | --msrvtt-scale] [--graphs] [--num-train 5000] ...

writes the same raw files as the official release into DIR/raw (train.csv, val.csv, test.csv with columns
question, answer, video_id, type, id; features.npz: video_id -> float16 [T_video, 768]; subtitles.json:
video_id -> text; world.json: the concepts and knobs, for inspection) and converts them with data_prep.ovqa into
DIR/records, then prints the realised answer statistics (the paper's Table 1); --graphs also builds the answer
graphs (data_prep.answer_graphs). `ensure_world(DIR, preset)` does all of it once, for the configs' demo variants.

How the world makes the paper's claims testable in miniature:
- Answers are ~650 English words (objects, animals, vehicles, instruments, sports, actions, manners, numbers,
  colours, places, people, times), each present in GloVe 6B and a single word piece of the MiniLM (BERT uncased)
  vocabulary, grouped by MSRVTT question type (0-5 = what/how/color/where/who/when) with question templates per
  group ("what is the man holding", "what color is the car", "where is the woman", ...).
- Answer frequencies are Zipf-like over a concept ranking, p(rank r) ~ (r + offset)^-exponent, sampled per row,
  so the base / common / rare categories all occur; a set of held-out concepts never appears in train and makes
  a fixed fraction of the val/test rows (the unseen answers; tail concepts that happen to get no train row add
  a few more).
- "CLIP-like" frames: a clip shows the concepts of its 1-3 questions (distinct question types) in contiguous
  segments, plus optionally a distractor concept and background frames. A frame of concept c is
      mean + a * unit(M (g_c - g_mean)) + b * d_type + noise,
  with g_c the concept's GloVe vector, M a fixed random 50 x 768 map (from the seed) shared by all words, d_type
  a random unit direction per question type (so the question type tells which segment to look at) and a shared
  mean vector (CLIP features are anisotropic). Because M is shared, the answer is predictable from the video AND
  an unseen answer is predictable from its word vector. Segments are long enough that frame sampling to
  `num_frames` keeps at least one frame of every question's concept.
- Preset `neighbours` (`video_direction="neighbours"`, the configs' `:nbrworld`): g_c above is replaced by the mean
  GloVe vector of c's 1-hop answer-graph words (its k = 10 nearest GloVe words that are not answers, as
  data_prep.answer_graphs finds them; c's own vector when all ten are answers). The video then shows what the
  answer graph knows about c rather than c's own word, the situation in which the GNN verbalizer can add to the
  answer's own embedding. Concepts, rows and the map M are the default world's.
- Subtitles (optional): a filler sentence for most clips, sometimes mentioning a GloVe neighbour of one of the
  clip's answers (a related word, never the answer itself).
- MSRVTT scale (preset `msrvtt_scale`, `msrvtt_scale()`): MSRVTT-QA has 4,000 train answers and 1,632 test-only ones
  (OVQA paper, Table 1). The curated words are too few for that, so `extra_glove_words` adds real words: the most
  frequent alphabetic GloVe words (>= 3 letters, no stop words), each in the group (question type) of its nearest
  curated word. `cover_all` gives every seen concept one train row and every held-out concept one test row before
  the rest is sampled, so V_train and the test-only answers have exactly the preset's sizes.

Everything derives from `seed` through numpy's PCG64 (the feature map from its own child seed, so the size
knobs do not change it): the same seed gives byte-identical CSVs and identical feature arrays.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from typing import Sequence

import numpy as np
import pandas as pd

from evqa_jax import cli
from evqa_jax import io as evqa_io
from evqa_jax import pretrained
from data_prep import answer_stats
from data_prep import features as features_lib
from data_prep import ovqa

QUESTION_TYPES = ("what", "how", "color", "where", "who", "when")

# Curated answer words per group; each is in GloVe 6B and is one word piece of the MiniLM uncased vocabulary
# (tests/test_synthetic_ovqa.py checks both). A word listed twice keeps its first group.
WORD_GROUPS = {
    "object": """
        ball phone book cup bottle knife guitar camera bag box hat paper pen pencil card cards towel brush
        umbrella bowl plate spoon fork glass mug jar pan pot toy doll flag sign map key keys lamp chair table
        bed sofa couch computer laptop keyboard mouse screen television tv remote microphone speaker clock
        watch ring necklace shoe shoes shirt dress jacket coat scarf glove gloves sunglasses glasses mask
        helmet bat stick rope wire cable candle flower flowers tree rock stone leaf paint tape scissors hammer
        tool tools wheel tire door window mirror picture painting poster letter envelope gift present basket
        bucket blanket pillow wallet purse coin money ticket newspaper magazine notebook tablet sword gun
        rifle bow arrow shield balloon kite candy cake bread sandwich pizza burger egg eggs apple banana
        orange lemon tomato potato onion carrot rice pasta soup salad cheese meat chicken fish steak sauce
        cookie chocolate coffee tea milk juice water wine beer sugar salt butter noodles pie corn bean beans
        mushroom pepper garlic strawberry grape grapes cherry peach""",
    "animal": """
        dog cat horse cow pig sheep goat bird duck rabbit rat lion tiger bear wolf fox deer elephant monkey
        zebra snake lizard turtle frog shark whale dolphin penguin owl eagle parrot spider bee butterfly ant
        camel donkey kangaroo panda squirrel crab octopus seal goose swan pigeon crow puppy kitten bull cattle""",
    "vehicle": """
        car truck bus train bike bicycle motorcycle boat ship plane airplane helicopter jet tractor taxi van
        jeep canoe yacht rocket tank ambulance subway""",
    "instrument": """
        piano violin drum drums flute trumpet saxophone harp cello banjo accordion clarinet harmonica trombone
        organ bass""",
    "sport": """
        soccer football basketball baseball tennis golf hockey volleyball cricket rugby boxing wrestling
        swimming surfing skiing skating cycling racing bowling badminton chess poker karate yoga gymnastics
        archery fishing hunting diving""",
    "action": """
        cooking singing dancing running walking talking eating drinking driving playing reading writing
        drawing jumping climbing riding fighting laughing crying sleeping smiling shopping cleaning washing
        cutting throwing catching kicking shooting typing sitting standing sewing knitting baking stirring
        mixing pouring filming recording speaking interviewing teaching explaining presenting performing
        acting modeling exercising stretching lifting kissing hugging waving clapping whistling shouting
        screaming yelling""",
    "manner": """
        quickly slowly fast carefully happily sadly loudly quietly gently angrily easily badly well hard slow
        quick loud calm gracefully smoothly nervously excitedly""",
    "number": """
        two three four five six seven eight nine ten eleven twelve twenty hundred""",
    "color": """
        red blue green yellow black white purple pink brown gray grey silver gold golden violet beige tan
        maroon navy turquoise crimson scarlet olive lavender ivory bronze copper amber emerald ruby indigo
        blond""",
    "place": """
        kitchen room bedroom bathroom office classroom school street road beach park stage forest field garden
        yard house home restaurant store shop mall market studio gym pool lake river ocean sea mountain hill
        desert island city town village farm zoo airport station church hospital library museum theater cinema
        stadium arena court track bridge tunnel highway parking garage basement roof hallway bar cafe hotel
        lobby prison castle palace cave jungle valley canyon lab laboratory factory warehouse campus concert
        club party wedding festival space moon underwater outside outdoors inside indoors backyard playground
        sidewalk alley parade race game""",
    "person": """
        man woman boy girl child children kid kids baby people person guy lady gentleman teenager adult chef
        cook doctor nurse teacher student police officer soldier singer dancer actor actress player athlete
        driver pilot reporter host anchor presenter announcer judge lawyer president politician scientist
        farmer worker waiter waitress customer audience crowd band team family mother father mom dad son
        daughter brother sister wife husband friend couple group coach referee fan fans clown magician cowboy
        king queen prince princess priest artist musician guitarist drummer rapper comedian model celebrity
        tourist fisherman hunter surgeon dentist mechanic astronaut robot monster zombie alien superhero
        cartoon""",
    "time": """
        night morning evening afternoon noon midnight dawn dusk sunrise sunset day daytime nighttime today
        tonight yesterday tomorrow weekend summer winter spring autumn fall monday tuesday wednesday thursday
        friday saturday sunday january february march april may june july august september october november
        december christmas halloween easter thanksgiving birthday holiday""",
}

GROUP_TYPE = {"object": 0, "animal": 0, "vehicle": 0, "instrument": 0, "sport": 0, "action": 0,
              "manner": 1, "number": 1, "color": 2, "place": 3, "person": 4, "time": 5}

SUBJECTS = ("man", "woman", "person", "boy", "girl", "guy", "lady")

TEMPLATES = {
    "object": ("what is the {s} holding", "what is on the table", "what object is shown in the video",
               "what is the {s} showing to the camera", "what does the {s} pick up", "what is the {s} using"),
    "animal": ("what animal is shown", "what kind of animal is in the video", "what animal is the {s} playing with",
               "what is running on the grass"),
    "vehicle": ("what vehicle is shown", "what is the {s} driving", "what is parked on the street"),
    "instrument": ("what instrument is the {s} playing", "what instrument is being played",
                   "what is the musician playing"),
    "sport": ("what sport is being played", "what game are the people playing", "what sport is shown in the video"),
    "action": ("what is the {s} doing", "what are the people doing", "what activity is shown in the video",
               "what is the {s} doing in the video"),
    "manner": ("how is the {s} moving", "how does the {s} speak", "how is the {s} driving", "how does the {s} dance"),
    "number": ("how many people are in the video", "how many cars are shown", "how many animals are there",
               "how many times does the {s} jump"),
    "color": ("what color is the car", "what color is the shirt of the {s}", "what color is the dress",
              "what is the color of the ball", "what color is the {s} wearing"),
    "place": ("where is the {s}", "where are the people", "where is this taking place", "where is the {s} standing",
              "where is the video filmed"),
    "person": ("who is talking", "who is singing on stage", "who is in the video", "who is cooking in the kitchen",
               "who is speaking to the camera"),
    "time": ("when is the video filmed", "when does this take place", "when are the people outside",
             "when is the party"),
}

# The most frequent answers, in order (MSRVTT-QA's head looks like this); the rest of the ranking is random.
HEAD = ("man", "woman", "person", "people", "girl", "car", "dog", "cooking", "boy", "singing", "kitchen",
        "red", "black", "two", "stage", "cat", "white", "night", "room", "dancing")

FILLERS = ("okay so let us get started", "look at this", "this is amazing", "welcome back to my channel",
           "here we go", "check this out", "what do you think", "alright everybody", "thank you for watching",
           "let me show you", "that was great", "come on", "oh my god", "you can see it here",
           "so today we are going to try something new", "do not forget to subscribe")
HINTS = ("it reminds me of {w}", "talking about {w} again", "just like {w}", "have you seen the {w}",
         "i love {w}")


@dataclasses.dataclass(frozen=True)
class WorldConfig:
  """Knobs of the synthetic OVQA world (defaults: a ~3-5 minute CPU demo training)."""

  seed: int = 0
  num_train: int = 5000
  num_val: int = 500
  num_test: int = 1000
  num_concepts: int = 0            # 0 = all curated words
  num_heldout: int = 50            # concepts that occur only in val/test (unseen answers)
  unseen_fraction: float = 0.08    # share of val/test rows asking about a held-out concept
  zipf_exponent: float = 1.1
  zipf_offset: float = 2.0
  min_video_frames: int = 6
  max_video_frames: int = 24
  max_questions_per_video: int = 3
  num_frames: int = 10             # converter's T; segments are made long enough to survive sampling to T
  feature_dim: int = 768
  concept_scale: float = 8.0
  type_scale: float = 2.5
  mean_norm: float = 5.0
  noise_norm: float = 4.0
  distractor_prob: float = 0.5
  distractor_scale: float = 0.6
  background_prob: float = 0.5
  subtitles: bool = True
  subtitle_prob: float = 0.7
  hint_prob: float = 0.3
  cvqa_topk: int = 100
  extra_glove_words: int = 0       # frequent GloVe words added to the curated concepts (MSRVTT-scale vocabularies)
  cover_all: bool = False          # every seen concept in train and every held-out concept in test at least once
  # What a concept's frames show: "word" = unit(M (g_c - g_mean)), its own GloVe vector; "neighbours" = unit(M (n_c -
  # g_mean)), n_c the mean GloVe vector of c's 1-hop answer-graph words (its `neighbour_k` nearest GloVe words that
  # are not answers, as data_prep.answer_graphs finds them), c's own vector where it has none.
  video_direction: str = "word"
  neighbour_k: int = 10


SMALL = dict(num_train=800, num_val=100, num_test=200, num_concepts=160, num_heldout=16, zipf_exponent=1.2,
             zipf_offset=0.5, cvqa_topk=20)


# Function words: never answers of the MSRVTT-scale world (NLTK's English stop-word list, plus GloVe's frequent
# reporting and modal words that no video shows).
STOP_WORDS = frozenset("""
    a about above after again against all am an and any are aren as at be because been before being below between
    both but by can couldn did didn do does doesn doing don down during each few for from further had hadn has hasn
    have haven having he her here hers herself him himself his how i if in into is isn it its itself just ll me
    mightn more most mustn my myself needn no nor not now of off on once only or other our ours ourselves out over
    own re same shan she should shouldn so some such than that the their theirs them themselves then there these
    they this those through to too under until up ve very was wasn we were weren what when where which while who
    whom why will with won wouldn you your yours yourself yourselves also would could said says say may might must
    shall one ones another many much among within without upon since though although however whether yet via per
    told according including mrs
    """.split())


def msrvtt_scale(train_answers: int = 4000, test_only_answers: int = 1600, rows_per_train_answer: int = 4,
                 seed: int = 0) -> dict:
  """WorldConfig knobs of an MSRVTT-QA-sized answer vocabulary: exactly `train_answers` answers in train (V_train)
  and `test_only_answers` unseen ones in test, with a long tail (a few base answers, more common ones, mostly rare),
  on a modest number of rows (`rows_per_train_answer` x train_answers train rows; test: one row per unseen answer
  and as many rows of seen answers). MSRVTT-QA itself: 205 base, 937 common, 2,858 rare, 1,632 unseen answers over
  159k train rows; at ~1/13 of its rows the head is necessarily smaller."""
  concepts = train_answers + test_only_answers
  return dict(
      seed=seed, num_train=rows_per_train_answer * train_answers, num_val=0, num_test=2 * test_only_answers,
      num_concepts=concepts, num_heldout=test_only_answers, unseen_fraction=0.5, cover_all=True,
      extra_glove_words=max(0, concepts - len(concept_words())),
      zipf_exponent=1.2, zipf_offset=5.0, min_video_frames=8, max_video_frames=12, cvqa_topk=4000)


def frequent_glove_words(n: int, exclude: set[str]) -> list[str]:
  """The `n` most frequent GloVe 6B words that are alphabetic ASCII, >= 3 letters, not stop words and not in
  `exclude`, in frequency order (the file is sorted by frequency)."""
  root = pretrained.glove_6b_50d_dir()
  index = pd.read_parquet(os.path.join(root, "glove_6B_index.parquet"))["index"].astype(str)
  out = []
  for w in index:
    if len(w) >= 3 and w.isascii() and w.isalpha() and w.islower() and w not in STOP_WORDS and w not in exclude:
      out.append(w)
      if len(out) == n:
        return out
  raise ValueError(f"GloVe 6B has only {len(out)} usable words, {n} requested (WorldConfig.extra_glove_words)")


def concept_words() -> list[tuple[str, str]]:
  """(word, group) of every curated answer word, in listing order, each word once."""
  seen, out = set(), []
  for group, words in WORD_GROUPS.items():
    for w in words.split():
      if w not in seen:
        seen.add(w)
        out.append((w, group))
  return out


def glove_concepts(curated: Sequence[tuple[str, str]], n: int) -> list[tuple[str, str]]:
  """(word, group) of `n` frequent GloVe words (`frequent_glove_words`), each in the group of its nearest curated
  word by GloVe cosine, so its questions and question type fit it ("truck" gets the vehicle questions)."""
  extra = frequent_glove_words(n, {w for w, _ in curated})
  curated_vecs = load_glove([w for w, _ in curated], vocab_rows=(0, 0))[0]
  extra_vecs = load_glove(extra, vocab_rows=(0, 0))[0]
  unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-8)  # noqa: E731
  nearest = np.argmax(unit(extra_vecs) @ unit(curated_vecs).T, axis=1)
  return [(w, curated[j][1]) for w, j in zip(extra, nearest)]


def load_glove(words: Sequence[str], vocab_rows: tuple[int, int] = (500, 50000)
               ) -> tuple[np.ndarray, list[str], np.ndarray]:
  """GloVe 50d vectors of `words` [len(words), 50], plus the GloVe words (and vectors) of frequency ranks
  vocab_rows[0]..vocab_rows[1] (the file is sorted by frequency; the top ranks are mostly function words)."""
  root = pretrained.glove_6b_50d_dir()
  index = pd.Index(pd.read_parquet(os.path.join(root, "glove_6B_index.parquet"))["index"].astype(str))
  emb = np.load(os.path.join(root, "glove_6B_50d_emb.npy"), mmap_mode="r")
  rows = index.get_indexer(list(words))
  missing = [w for w, r in zip(words, rows) if r < 0]
  if missing:
    raise ValueError(f"words missing from GloVe 6B ({root}): {missing}")
  vecs = np.asarray(emb[rows], dtype=np.float32)
  lo, hi = vocab_rows
  return vecs, index[lo:hi].tolist(), np.asarray(emb[lo:hi], dtype=np.float32)


def glove_neighbours(words: Sequence[str], vecs: np.ndarray, vocab: Sequence[str], vocab_vecs: np.ndarray,
                     exclude: set[str] = frozenset(), k: int = 3) -> dict[str, list[str]]:
  """k nearest GloVe words (cosine) of each word: alphabetic, >= 3 letters, not in `exclude`, not the word
  itself nor a plural/stem of it."""
  unit = vocab_vecs / np.maximum(np.linalg.norm(vocab_vecs, axis=1, keepdims=True), 1e-8)
  q = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-8)
  out = {}
  # [block, vocab] similarities at a time: thousands of words x 50k would take GBs. The curated words (< 1024) are
  # one block, as they always were, so the built-in worlds are unchanged.
  block = 1024
  for start in range(0, len(words), block):
    sims = q[start:start + block] @ unit.T
    top = np.argpartition(-sims, 200, axis=1)[:, :200]
    for b, w in enumerate(words[start:start + block]):
      out[w] = _first_neighbours(w, top[b][np.argsort(-sims[b, top[b]], kind="stable")], vocab, exclude, k)
  return out


def _first_neighbours(w: str, ranked, vocab: Sequence[str], exclude: set[str], k: int) -> list[str]:
  found = []
  for j in ranked:
    cand = vocab[j]
    if (cand.isalpha() and cand.isascii() and len(cand) >= 3 and cand not in exclude
        and not cand.startswith(w) and not w.startswith(cand)):
      found.append(cand)
      if len(found) == k:
        break
  return found


def _zipf(n: int, exponent: float, offset: float) -> np.ndarray:
  p = 1.0 / (np.arange(1, n + 1) + offset) ** exponent
  return p / p.sum()


def _segments(rng: np.random.Generator, t_video: int, num_qa: int, extra: int, num_frames: int) -> tuple:
  """Frame counts of the QA parts then the extra parts (each >= 1); QA parts survive sampling to num_frames."""
  qa_min = math.ceil(t_video / num_frames) if t_video > num_frames else 1
  while extra and num_qa * qa_min + extra > t_video:
    extra -= 1
  t_video = max(t_video, num_qa * qa_min + extra)
  if t_video > num_frames:
    qa_min = math.ceil(t_video / num_frames)
  mins = np.array([qa_min] * num_qa + [1] * extra, dtype=np.int64)
  lengths = mins + rng.multinomial(max(0, t_video - int(mins.sum())), np.full(len(mins), 1.0 / len(mins)))
  return lengths, extra


class _World:
  """Concepts, their ranking and the frame-feature generator."""

  def __init__(self, cfg: WorldConfig):
    self.cfg = cfg
    map_ss, world_ss = np.random.SeedSequence(cfg.seed).spawn(2)
    self.rng = np.random.default_rng(world_ss)
    all_words = concept_words()
    if cfg.extra_glove_words:
      all_words += glove_concepts(all_words, cfg.extra_glove_words)
    words = [w for w, _ in all_words]
    group_of = dict(all_words)
    all_vecs, vocab, vocab_vecs = load_glove(words)
    glove_mean = all_vecs.mean(axis=0)

    head = [w for w in HEAD if w in group_of]
    rest = [w for w in words if w not in set(head)]
    rest = [rest[i] for i in self.rng.permutation(len(rest))]
    ranking = head + rest
    if cfg.num_concepts:
      if not len(head) < cfg.num_concepts <= len(ranking):
        raise ValueError(f"num_concepts={cfg.num_concepts} must be in ({len(head)}, {len(ranking)}]")
      ranking = ranking[:cfg.num_concepts]
    if not 0 <= cfg.num_heldout <= len(ranking) - len(head) - 1:
      raise ValueError(f"num_heldout={cfg.num_heldout} must be in [0, {len(ranking) - len(head) - 1}]")
    held_idx = len(head) + self.rng.choice(len(ranking) - len(head), cfg.num_heldout, replace=False)
    held = set(ranking[i] for i in held_idx)
    self.seen = [w for w in ranking if w not in held]
    self.heldout = [w for w in ranking if w in held]
    self.group = {w: group_of[w] for w in ranking}
    self.qtype = {w: GROUP_TYPE[group_of[w]] for w in ranking}
    self.concepts = ranking
    self.seen_pos = {w: i for i, w in enumerate(self.seen)}

    word_row = {w: i for i, w in enumerate(words)}
    vecs = all_vecs[[word_row[w] for w in ranking]]
    self.neighbours = glove_neighbours(ranking, vecs, vocab, vocab_vecs, exclude=set(words))

    map_rng = np.random.default_rng(map_ss)
    dim = cfg.feature_dim
    projection = map_rng.standard_normal((all_vecs.shape[1], dim)).astype(np.float32) / np.sqrt(all_vecs.shape[1])
    mapped = (self._video_vectors(ranking, vecs) - glove_mean) @ projection
    self.direction = {w: mapped[i] / np.linalg.norm(mapped[i]) for i, w in enumerate(ranking)}
    self.mean = self._unit(map_rng.standard_normal(dim)) * cfg.mean_norm
    self.type_dir = np.stack([self._unit(map_rng.standard_normal(dim)) for _ in QUESTION_TYPES]) * cfg.type_scale
    self.p_seen = _zipf(len(self.seen), cfg.zipf_exponent, cfg.zipf_offset)

  def _video_vectors(self, ranking: list[str], vecs: np.ndarray) -> np.ndarray:
    """[len(ranking), 50] GloVe-space vectors that the concepts' frames show (WorldConfig.video_direction)."""
    cfg = self.cfg
    if cfg.video_direction == "word":
      return vecs
    if cfg.video_direction != "neighbours":
      raise ValueError(f"WorldConfig.video_direction={cfg.video_direction!r}: choose 'word' or 'neighbours'")
    if cfg.neighbour_k < 1:
      raise ValueError(f"WorldConfig.neighbour_k={cfg.neighbour_k} must be >= 1")
    from evqa_jax.graphs import answer_graph  # pylint: disable=g-import-not-at-top
    from evqa_jax.graphs import word_vectors  # pylint: disable=g-import-not-at-top
    wv = word_vectors.load_word_vectors("pkg:glove-6b-50d")
    graph = answer_graph.build_answer_graph(ranking, wv, k=cfg.neighbour_k, hops=1)
    out = vecs.copy()
    rows = {}
    for s, r in zip(graph.senders, graph.receivers):
      if r < graph.num_answers <= s:  # an answer's non-answer word (no answer-answer edges; self-loops excluded)
        rows.setdefault(int(r), []).append(wv.lookup(graph.node_words[s]))
    for i, found in rows.items():
      out[i] = np.asarray(wv.vectors[np.asarray(found)], np.float32).mean(axis=0)
    self.num_without_neighbours = len(ranking) - len(rows)
    return out

  @staticmethod
  def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x)).astype(np.float32)

  def sample_answers(self, n: int, unseen_fraction: float) -> list[str]:
    """`n` answers in random order: Zipf-distributed seen concepts and a fraction of uniform held-out ones. With
    cover_all, train (unseen_fraction 0) first holds every seen concept once and an evaluation split every
    held-out concept once (its unseen share grows to that when needed)."""
    num_unseen = int(round(unseen_fraction * n)) if self.heldout else 0
    cover_seen = self.cfg.cover_all and unseen_fraction == 0
    cover_unseen = self.cfg.cover_all and num_unseen > 0
    if cover_unseen:
      num_unseen = max(num_unseen, len(self.heldout))
    need = num_unseen + (len(self.seen) if cover_seen else 0)
    if need > n:
      raise ValueError(f"WorldConfig.cover_all: a split of {n} rows cannot hold {need} (every "
                       f"{'seen' if cover_seen else 'held-out'} concept once); raise num_train / num_test")
    fixed = (list(self.seen) if cover_seen else []) + (list(self.heldout) if cover_unseen else [])
    num_seen_drawn = n - num_unseen - (len(self.seen) if cover_seen else 0)
    answers = fixed + [self.seen[i] for i in self.rng.choice(len(self.seen), num_seen_drawn, p=self.p_seen)]
    answers += [self.heldout[i] for i in self.rng.integers(0, len(self.heldout),
                                                           num_unseen - (len(self.heldout) if cover_unseen else 0))]
    return [answers[i] for i in self.rng.permutation(n)]

  def group_into_videos(self, answers: list[str]) -> list[list[int]]:
    """Row indices per video: consecutive rows of distinct question types, 1..max_questions_per_video each."""
    videos, current, types, cap = [], [], set(), 0
    for i, a in enumerate(answers):
      if current and (len(current) >= cap or self.qtype[a] in types):
        videos.append(current)
        current, types = [], set()
      if not current:
        cap = int(self.rng.integers(1, self.cfg.max_questions_per_video + 1))
      current.append(i)
      types.add(self.qtype[a])
    if current:
      videos.append(current)
    return videos

  def question(self, answer: str) -> str:
    templates = TEMPLATES[self.group[answer]]
    t = templates[int(self.rng.integers(len(templates)))]
    return t.format(s=SUBJECTS[int(self.rng.integers(len(SUBJECTS)))])

  def video(self, answers: Sequence[str]) -> np.ndarray:
    """float16 [T_video, feature_dim] frames showing `answers` (one segment each) plus distractor/background."""
    cfg, rng = self.cfg, self.rng
    parts = [cfg.concept_scale * self.direction[a] + self.type_dir[self.qtype[a]] for a in answers]
    extras, extra_parts = [], []
    if rng.random() < cfg.distractor_prob:
      # The k-th seen concept that is not one of `answers` (without listing them all: thousands at MSRVTT scale).
      taken = sorted(self.seen_pos[a] for a in set(answers) if a in self.seen_pos)
      k = int(rng.integers(len(self.seen) - len(taken)))
      for pos in taken:
        k += pos <= k
      d = self.seen[k]
      extras.append(cfg.distractor_scale * cfg.concept_scale * self.direction[d])
      extra_parts.append(("distractor", d))
    if rng.random() < cfg.background_prob:
      extras.append(np.zeros(cfg.feature_dim, np.float32))
      extra_parts.append(("background", None))
    t_video = int(rng.integers(cfg.min_video_frames, cfg.max_video_frames + 1))
    lengths, num_extra = _segments(rng, t_video, len(parts), len(extras), cfg.num_frames)
    # What the clip shows, for the pixel renderer (FrameRenderer): the answers, then the extras that fit.
    self.last_parts = [("qa", a) for a in answers] + extra_parts[:num_extra]
    parts = parts + extras[:num_extra]
    order = rng.permutation(len(parts))
    frames = np.concatenate([np.repeat(parts[k][None], lengths[k], axis=0) for k in order])
    noise = rng.standard_normal(frames.shape).astype(np.float32) * (cfg.noise_norm / np.sqrt(cfg.feature_dim))
    return (self.mean + frames + noise).astype(np.float16)

  def subtitle(self, answers: Sequence[str]) -> str | None:
    cfg, rng = self.cfg, self.rng
    if not cfg.subtitles or rng.random() >= cfg.subtitle_prob:
      return None
    text = FILLERS[int(rng.integers(len(FILLERS)))]
    if rng.random() < cfg.hint_prob:
      a = answers[int(rng.integers(len(answers)))]
      if self.neighbours[a]:
        w = self.neighbours[a][int(rng.integers(len(self.neighbours[a])))]
        text += " " + HINTS[int(rng.integers(len(HINTS)))].format(w=w)
    return text


@dataclasses.dataclass(frozen=True)
class FramesConfig:
  """The world seen as pixels (`--frames`): each clip also written as a real video file in a dataset's layout and
  converted with data_prep/ovqa_frames.py (its `dataset`, `recipe`, `num_frames`, `frame_size`) instead of the
  features. The CSVs, subtitles and features are the same world's (FrameRenderer draws from its own seed stream)."""

  dataset: str = "msrvtt"       # the file naming and container: msrvtt .mp4, msvd .avi, tgif .gif, activitynet .mp4
  recipe: str = "allinone"      # data_prep/ovqa_frames.py --recipe (frame indices and resize)
  num_frames: int = 3           # the records' T (All-in-one's 3)
  frame_size: int = 32          # the model's S (records hold R = int(1.2 S) for allinone)
  video_size: int = 48          # side of the written video frames (even: yuv420p)
  grid: int = 4                 # a concept is a grid x grid pattern of colour cells
  contrast: float = 40.0        # cell colour = 128 + contrast * (unit pattern * sqrt(cells))
  border: int = 4               # question type: a border of this many pixels in the type's colour
  noise: float = 6.0            # per-pixel Gaussian noise (std, in 0-255 units)
  fps: int = 10


class FrameRenderer:
  """Pixel clips of the world (FramesConfig). A concept c is a grid of colour cells, 128 + contrast * sqrt(cells) *
  unit(P d_c), with d_c the concept's direction of the feature world (unit(M (g_c - g_mean)), so the GloVe word
  vector still determines the pixels and an unseen answer stays predictable from its word) and P a fixed random
  map; a QA segment has a border in its question type's colour (the feature world's type direction), a distractor
  is its concept's pattern at distractor_scale contrast without border, a background frame is grey. A small white
  square moves across every clip (per-frame motion that carries no answer), plus pixel noise.

  The clip's frames are laid out so that the converter's sampled frames (data_prep/ovqa_frames.sample_indices of the
  recipe) show each question's concept: each of the T sampled slots shows one part (every answer one slot at least,
  then the extras, then answers again), and every frame shows the part of its nearest sampled frame."""

  def __init__(self, world: "_World", fc: FramesConfig):
    from data_prep import ovqa_frames  # pylint: disable=g-import-not-at-top
    if fc.recipe not in ovqa_frames.RECIPES or fc.dataset not in ovqa_frames.DATASET_EXTENSIONS:
      raise ValueError(f"FramesConfig: recipe {fc.recipe!r} / dataset {fc.dataset!r}: expected one of "
                       f"{ovqa_frames.RECIPES} / {tuple(ovqa_frames.DATASET_EXTENSIONS)}")
    if world.cfg.max_questions_per_video > fc.num_frames:
      raise ValueError(f"FramesConfig.num_frames = {fc.num_frames} < max_questions_per_video = "
                       f"{world.cfg.max_questions_per_video}: a clip's questions need a sampled frame each")
    if fc.video_size % fc.grid or fc.video_size % 2:
      raise ValueError(f"FramesConfig.video_size = {fc.video_size}: must be even and a multiple of grid = {fc.grid}")
    self.world, self.fc = world, fc
    map_ss, draw_ss = np.random.SeedSequence(world.cfg.seed, spawn_key=(2,)).spawn(2)  # not the features' streams
    map_rng = np.random.default_rng(map_ss)
    self.rng = np.random.default_rng(draw_ss)
    cells = fc.grid * fc.grid * 3
    proj = map_rng.standard_normal((world.cfg.feature_dim, cells)).astype(np.float32)
    self.pattern = {}
    for w in world.concepts:
      v = world.direction[w] @ proj
      self.pattern[w] = (v / np.linalg.norm(v) * np.sqrt(cells)).reshape(fc.grid, fc.grid, 3)
    self.type_colour = map_rng.integers(0, 256, (len(QUESTION_TYPES), 3)).astype(np.float32)
    self.sample_indices = ovqa_frames.sample_indices
    self.extension = ovqa_frames.DATASET_EXTENSIONS[fc.dataset][0]

  def file_name(self, video_id: str) -> str:
    """The video's file under raw/videos/ in the dataset's naming (ActivityNet: v_<id>)."""
    return ("v_" if self.fc.dataset == "activitynet" else "") + video_id + self.extension

  def _image(self, part) -> np.ndarray:
    fc, cfg = self.fc, self.world.cfg
    img = np.full((fc.video_size, fc.video_size, 3), 128.0, np.float32)
    kind, word = part
    if kind == "background":
      return img
    scale = fc.contrast * (cfg.distractor_scale if kind == "distractor" else 1.0)
    cell = fc.video_size // fc.grid
    img += scale * np.repeat(np.repeat(self.pattern[word], cell, axis=0), cell, axis=1)
    if kind == "qa":
      b, colour = fc.border, self.type_colour[self.world.qtype[word]]
      img[:b], img[-b:], img[:, :b], img[:, -b:] = colour, colour, colour, colour
    return img

  def video(self, parts) -> np.ndarray:
    """uint8 [n, video_size, video_size, 3] frames of a clip showing `parts` (`_World.last_parts`)."""
    fc, cfg, rng = self.fc, self.world.cfg, self.rng
    n = int(rng.integers(max(cfg.min_video_frames, fc.num_frames), max(cfg.max_video_frames, fc.num_frames) + 1))
    sampled = np.asarray(self.sample_indices(n, fc.num_frames, fc.recipe))
    num_qa = sum(p[0] == "qa" for p in parts)
    fill = list(parts) + [parts[int(k)] for k in rng.integers(0, num_qa, max(0, fc.num_frames - len(parts)))]
    slot_part = [fill[k] for k in rng.permutation(fc.num_frames)] if len(fill) == fc.num_frames else None
    if slot_part is None:  # more parts than slots: every answer a slot, extras in the rest
      rest = [p for p in parts if p[0] != "qa"][:fc.num_frames - num_qa]
      chosen = [p for p in parts if p[0] == "qa"] + rest
      slot_part = [chosen[k] for k in rng.permutation(len(chosen))]
    images = [self._image(p) for p in slot_part]
    slot_of = np.abs(np.arange(n)[:, None] - sampled[None, :]).argmin(axis=1)
    frames = np.stack([images[j] for j in slot_of])
    size, box = fc.video_size, max(2, fc.video_size // 8)
    start, step = rng.integers(0, size, 2), rng.integers(-3, 4, 2)
    for f in range(n):
      y, x = (start + f * step) % (size - box)
      frames[f, y:y + box, x:x + box] = 255.0
    frames += rng.standard_normal(frames.shape).astype(np.float32) * fc.noise
    return np.clip(np.rint(frames), 0, 255).astype(np.uint8)


def generate_raw(raw_dir: str, cfg: WorldConfig, frames: FramesConfig | None = None) -> dict:
  """Writes the world's release-format files into raw_dir; returns the world description (also world.json). With
  `frames`, also each clip as a video file in raw_dir/videos/ (FrameRenderer)."""
  for name in ("num_train", "num_test"):
    if getattr(cfg, name) < 1:
      raise ValueError(f"WorldConfig.{name} must be >= 1, got {getattr(cfg, name)}")
  if cfg.num_val < 0:
    raise ValueError(f"WorldConfig.num_val must be >= 0, got {cfg.num_val}")
  if not 1 <= cfg.min_video_frames <= cfg.max_video_frames:
    raise ValueError(f"need 1 <= min_video_frames ({cfg.min_video_frames}) <= max_video_frames "
                     f"({cfg.max_video_frames})")
  world = _World(cfg)
  renderer = FrameRenderer(world, frames) if frames else None
  features, subtitles = {}, {}
  next_video, next_id = 0, 0
  os.makedirs(raw_dir, exist_ok=True)
  for split, n, unseen in (("train", cfg.num_train, 0.0), ("val", cfg.num_val, cfg.unseen_fraction),
                           ("test", cfg.num_test, cfg.unseen_fraction)):
    if n == 0:  # only val may be empty: the release then has no val.csv
      if os.path.exists(os.path.join(raw_dir, f"{split}.csv")):
        os.remove(os.path.join(raw_dir, f"{split}.csv"))
      continue
    answers = world.sample_answers(n, unseen)
    rows = []
    for members in world.group_into_videos(answers):
      video_id = f"video{next_video}"
      next_video += 1
      video_answers = [answers[i] for i in members]
      features[video_id] = world.video(video_answers)
      if renderer:
        from data_prep import ovqa_frames  # pylint: disable=g-import-not-at-top
        ovqa_frames.write_video(os.path.join(raw_dir, "videos", renderer.file_name(video_id)),
                                renderer.video(world.last_parts), fps=frames.fps)
      sub = world.subtitle(video_answers)
      if sub is not None:
        subtitles[video_id] = sub
      for a in video_answers:
        rows.append({"question": world.question(a), "answer": a, "video_id": video_id,
                     "type": world.qtype[a], "id": next_id})
        next_id += 1
    with evqa_io.atomic_path(os.path.join(raw_dir, f"{split}.csv")) as tmp:
      pd.DataFrame(rows, columns=["question", "answer", "video_id", "type", "id"]).to_csv(tmp, index=False)
  features_lib.save_feature_dict(os.path.join(raw_dir, "features.npz"), features)
  subtitles_path = os.path.join(raw_dir, "subtitles.json")
  if cfg.subtitles:
    evqa_io.write_json(subtitles_path, subtitles, indent=0)
  elif os.path.exists(subtitles_path):  # left by an earlier run with subtitles
    os.remove(subtitles_path)
  info = {
      "config": dataclasses.asdict(cfg),
      "question_types": list(QUESTION_TYPES),
      "concepts": [{"word": w, "group": world.group[w], "type": world.qtype[w],
                    "rank": i, "heldout": w in set(world.heldout)} for i, w in enumerate(world.concepts)],
      "num_videos": next_video,
  }
  if frames:
    info["frames"] = dataclasses.asdict(frames)
  evqa_io.write_json(os.path.join(raw_dir, "world.json"), info, indent=1)
  return info


def build(out_dir: str, cfg: WorldConfig, verbose: bool = True, frames: FramesConfig | None = None) -> dict:
  """Generates DIR/raw and converts it into DIR/records (from the features, or with `frames` from the video files:
  pixel records); returns {"raw_dir", "records_dir", "table1"}."""
  raw_dir = os.path.join(out_dir, "raw")
  records_dir = os.path.join(out_dir, "records")
  generate_raw(raw_dir, cfg, frames)
  subtitles = os.path.join(raw_dir, "subtitles.json") if cfg.subtitles else None
  if frames:
    from data_prep import ovqa_frames  # pylint: disable=g-import-not-at-top
    ovqa_frames.convert(raw_dir, os.path.join(raw_dir, "videos"), records_dir, dataset=frames.dataset,
                        num_frames=frames.num_frames, frame_size=frames.frame_size, recipe=frames.recipe,
                        subtitles=subtitles, cvqa_topk=cfg.cvqa_topk, verbose=verbose)
  else:
    ovqa.convert(raw_dir, os.path.join(raw_dir, "features.npz"), records_dir, subtitles=subtitles,
                 num_frames=cfg.num_frames, feature_dim=cfg.feature_dim, cvqa_topk=cfg.cvqa_topk, verbose=verbose)
  table = answer_stats.table1_from_dir(records_dir)
  if verbose:
    print(answer_stats.format_table1(table))
  return {"raw_dir": raw_dir, "records_dir": records_dir, "table1": table}


PRESETS = {"default": {}, "small": SMALL, "msrvtt_scale": msrvtt_scale(),
           "neighbours": {"video_direction": "neighbours"}, "frames": {}, "frames_small": SMALL, "frames_violet": {}, "frames_violet_small": SMALL}
# The pixel worlds (the default / small worlds seen as pixels): All-in-one's 3 frames, VIOLET's 5 (its README:
# "5 frames for downstream tasks"), at 32 x 32.
FRAME_PRESETS = {"frames": FramesConfig(), "frames_small": FramesConfig(),
                 "frames_violet": FramesConfig(recipe="violet", num_frames=5),
                 "frames_violet_small": FramesConfig(recipe="violet", num_frames=5)}


def ensure_world(world_dir: str, preset: str = "default", graphs: bool = True, verbose: bool = True) -> str:
  """Builds the world of `preset` ("default", "small" or "msrvtt_scale") in world_dir unless world_dir/records
  already holds one; with `graphs`, also the answer graphs the verbalizer needs (data_prep.answer_graphs, its
  default k and hops). Returns world_dir/records. Safe when several processes call it at once (a file lock serialises them)."""

  if preset not in PRESETS:
    raise ValueError(f"unknown synthetic OVQA preset {preset!r} (choose from {sorted(PRESETS)})")
  records_dir = os.path.join(world_dir, "records")
  os.makedirs(world_dir, exist_ok=True)
  with evqa_io.file_lock(os.path.join(world_dir, ".build.lock")):
    if not os.path.exists(os.path.join(records_dir, ovqa.VOCAB_FILE)):
      if verbose:
        print(f"building the synthetic OVQA world ({preset}) in {world_dir}")
      build(world_dir, WorldConfig(**PRESETS[preset]), verbose=verbose, frames=FRAME_PRESETS.get(preset))
    if graphs and not all(os.path.exists(os.path.join(records_dir, f"graph_{s}.npz")) for s in ("train", "test")):
      from data_prep import answer_graphs  # pylint: disable=g-import-not-at-top
      answer_graphs.main(["--data", records_dir])
  return records_dir


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m data_prep.synthetic_ovqa", description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="output directory (gets raw/ and records/)")
  parser.add_argument("--small", action="store_true", help=f"tiny preset for tests: {SMALL}")
  parser.add_argument("--msrvtt-scale", action="store_true",
                      help="MSRVTT-QA-sized vocabulary: 4,000 train + 1,600 test-only answers (msrvtt_scale())")
  parser.add_argument("--no-subtitles", action="store_true")
  parser.add_argument("--cover-all", action="store_true", help="every seen / held-out concept in train / test")
  parser.add_argument("--frames", action="store_true",
                      help="the world as pixels: video files in raw/videos/ converted by data_prep.ovqa_frames "
                           "(FramesConfig; its fields as --frames-<field>)")
  for field in dataclasses.fields(FramesConfig):
    parser.add_argument("--frames-" + field.name.replace("_", "-"), type=type(getattr(FramesConfig(), field.name)),
                        default=None, help=f"default {getattr(FramesConfig(), field.name)}")
  parser.add_argument("--graphs", action="store_true",
                      help="also build the answer graphs (python -m data_prep.answer_graphs --data DIR/records)")
  defaults = WorldConfig()
  for field in dataclasses.fields(WorldConfig):
    if field.type == "bool":  # the switches above
      continue
    parser.add_argument("--" + field.name.replace("_", "-"), type=type(getattr(defaults, field.name)), default=None,
                        help=f"default {getattr(defaults, field.name)} ({SMALL.get(field.name, '-')} with --small)")
  args = parser.parse_args(argv)
  if args.small and args.msrvtt_scale:
    parser.error("--small and --msrvtt-scale are two presets: give one")
  values = dict(SMALL) if args.small else msrvtt_scale() if args.msrvtt_scale else {}
  for field in dataclasses.fields(WorldConfig):
    given = getattr(args, field.name, None)
    if field.type != "bool" and given is not None:
      values[field.name] = given
  values["subtitles"] = not args.no_subtitles
  values["cover_all"] = args.cover_all or values.get("cover_all", False)
  frames = None
  if args.frames:
    frames = FramesConfig(**{f.name: getattr(args, "frames_" + f.name) for f in dataclasses.fields(FramesConfig)
                             if getattr(args, "frames_" + f.name) is not None})
  result = build(args.out, WorldConfig(**values), frames=frames)
  if args.graphs:
    from data_prep import answer_graphs  # pylint: disable=g-import-not-at-top
    answer_graphs.main(["--data", result["records_dir"]])
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main))
