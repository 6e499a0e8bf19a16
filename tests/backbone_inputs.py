"""What an OVQA Backbone.build_model reads of the Input, for the pixel backbones' tests (test_allinone, test_violet)."""


class StubInput:
  """The tokenizer of config.pretrained, the train answers, no answer graph."""

  def __init__(self, config, answers):
    from evqa_jax import pretrained  # pylint: disable=g-import-not-at-top
    self.tokenizer = pretrained.load_tokenizer(config.pretrained)
    self.answers_train = answers
    self.use_graph = False

  def verbalizer_call(self):
    return None
