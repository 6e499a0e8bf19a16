"""Record format and input pipelines.

  example   Feature specs; tf.train.Example encode/decode (no TensorFlow needed)
  tfrecord  TFRecord framing, .idx offsets, CRC-checked reads, CorruptRecordError
  records   dataset directories: write_split, metadata.json, split_paths
  source    TFRecordDataSource, a Grain random-access source
  frames    pixel frames as JPEG files in a record (encode_jpeg / decode_jpeg)
  pipeline  make_train_loader / make_eval_batches, padding helpers, Orbax args for the iterator

Submodules are imported on demand (`from evqa_jax.data import records`), so writing records does not
load Grain or JAX.
"""
