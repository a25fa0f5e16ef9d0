"""collective.context: ranks, sizes and options from the environment."""

import pytest

from collective.context import Context, OptionError


def test_defaults_without_a_launcher():
    ctx = Context.from_env({})
    assert (ctx.rank, ctx.world_size, ctx.backend, ctx.kernels) == (0, 1, "hb", "tf")
    assert ctx.device == "/cpu:0" and ctx.is_chief and not ctx.distributed


def test_reads_horovod_variables_and_options():
    env = {"HOROVOD_RANK": "2", "HOROVOD_SIZE": "3", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1",
           "COLLECTIVE_STRATEGY": "SOK", "CUDA_VISIBLE_DEVICES": "5", "COLLECTIVE_REPLICATE_BELOW_BYTES": "4096"}
    ctx = Context.from_env(env)
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_size) == (2, 3, 0, 1)
    assert ctx.backend == "sok" and ctx.device == "/gpu:0" and ctx.replicate_below_bytes == 4096
    assert repr(ctx) == ("Context(rank 2/3, local 0/1, gpu 5, backend=sok, kernels=tf, "
                         "replicate_below_bytes=4096)")


@pytest.mark.parametrize("env, message", [
    ({"COLLECTIVE_STRATEGY": "nccl"}, "COLLECTIVE_STRATEGY='nccl' is not one of hb, sok"),
    ({"COLLECTIVE_KERNELS": "cuda"}, "COLLECTIVE_KERNELS='cuda' is not one of tf, cupy"),
    ({"COLLECTIVE_KERNELS": "cupy"}, "COLLECTIVE_KERNELS='cupy': the exchanges do not run the CuPy kernels yet"),
    ({"HOROVOD_RANK": "x"}, "HOROVOD_RANK='x' is not an integer"),
    ({"HOROVOD_RANK": "3", "HOROVOD_SIZE": "2"}, "rank 3 does not fit world size 2"),
    ({"COLLECTIVE_REPLICATE_BELOW_BYTES": "-1"}, "must be >= 0"),
])
def test_bad_values_name_the_variable(env, message):
    with pytest.raises(OptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Context.from_env(env)
