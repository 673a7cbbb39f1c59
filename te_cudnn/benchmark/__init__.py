"""The benchmark users can read: ``te-cudnn bench`` / ``python -m te_cudnn.benchmark``.

Contenders run side by side in one process on the same inputs: te_cudnn (each sub-backend, and
autotuned where available), the same cuDNN graph built by hand with the frontend, torch SDPA
(cuDNN, flash, efficient) and FlexAttention. Results go to a markdown table, CSV, JSON and a PNG
chart. One concern per module: :mod:`.cases` (what is measured), :mod:`.inputs` (the shared
tensors), :mod:`.contenders` (the interface and the roster) with :mod:`.te_contender`,
:mod:`.handbuilt` and :mod:`.torch_contenders` (who runs it, and why not), :mod:`.measure`
(sampling on the device, with :mod:`te_cudnn.timing`), :mod:`.runner` (the run; with
:mod:`.settings`, :mod:`.environment`, :mod:`.host_section`, :mod:`.prepare` and :mod:`.failures`),
:mod:`.report` (rendering; with :mod:`.rows`, :mod:`.ratios`, :mod:`.csv_json`, :mod:`.markdown`,
:mod:`.targets`, :mod:`.formatting` and :mod:`.chart`), :mod:`.cli` (the command).

Importing this package touches no CUDA and imports none of its modules (``python -m
te_cudnn.benchmark.front_doors`` then runs that module once, as ``__main__``); running needs a
GPU.
"""
