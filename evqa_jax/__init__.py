"""evqa-jax: open-vocabulary, inference and evidence-backed video QA in JAX/Flax."""

import glob as _glob
import os as _os

__version__ = "0.1.0"

# Third-party settings read when those libraries load, so set before any of them is imported (every entry point
# imports this package first); each is a default the user's environment overrides. They answer the questions those
# libraries would otherwise ask noisily, and hide no error:
# - transformers' advisory notes ("PyTorch was not found": only tokenizers and configs are used from it here);
# - gcsfs's probe for zonal / hierarchical buckets, which asks for default credentials on every new bucket and logs a
#   warning when there are none (an emulator, anonymous reads); the plain Cloud Storage API serves every bucket;
# - libtpu on a host without TPU chips (no /dev/accel*, /dev/vfio/<n>: AOT compiles for a topology, or a load by a
#   library): one local worker, no metadata server to ask, a v5e host's accelerator type for its host bounds, instead
#   of a guess that logs INVALID_ARGUMENT errors. The topology compiled for is the one passed, whatever these say.
_DEFAULTS = {"TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
if not _glob.glob("/dev/accel*") and not _glob.glob("/dev/vfio/[0-9]*"):
  _DEFAULTS.update(TPU_SKIP_MDS_QUERY="1", TPU_WORKER_HOSTNAMES="localhost", TPU_WORKER_ID="0",
                   TPU_ACCELERATOR_TYPE="v5litepod-4")
for _key, _value in _DEFAULTS.items():
  _os.environ.setdefault(_key, _value)
