"""The GPU session: the measurements that need a GPU, as stages of at most four minutes each.

`bash benchmarks/gpu_session.sh --seconds N --out DIR STAGE ...` runs them (session.py); `--dry-run` runs
every stage's code on this machine's CPU at tiny sizes. docs/benchmarks/gpu-session.md says how to call it
on the GPU machine and where each stage's table is recorded.
"""
