"""The models the stages train: docs/benchmarks/h100.md's shapes on a GPU, a tiny Llama in a --dry-run.
Each stage adds the precision it measures."""

# "b1": the 870M Llama of the H100 rows (dim 2048, 16 layers, 16 heads, 8 KV heads, vocab 32000)
B1 = ["model=llama_125m", "model.dim=2048", "model.n_layers=16", "model.n_heads=16", "model.n_kv_heads=8",
      "model.vocab_size=32000", "data.vocab_size=32000", "data.seq_len=2048"]
# "b3": the 2.9B one (dim 3072, 26 layers, 24 heads)
B3 = [*B1, "model.dim=3072", "model.n_layers=26", "model.n_heads=24"]
# a few thousand parameters: what --dry-run trains on a CPU in place of either
TINY = ["model=tiny", "data.seq_len=32"]
# what every job of a stage adds: synthetic tokens, no evaluation, bar, TensorBoard or launch-time plan
QUIET = ["data=synthetic", "trainer.eval_every=0", "trainer.progress_bar=false", "logging.trackers=[]",
         "planner.check=false"]
