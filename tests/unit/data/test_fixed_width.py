"""Rows of one example each (data.packing=false) padded to one width under trainer.compile
(framework/data/batches.py micro_batches, StepBatches.width): the padding trains nothing and no real token sees it,
so a micro-batch gives the losses and targets of the same examples cut to their longest."""
import numpy as np
import torch

from framework.data.batches import micro_batches
from framework.data.rows import padded
from framework.models.llama import Llama, init_weights
from framework.models.loss import IGNORE_INDEX

EXAMPLES = [(np.arange(3, 14), np.r_[np.zeros(4), np.ones(7)]), (np.arange(20, 26), np.r_[np.zeros(2), np.ones(4)]),
            (np.arange(40, 49), np.r_[np.zeros(6), np.ones(3)]), (np.arange(50, 54), np.ones(4))]


def test_a_fixed_width_pads_each_micro_batch_and_changes_no_loss():
    rows = padded([(ids, mask.astype(np.int64)) for ids, mask in EXAMPLES])
    longest, fixed = micro_batches(rows, 2), micro_batches(rows, 2, width=17)
    assert [b[0].shape[1] for b in longest] == [10, 8] and all(b[0].shape == (2, 16) for b in fixed)
    model = Llama(dim=32, n_layers=2, n_heads=4, vocab_size=64, max_seq_len=32)
    init_weights(model, seed=0)
    model = model.double()
    for (inputs, targets), (wide_inputs, wide_targets) in zip(longest, fixed):
        width = inputs.shape[1]
        assert torch.equal(wide_inputs[:, :width], inputs) and torch.equal(wide_targets[:, :width], targets)
        assert (wide_targets[:, width:] == IGNORE_INDEX).all()
        loss = torch.nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten(),
                                                 ignore_index=IGNORE_INDEX)
        wide = torch.nn.functional.cross_entropy(model(wide_inputs).flatten(0, 1), wide_targets.flatten(),
                                                 ignore_index=IGNORE_INDEX)
        assert torch.allclose(loss, wide, rtol=1e-6, atol=0)    # float32 rope tables: rounding alone
