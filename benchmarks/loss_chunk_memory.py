"""Peak memory of one micro-batch's loss + backward, with and without model.loss_chunk_tokens.

From the final hidden states (bf16 on CUDA, as autocast leaves them) through the output projection and
the fp32 cross-entropy to the gradients of the hidden states and the head. On CUDA the llama3_8b recipe's
shapes (seq 8192, vocab 128,256, dim 4096) and the allocator's peak above what was allocated before; on
CPU a reduced shape and the peak of live tensor bytes that any op made (a dispatch-level count).
    python benchmarks/loss_chunk_memory.py                       # CPU: seq 2048, vocab 16384, dim 512
    python benchmarks/loss_chunk_memory.py --chunk 1024          # on a GPU: the 8B shapes
"""
from __future__ import annotations

import argparse
import sys
import weakref
from pathlib import Path

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from framework.models.loss import chunked_cross_entropy, cross_entropy  # noqa: E402


class LiveBytesPeak(TorchDispatchMode):
    """The most bytes of op-made tensors alive at once (inputs made before entering are not counted)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.seen = set()

    def _freed(self, key, nbytes):
        self.live -= nbytes
        self.seen.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if id(storage) not in self.seen:
                    self.seen.add(id(storage))
                    self.live += storage.nbytes()
                    weakref.finalize(storage, self._freed, id(storage), storage.nbytes())
        self.peak = max(self.peak, self.live)
        return out


def peak_bytes(seq: int, vocab: int, dim: int, chunk: int, device: torch.device) -> int:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    head = nn.Linear(dim, vocab, bias=False, device=device, dtype=dtype)
    hidden = torch.randn(1, seq, dim, device=device, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, vocab, (1, seq), device=device)

    def run():
        loss = (chunked_cross_entropy(hidden, head, targets, chunk) if chunk
                else cross_entropy(head(hidden), targets))
        loss.backward()

    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    with LiveBytesPeak() as watch:
        run()
    return watch.peak


def main() -> None:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=8192 if cuda else 2048)
    parser.add_argument("--vocab", type=int, default=128256 if cuda else 16384)
    parser.add_argument("--dim", type=int, default=4096 if cuda else 512)
    parser.add_argument("--chunk", type=int, default=1024 if cuda else 256)
    args = parser.parse_args()
    device = torch.device("cuda" if cuda else "cpu")
    whole = peak_bytes(args.seq, args.vocab, args.dim, 0, device)
    chunked = peak_bytes(args.seq, args.vocab, args.dim, args.chunk, device)
    gib = 1 << 30
    print(f"{device.type}: seq {args.seq}, vocab {args.vocab}, dim {args.dim}")
    print(f"  whole logits          peak {whole / gib:.3f} GiB")
    print(f"  chunks of {args.chunk:<6} tokens peak {chunked / gib:.3f} GiB")
    print(f"  ratio whole / chunked {whole / chunked:.1f}x")


if __name__ == "__main__":
    main()
