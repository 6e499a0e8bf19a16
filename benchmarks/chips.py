"""Accelerator data sheets and the roofline of a compile report: what the compile table and the MFU benchmarks add to
XLA's counts (the library's AOT check, evqa_jax/train/aot.py, reports only what the compiler says).

    from chips import peak_flops, roofline
    row.update(roofline(report, peak_flops(report["device_kind"])))
"""

# Peak dense bf16 FLOP/s per device (vendor data sheets, no sparsity), matched by substring of jax's device_kind.
PEAK_FLOPS = [
    ("H200", 989e12), ("H100", 989e12), ("GH200", 989e12), ("B200", 2250e12), ("A100", 312e12), ("A10G", 70e12),
    ("L40S", 362e12), ("L4", 121e12), ("V100", 125e12), ("RTX 4090", 165e12),
    ("TPU v6", 918e12), ("TPU v5p", 459e12), ("TPU v5 lite", 197e12), ("TPU v5e", 197e12), ("TPU v5", 459e12),
    ("TPU v4", 275e12), ("TPU v3", 123e12),
]

# Published per-chip HBM capacity (bytes) and bandwidth (bytes/s) by jax device_kind (Cloud TPU system architecture
# pages). A v4 / v5p chip is one (megacore) device to a job.
CHIP_HBM = {
    "TPU v5 lite": (16 * 2**30, 819e9),   # v5e
    "TPU v6 lite": (32 * 2**30, 1640e9),  # v6e (Trillium)
    "TPU v5": (95 * 2**30, 2765e9),       # v5p
    "TPU v4": (32 * 2**30, 1200e9),
}


def peak_flops(device_kind: str):
  """Peak dense bf16 FLOP/s of one device of `device_kind`, or None for a kind not in PEAK_FLOPS."""
  for key, value in PEAK_FLOPS:
    if key.lower() in device_kind.lower():
      return value
  return None


def roofline(report: dict, peak: float | None) -> dict:
  """Fit and roofline figures of a compile report (per device): HBM of the chip, `fits` (peak estimate <= HBM),
  roofline step time max(FLOPs / peak, bytes accessed / HBM bandwidth) and the MFU ceiling it implies (compute time
  / roofline time: the most a step can reach even with perfect overlap), and examples/s at that step time for the
  report's global batch. FLOPs and bytes are XLA's compiled cost analysis (backward, recomputation and optimiser
  included), so the ceiling bounds MFU from above as XLA counts FLOPs. Unknown chips give only what is known."""
  out = {}
  hbm = CHIP_HBM.get(report.get("device_kind", ""))
  if hbm:
    out["hbm_bytes"], out["hbm_bytes_per_s"] = hbm
    if "peak_estimate_bytes" in report:
      out["fits"] = report["peak_estimate_bytes"] <= hbm[0]
  if peak:
    out["peak_flops_per_s"] = peak
  flops, moved = report.get("flops"), report.get("bytes_accessed")
  # A count XLA did not report is None, not 0: no roofline is computed without it (a missing byte count would
  # otherwise make any step look compute-bound).
  if peak and flops and not (hbm and moved is None):
    compute_s = flops / peak
    memory_s = moved / hbm[1] if hbm else 0.0
    out["roofline_step_s"] = max(compute_s, memory_s)
    out["roofline_bound"] = "compute" if compute_s >= memory_s else "memory"
    out["mfu_ceiling"] = compute_s / out["roofline_step_s"]
    if report.get("model_flops"):  # the step's model FLOPs (no remat recompute) over the same roofline time
      out["mfu_ceiling_model"] = report["model_flops"] / peak / out["roofline_step_s"]
    if report.get("global_batch_size"):
      out["roofline_examples_per_s"] = report["global_batch_size"] / out["roofline_step_s"]
  return out
