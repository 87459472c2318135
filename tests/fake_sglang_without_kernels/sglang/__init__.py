"""SGLang 0.5.23 as a host without its kernels has it: installed (sglang-0.5.23.dist-info beside this folder holds
the real 0.5.23's metadata fields, its pin on sglang-kernel among them), but `sgl_kernel` missing, which the model
runner's imports meet (benchmark/one_batch.py)."""
