"""What a TensorFlow graph holds, for tests that bound what a library call adds to it."""

from typing import List

import tensorflow as tf

LOOP_OPS = ("While", "StatelessWhile")


def while_loops(graph: tf.Graph) -> List[str]:
    """Names of the loops in ``graph``: its own ``While`` ops and those inside the functions it calls."""
    loops = [node.name for f in graph.as_graph_def().library.function for node in f.node_def if node.op in LOOP_OPS]
    return loops + [op.name for op in graph.get_operations() if op.type in LOOP_OPS]
