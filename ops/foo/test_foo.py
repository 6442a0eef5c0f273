"""foo: x + y, float32, same shapes (the minimal ONNX Runtime custom op)."""

from opbridge.testing import BadInput, OpCase, Sample, op_test_suite, random_tensor as r


def resize(sample: Sample, n: int) -> Sample:
    return Sample((r([n, 3], seed=n), r([n, 3], seed=n + 1)))


TestFoo = op_test_suite(
    OpCase(
        "foo",
        reference=lambda x, y: x + y,
        samples=[
            Sample((r([5, 3]), r([5, 3], seed=1)), name="float32", dynamic={0: [0], 1: [0]}),
            Sample((r([0, 3]), r([0, 3], seed=1)), name="empty"),
            Sample((r([1]), r([1], seed=1)), name="one_element"),
        ],
        bad_inputs=[
            BadInput((r([2, 3], "float64"), r([2, 3], "float64")), {}, "input 'x' has dtype float64; expected float32", "wrong_dtype"),
            BadInput((r([2, 3]), r([3])), {}, "must have the same shape", "mismatched_shapes"),
        ],
        resize=resize,
    )
)
