"""batch_pointers (ball_query's family): a batch vector's row pointers against numpy.searchsorted,
and the batch-vector rule (numbered from 0, sorted) refused in eager PyTorch and in ONNX Runtime by
the one check radius and segment_coo run too."""

import re

import numpy as np
import pytest
import torch

import opbridge
from opbridge.testing import BadInput, OpCase, OpTest, Sample, node_model

batch_pointers = torch.ops.opbridge.batch_pointers


def reference(batch, bounds, name="batch", caller=""):
    return np.searchsorted(batch, bounds, side="left").astype(np.int64)


def sizes(*counts, dtype=torch.int64):
    return torch.cat([torch.full((n,), i, dtype=dtype) for i, n in enumerate(counts)])


class TestBatchPointers(OpTest):
    case = OpCase(
        "batch_pointers",
        reference=reference,
        samples=[
            Sample((sizes(3, 0, 5, 1), torch.arange(5)), {}, name="with_an_empty_example"),
            Sample((sizes(4, 4, dtype=torch.int32), torch.arange(3)), {}, name="int32"),
            Sample((sizes(2, 3), torch.arange(6)), {"name": "batch_x"}, name="bounds_past_the_last_example"),
            Sample((torch.zeros(0, dtype=torch.int64), torch.arange(2)), {}, name="no_rows"),
            Sample((sizes(0, 0, 7), torch.arange(4)), {}, name="leading_empty_examples"),
        ],
        bad_inputs=[
            BadInput((torch.tensor([0, 1, 0, 1]), torch.arange(3)), {"name": "batch_x"},
                     r"batch_x must be sorted, but batch_x\[1\] = 1 > batch_x\[2\] = 0", "unsorted"),
            BadInput((torch.tensor([-1, -1, 0, 0]), torch.arange(2)), {},
                     r"batch\[0\] = -1 is negative", "negative"),
            BadInput((torch.tensor([0, 2, 1]), torch.arange(4)), {"name": "batch_y", "caller": "torch_cluster.knn"},
                     r"torch_cluster\.knn: batch_y must be sorted", "names_the_caller"),
            BadInput((torch.tensor([0.0, 1.0]), torch.arange(3)), {}, "input 'batch' has dtype float32", "float_batch"),
        ],
    )


@pytest.mark.parametrize("batch, match", [
    ([0, 1, 0, 1, 0, 1, 0, 1], r"batch_x must be sorted, but batch_x\[1\] = 1 > batch_x\[2\] = 0"),
    ([-1, -1, -1, -1, 0, 0, 0, 0], r"batch_x\[0\] = -1 is negative"),
])
def test_onnxruntime_refuses_what_eager_refuses(batch, match):
    info = opbridge.builtin.op("batch_pointers")
    arrays = [np.array(batch, np.int64), np.arange(3, dtype=np.int64)]
    attrs = {"name": "batch_x", "caller": "torch_cluster.knn"}
    sess = opbridge.session(node_model(info, arrays, attrs))
    with pytest.raises(Exception, match=re.escape("opbridge::batch_pointers") + r".*torch_cluster\.knn: " + match):
        sess.run(None, {"batch": arrays[0], "bounds": arrays[1]})
    with pytest.raises(RuntimeError, match=r"opbridge::batch_pointers: torch_cluster\.knn: " + match):
        batch_pointers(torch.tensor(batch), torch.arange(3), **attrs)
    good = np.sort(np.abs(arrays[0]))  # the same vector, made to keep the rule: the node runs
    np.testing.assert_array_equal(sess.run(None, {"batch": good, "bounds": arrays[1]})[0],
                                  reference(good, arrays[1]))
