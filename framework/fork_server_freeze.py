"""Imported by the workers' fork server after everything else it preloads (launchers.torch.start_fork_server):
what the server imported - torch, the trainer, the strategy's modules, objects that live as long as the process -
leaves the garbage collector's sight (gc.freeze). A worker forked from the server then collects only what it
made itself: the gc.collect of its teardown scanned every imported object (~0.17 s of CPU a worker, on a tiny
model more than its training steps), and so did each automatic full collection; the frozen objects' pages also
stay shared with the server instead of being copied when the collector touches them."""
import gc

gc.freeze()
