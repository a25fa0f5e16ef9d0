"""GPU pinning by local rank (collective.runtime.devices), whatever started the workers.

Each case sets the variables one launcher sets and passes the GPUs the process would see as an
argument: no GPU is needed, none is faked.
"""

import pytest

from collective import context
from collective.runtime import devices
from collective.context import Context

FOUR = ["0", "1", "2", "3"]


def _pinned(env, gpus=None):
    where = devices.placement(env, gpus=gpus)
    return where.local.source, where.gpu, where.visible_device_list, where.device


@pytest.mark.parametrize("name, env, gpus, expected", [
    # Our launcher gives each worker its own GPU in CUDA_VISIBLE_DEVICES: the only one it sees.
    ("launcher", {"COLLECTIVE_LOCAL_RANK": "1", "COLLECTIVE_LOCAL_SIZE": "2", "HOROVOD_LOCAL_RANK": "1",
                  "HOROVOD_LOCAL_SIZE": "2", "CUDA_VISIBLE_DEVICES": "5"}, None,
     ("COLLECTIVE_LOCAL_RANK", "5", "0", "/gpu:0")),
    # horovodrun leaves every GPU visible: the Horovod step, visible_device_list = local rank.
    ("horovodrun", {"HOROVOD_LOCAL_RANK": "2", "HOROVOD_LOCAL_SIZE": "4"}, FOUR,
     ("HOROVOD_LOCAL_RANK", "2", "2", "/gpu:0")),
    ("horovodrun, CUDA_VISIBLE_DEVICES", {"HOROVOD_LOCAL_RANK": "2", "HOROVOD_LOCAL_SIZE": "4",
                                          "CUDA_VISIBLE_DEVICES": "4,5,6,7"}, None,
     ("HOROVOD_LOCAL_RANK", "6", "2", "/gpu:0")),
    ("mpirun (Open MPI)", {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, FOUR,
     ("OMPI_COMM_WORLD_LOCAL_RANK", "1", "1", "/gpu:0")),
    ("mpirun (MPICH, Intel MPI)", {"MPI_LOCALRANKID": "3", "MPI_LOCALNRANKS": "4"}, FOUR,
     ("MPI_LOCALRANKID", "3", "3", "/gpu:0")),
    ("PMI", {"PMI_LOCAL_RANK": "0", "PMI_LOCAL_SIZE": "2"}, FOUR, ("PMI_LOCAL_RANK", "0", "0", "/gpu:0")),
    # srun: this node's task count is its entry in SLURM_STEP_TASKS_PER_NODE ("2(x2),1" is 2,2,1).
    ("srun", {"SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x2),1", "SLURM_NODEID": "1"}, FOUR,
     ("SLURM_LOCALID", "1", "1", "/gpu:0")),
    # mpirun inside a Slurm allocation keeps the batch step's SLURM_LOCALID (0 on every rank).
    ("mpirun under Slurm", {"OMPI_COMM_WORLD_LOCAL_RANK": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
                            "SLURM_LOCALID": "0"}, FOUR, ("OMPI_COMM_WORLD_LOCAL_RANK", "3", "3", "/gpu:0")),
    ("CPU workers", {"HOROVOD_LOCAL_RANK": "3", "HOROVOD_LOCAL_SIZE": "8", "CUDA_VISIBLE_DEVICES": ""}, None,
     ("HOROVOD_LOCAL_RANK", None, None, "/cpu:0")),
    ("CUDA_VISIBLE_DEVICES=-1", {"HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "2",
                                 "CUDA_VISIBLE_DEVICES": "-1"}, None, ("HOROVOD_LOCAL_RANK", None, None, "/cpu:0")),
    ("no launcher", {}, ["0", "1"], (devices.ASSUMED_ONE_HOST, "0", "0", "/gpu:0")),
])
def test_each_launcher_pins_its_worker_to_the_gpu_of_its_local_rank(name, env, gpus, expected):
    assert _pinned(env, gpus) == expected, name


def test_horovod_once_initialised_wins_over_the_environment():
    local = devices.local_rank({"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "1"}, horovod=(1, 2))
    assert (local.rank, local.size, local.source) == (1, 2, devices.HOROVOD)
    assert devices.place(local, FOUR).visible_device_list == "1"


def test_more_workers_than_gpus_on_a_host_is_refused_naming_both_counts():
    env = {"HOROVOD_RANK": "5", "HOROVOD_SIZE": "8", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "4",
           "CUDA_VISIBLE_DEVICES": "0,1"}
    with pytest.raises(devices.TooManyWorkersError) as err:
        devices.placement(env)
    message = str(err.value)
    assert "asks for 4 workers but CUDA_VISIBLE_DEVICES lists 2 GPU(s) (0,1)" in message, message
    assert "local size from HOROVOD_LOCAL_RANK" in message
    assert "start at most 2 workers per host (-np 2 on one host, HOST:2 in -H)" in message
    assert "or set CUDA_VISIBLE_DEVICES= (empty) to run 4 workers on CPU" in message
    # The worker refuses as soon as it reads its context, before building anything.
    with pytest.raises(devices.TooManyWorkersError, match="asks for 4 workers"):
        Context.from_env(env)
    with pytest.raises(devices.TooManyWorkersError, match="nvidia-smi lists 3 GPU"):
        devices.place(devices.LocalRank(0, 4, "OMPI_COMM_WORLD_LOCAL_RANK"), ["0", "1", "2"], "nvidia-smi")
    # As many workers as GPUs, or CPU workers, are fine.
    assert devices.placement(dict(env, HOROVOD_LOCAL_SIZE="2")).gpu == "1"
    assert devices.placement(dict(env, CUDA_VISIBLE_DEVICES="")).device == "/cpu:0"


@pytest.mark.parametrize("env, message", [
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "x"}, "OMPI_COMM_WORLD_LOCAL_RANK='x' is not an integer"),
    ({"HOROVOD_LOCAL_RANK": "2", "HOROVOD_LOCAL_SIZE": "2"}, "HOROVOD_LOCAL_RANK=2 does not fit a local size of 2"),
])
def test_bad_local_rank_names_the_variable(env, message):
    with pytest.raises(context.OptionError, match=message):
        Context.from_env(env, gpus=[])


def test_session_config_copies_the_base_and_sets_the_visible_device_list():
    import tensorflow as tf

    where = devices.placement({"HOROVOD_LOCAL_RANK": "3", "HOROVOD_LOCAL_SIZE": "4"}, gpus=FOUR)
    base = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=3)
    config = devices.session_config(base, where)
    assert config.gpu_options.visible_device_list == "3" and config.intra_op_parallelism_threads == 3
    assert base.gpu_options.visible_device_list == ""  # the user's config is left alone
    assert devices.session_config(None, where).allow_soft_placement
    cpu = devices.placement({"HOROVOD_LOCAL_RANK": "3", "HOROVOD_LOCAL_SIZE": "4", "CUDA_VISIBLE_DEVICES": ""})
    assert devices.session_config(base, cpu).gpu_options.visible_device_list == ""
    base.gpu_options.visible_device_list = "0"
    with pytest.raises(ValueError, match="visible_device_list='0' but this worker's GPU is '3'"):
        devices.session_config(base, where)


