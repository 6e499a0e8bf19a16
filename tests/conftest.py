"""Test-wide set-up: 8 simulated CPU devices so sharding tests run on one host."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite runs on CPU even where libtpu is installed (`.[tpu]`, for AOT compiles to TPU topologies): JAX then
# neither probes for TPU chips nor takes libtpu's host-wide lock at start-up.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
