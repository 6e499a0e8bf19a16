

def test_decode_positions_are_the_full_logits_at_those_positions():
  cfg = bert.BertConfig.from_dict(dict(violin_config.TINY_BERT) if hasattr(violin_config, "TINY_BERT") else
                                  dict(violin_config.get_config("small").pretrained.shape), vocab_size=50)
  ids = jax.random.randint(jax.random.key(1), (2, 7), 1, 50)
  mask = np.array([[1] * 7, [1] * 5 + [0] * 2], np.int32)
  pos = np.array([[0, 6, 3], [4, 1, 1]], np.int32)
  model = bert.BertLM(cfg)
  params = model.init(jax.random.key(0), ids, mask)["params"]
  full = model.apply({"params": params}, ids, mask, decode=True)["logits"]
  picked = model.apply({"params": params}, ids, mask, decode_positions=pos)["logits"]
  np.testing.assert_allclose(np.asarray(picked), np.take_along_axis(np.asarray(full), pos[..., None], 1), atol=1e-6)
