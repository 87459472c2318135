"""The reference EAGLE-3 draft trainer: `python -m backends.train --data DIR --target DIR --out DIR`.

Modules, one concept each: `options` (the CLI's fields), `target` (the
target's config and frozen matrices, read without instantiating it), `config`
(the draft config and its checks against the data), `rope`, `attention` and
`model` (the draft), `vocab` (d2t/t2d), `data` (shards, split, batches),
`loss` (training-time-test loss and accuracy), `schedule`, `checkpoint` (SGLang
layout + training state), `distributed` (torchrun, DDP/FSDP), `trainer` (one
step, evaluation, save/restore), `metrics`, `loop` (the run), `errors`.
"""