@pytest.fixture
def horovodrun_rank_2_of_4():
    """This process as local rank 2 of 4 started by horovodrun on a host with four visible GPUs."""
    env = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1", "HOROVOD_LOCAL_RANK": "2", "HOROVOD_LOCAL_SIZE": "4"}
    context.set(Context.from_env(env, gpus=FOUR))
    yield
    context.reset()


def test_the_library_sessions_and_device_setter_use_the_pinned_gpu(horovodrun_rank_2_of_4, tmp_path):
    import tensorflow as tf

    import collective.hb as hb
    from collective import CollectiveStrategy
    from collective.integration.estimator import build_estimator

    strategy = CollectiveStrategy()
    assert strategy.session_config().gpu_options.visible_device_list == "2"
    assert strategy.device() == hb.train.device_setter() == "/gpu:0"
    assert hb.context.devices == ["/gpu:0"] and context.get().gpu == "2"

    def model_fn(features, labels, mode, params):
        raise AssertionError("not called")

    estimator = build_estimator(strategy, model_fn, str(tmp_path))
    session_config = estimator.config.session_config
    assert session_config.gpu_options.visible_device_list == "2"
    assert session_config.graph_options.rewrite_options.meta_optimizer_iterations == 1  # Estimator's default kept
    given = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)
    config = tf.estimator.RunConfig(session_config=given)
    pinned = build_estimator(strategy, model_fn, str(tmp_path), config=config).config.session_config
    assert pinned.gpu_options.visible_device_list == "2" and pinned.inter_op_parallelism_threads == 2
    from modelzoo.engine import SessionEngine

    for engine_strategy in (strategy, None):  # the model zoo's session engine, and its plain baseline
        engine = SessionEngine(engine_strategy, model_fn, str(tmp_path), {})
        assert engine._session_config().gpu_options.visible_device_list == "2"  # pylint: disable=protected-access


def test_horovods_local_rank_replaces_an_assumed_one():
    from collective import comm

    context.set(Context.from_env({"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4"}, gpus=FOUR))  # no local-rank variable
    try:
        assert (context.get().local_rank, context.get().gpu) == (3, "3")
        comm._pin_gpu(devices.LocalRank(1, 2, devices.HOROVOD))  # pylint: disable=protected-access
        ctx = context.get()
        assert (ctx.local_rank, ctx.local_size, ctx.local_source, ctx.gpu) == (1, 2, devices.HOROVOD, "1")
    finally:
        context.reset()
