"""One module per placement's layout behind the :class:`~collective.embedding.layout.ShardLayout` protocol
(``owner``, ``owns``, ``local_row``, ``global_row``, ``rows_held``, ``local_part``, ``stride``). Row-wise and
replicated tables use :class:`~collective.embedding.layout.ShardLayout` itself."""
